"""
A small GPT (decoder-only transformer) with a choice of position encoding:
learned (GPT-2), sinusoidal (Vaswani et al.), rope (Su et al.) or none (NoPE).
nanoGPT's model, plus RoPE scaling at inference and a KV cache for generation.
"""
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
from torch.nn import functional as F

from rope import LAYOUTS, apply_rope, check_scaling, rope_cos_sin, rope_frequencies

POS_EMBS = ("learned", "sinusoidal", "rope", "none")


@dataclass
class GPTConfig:
    block_size: int = 256  # training context length (and the size of a learned position table)
    vocab_size: int = 50257
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    pos_emb: str = "rope"
    rope_base: float = 10000.0
    rope_layout: str = "half"
    rope_scaling: dict | None = None  # Hugging Face style, e.g. {"rope_type": "yarn", "factor": 4.0}

    def __post_init__(self):
        if self.pos_emb not in POS_EMBS:
            raise ValueError(f"unknown pos_emb {self.pos_emb!r}; allowed: {', '.join(POS_EMBS)}")
        if self.rope_layout not in LAYOUTS:
            raise ValueError(f"unknown rope_layout {self.rope_layout!r}; allowed: {', '.join(LAYOUTS)}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}")
        if self.pos_emb == "rope" and (self.n_embd // self.n_head) % 2:
            raise ValueError(f"RoPE needs an even head dimension, got n_embd/n_head = {self.n_embd // self.n_head}")
        check_scaling(self.full_rope_scaling())

    def full_rope_scaling(self):
        # like transformers, the original length defaults to the model's own context length
        return self.rope_scaling and {"original_max_position_embeddings": self.block_size, **self.rope_scaling}


class KVCache:
    """Per-layer keys and values of the tokens seen so far. Keys are kept *before* rotation, so
    every step re-rotates them with the frequencies for the current length: exact for dynamic NTK."""

    def __init__(self, n_layer):
        self.kv = [None] * n_layer
        self.length = 0  # tokens already in the cache

    def update(self, layer, k, v):
        if self.kv[layer] is not None:
            k = torch.cat((self.kv[layer][0], k), dim=2)
            v = torch.cat((self.kv[layer][1], v), dim=2)
        self.kv[layer] = (k, v)
        return k, v


def sinusoidal_embedding(positions, dim):
    # PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(p / 10000^(2i/d))
    angles = positions.float()[:, None] * torch.exp(torch.arange(0, dim, 2, device=positions.device) * (-math.log(10000.0) / dim))
    return torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)


def causal_dynamic_attention(q, k, v, inv_freq, attention_factor, layout):
    """Exact causal dynamic scaling: query t and every key it sees are rotated with inv_freq[t] (the
    frequencies for length t+1). Done in chunks of queries so the re-rotated keys stay small."""
    B, H, T, D = q.shape
    pos = torch.arange(T, device=q.device)
    chunk = max(1, (1 << 22) // (B * H * T * D))  # ~16 MB of re-rotated keys: larger chunks measured slower on a CPU
    out = []
    # last chunk first: the re-rotated keys then shrink from chunk to chunk, so the allocator reuses
    # the freed memory (growing sizes fragmented glibc's heap to 6.8 GB at T = 4096, 1.3 GB at 2048)
    for s in reversed(range(0, T, chunk)):
        e = min(s + chunk, T)
        cos, sin = rope_cos_sin(inv_freq[s:e], pos[:e], attention_factor)  # (C, e, D/2): a table per query
        keys = apply_rope(k[:, :, None, :e], cos, sin, layout)  # (B, H, C, e, D)
        own = (torch.arange(e - s, device=q.device), pos[s:e])  # each query's own position in its table
        query = apply_rope(q[:, :, s:e], cos[own], sin[own], layout)  # (B, H, C, D)
        att = torch.einsum("bhcd,bhced->bhce", query, keys) / math.sqrt(D)
        att = att.masked_fill(pos[:e][None, :] > pos[s:e][:, None], float("-inf")).softmax(dim=-1)
        out.append(att.to(v.dtype) @ v[:, :, :e])
    return torch.cat(out[::-1], dim=2)


class CausalSelfAttention(nn.Module):

    def __init__(self, config, layer):
        super().__init__()
        self.layer, self.n_head, self.dropout = layer, config.n_head, config.dropout
        self.layout = config.rope_layout
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=False)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=False)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x, rope, cache):
        B, T, C = x.size()
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in self.c_attn(x).split(C, dim=2))
        if cache is not None:
            k, v = cache.update(self.layer, k, v)
        Tk = k.size(2)
        if isinstance(rope, dict):  # exact causal dynamic: frequencies per query
            y = causal_dynamic_attention(q, k, v, rope["inv_freq"], rope["attention_factor"], self.layout)
        else:
            if rope is not None:
                cos, sin = rope
                q = apply_rope(q, cos[Tk - T:Tk], sin[Tk - T:Tk], self.layout)
                k = apply_rope(k, cos[:Tk], sin[:Tk], self.layout)
            # with a cache the T new queries sit at the end of the Tk keys
            mask = None if T == Tk or T == 1 else torch.ones(T, Tk, dtype=torch.bool, device=x.device).tril(Tk - T)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=T == Tk and T > 1,
                                               dropout_p=self.dropout if self.training else 0.0)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=False)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=False)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x))))


class Block(nn.Module):

    def __init__(self, config, layer):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=False)
        self.attn = CausalSelfAttention(config, layer)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=False)
        self.mlp = MLP(config)

    def forward(self, x, rope, cache):
        x = x + self.attn(self.ln_1(x), rope, cache)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config, i) for i in range(config.n_layer)]),
            ln_f=nn.LayerNorm(config.n_embd, bias=False),
        ))
        if config.pos_emb == "learned":
            self.transformer.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        # GPT-2 init: N(0, 0.02), residual projections scaled by 1/sqrt(2 * n_layer)
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self):
        return sum(p.numel() for p in self.parameters())

    def rope_tables(self, seq_len, device, causal_dynamic=False):
        """cos/sin for positions [0, seq_len) under config.rope_scaling (computed once per forward, shared
        by all layers). causal_dynamic: instead, (inv_freq for each length t+1, attention factor)."""
        cfg = self.config
        scaling = cfg.full_rope_scaling()
        head_dim = cfg.n_embd // cfg.n_head
        if causal_dynamic:
            freqs = [rope_frequencies(head_dim, cfg.rope_base, scaling, seq_len=t + 1) for t in range(seq_len)]
            return {"inv_freq": torch.stack([f for f, _ in freqs]).to(device), "attention_factor": freqs[-1][1]}
        inv_freq, attention_factor = rope_frequencies(head_dim, cfg.rope_base, scaling, seq_len=seq_len)
        return rope_cos_sin(inv_freq.to(device), torch.arange(seq_len, device=device), attention_factor)

    def forward(self, idx, targets=None, cache=None, causal_dynamic=False):
        """idx [B, T] -> logits [B, T, vocab] (and the mean loss if targets are given).
        cache: a KVCache, continued in place. causal_dynamic: exact per-position dynamic RoPE scaling."""
        B, T = idx.size()
        if causal_dynamic and cache is not None:
            raise ValueError("causal_dynamic is for a full forward; a KV cache is already causal")
        start = cache.length if cache is not None else 0
        positions = torch.arange(start, start + T, device=idx.device)
        x = self.transformer.wte(idx)
        if self.config.pos_emb == "sinusoidal":
            # Vaswani et al. scale token embeddings by sqrt(d): the unit-amplitude table would otherwise
            # drown GPT-2-initialised (std 0.02) embeddings
            x = x * math.sqrt(self.config.n_embd) + sinusoidal_embedding(positions, self.config.n_embd).to(x.dtype)
        elif self.config.pos_emb == "learned":
            if start + T > self.config.block_size:
                raise ValueError(f"learned position table has {self.config.block_size} entries; "
                                 f"cannot encode position {start + T - 1} (a learned model cannot extrapolate)")
            x = x + self.transformer.wpe(positions)
        rope = self.rope_tables(start + T, idx.device, causal_dynamic) if self.config.pos_emb == "rope" else None
        x = self.transformer.drop(x)
        for block in self.transformer.h:
            x = block(x, rope, cache)
        if cache is not None:
            cache.length += T
        logits = self.lm_head(self.transformer.ln_f(x))
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        # decay matrices (and embeddings), not norms: as nanoGPT
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=device_type == "cuda")

    def flops_per_token(self, seq_len):
        # PaLM appendix B: 6N for the matmuls plus 12 * L * d * T for attention, forward + backward
        cfg = self.config
        return 6 * self.num_params() + 12 * cfg.n_layer * cfg.n_embd * seq_len

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None):
        """Sample max_new_tokens after idx [B, T] with a KV cache (no cropping: past block_size the
        position encoding extrapolates, which is the point of this project)."""
        cache = KVCache(self.config.n_layer)
        logits, _ = self(idx, cache=cache)
        for _ in range(max_new_tokens):
            logits = logits[:, -1, :] / max(temperature, 1e-8)
            if top_k is not None:
                v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits[logits < v[:, [-1]]] = -float("inf")
            idx_next = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)
            idx = torch.cat((idx, idx_next), dim=1)
            logits, _ = self(idx_next, cache=cache)
        return idx


CHECKPOINT_KEYS = ("model", "model_args", "iter_num", "config")


def load_checkpoint(path, device="cpu"):
    """Read a ckpt.pt written by train.py. Missing, unreadable or incomplete: a one-line ValueError."""
    path = Path(path)
    if path.is_dir():
        path = path / "ckpt.pt"
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint at {path}; train one first: python train.py configs/rope_small.py")
    try:
        ckpt = torch.load(path, map_location=device, weights_only=True)
    except Exception as e:  # torch raises many kinds for a truncated or foreign file
        raise ValueError(f"checkpoint {path} is corrupted or not a ropelab checkpoint ({type(e).__name__}: {e})") from None
    missing = [k for k in CHECKPOINT_KEYS if not isinstance(ckpt, dict) or k not in ckpt]
    if missing:
        raise ValueError(f"checkpoint {path} is not a ropelab checkpoint: missing {', '.join(missing)}")
    return ckpt


def model_from_checkpoint(ckpt):
    model = GPT(GPTConfig(**ckpt["model_args"]))
    try:
        model.load_state_dict(ckpt["model"])
    except RuntimeError as e:
        raise ValueError(f"checkpoint weights do not match its model config: {str(e).splitlines()[0]}") from None
    return model
