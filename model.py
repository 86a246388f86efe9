"""nanoGPT's model with a choice of position encoding: learned (GPT-2), sinusoidal (Vaswani et al.), rope
(Su et al.; p-RoPE, Barbero et al. 2024; iRoPE / RNoPE-SWA's NoPE and local RoPE layers), alibi (Press et
al. 2022) or none (NoPE); any of them with Scalable-Softmax (Nakanishi 2025). Positions: positions.py."""
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F

from positions import AS_TRAINED, Attend, forward_positions, sinusoidal_embedding

POS_EMBS = ("learned", "sinusoidal", "rope", "alibi", "none")
NORMS = ("layernorm", "rmsnorm")
MLPS = ("gelu", "swiglu")


@dataclass
class GPTConfig:  # each field's meaning: config.py's KEYS (train.py --help)
    block_size: int = 256  # the training length
    vocab_size: int = 50257
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    pos_emb: str = "rope"
    rope_base: float = 10000.0
    rope_layout: str = "half"
    rope_scaling: dict | None = None
    rope_fraction: float | None = None
    nope_every: int | None = None
    rope_window: int | None = None
    ssmax: bool = False
    train_len: int | None = None  # the length methods scale from: block_size, or a fine-tune's origin's
    # a pretrained model's architecture (pretrained.py: GPT-NeoX, Llama, Qwen2, Mistral); defaults: this GPT
    norm: str = "layernorm"
    norm_eps: float = 1e-5
    biases: bool = False
    qkv_bias: bool = False
    mlp: str = "gelu"
    mlp_hidden: int | None = None
    n_kv_head: int | None = None
    parallel_residual: bool = False
    tie_embeddings: bool = True

    def __post_init__(self):  # the user's values are checked where they come in (config.py), not here
        self.train_len = self.train_len or self.block_size

    @property
    def head_dim(self):
        return self.n_embd // self.n_head

    @property
    def rotary_dim(self):  # transformers' partial_rotary_factor p: int(p * head_dim) channels rotate
        return int(self.head_dim * (self.rope_scaling or {}).get("partial_rotary_factor", 1.0))


class CausalSelfAttention(nn.Module):
    def __init__(self, config, layer):
        super().__init__()
        self.layer, self.n_head, self.dropout = layer, config.n_head, config.dropout
        self.n_kv_head, self.head_dim = config.n_kv_head or config.n_head, config.head_dim
        # a NoPE layer of a RoPE model
        self.nope = bool(config.nope_every) and (layer + 1) % config.nope_every == 0
        # SSMax's s_h starts at 1 / log L: s_h * log n is then 1 at the training length, plain softmax there
        s = torch.full((config.n_head,), 1 / math.log(max(2, config.block_size)))
        self.ssmax = nn.Parameter(s) if config.ssmax else None
        # rows: all query heads, then all key heads, then all value heads
        qkv = (config.n_head + 2 * self.n_kv_head) * self.head_dim
        self.c_attn = nn.Linear(config.n_embd, qkv, bias=config.biases or config.qkv_bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.biases)
        self.attend = Attend()
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x, pos, cache):
        B, T, C = x.size()
        qkv = self.c_attn(x).view(B, T, -1, self.head_dim).transpose(1, 2)  # (B, heads, T, head_dim)
        q, k, v = qkv.split((self.n_head, self.n_kv_head, self.n_kv_head), dim=1)
        # keys are cached before rotation: dynamic scaling changes their angles as it grows
        if cache is not None:
            k, v = cache.update(self.layer, k, v)
        if self.n_kv_head != self.n_head:  # grouped-query attention: query head h reads k/v head h // group
            k, v = (t.repeat_interleave(self.n_head // self.n_kv_head, dim=1) for t in (k, v))
        y = self.attend(q, k, v, pos, self.ssmax, self.dropout if self.training else 0.0)
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C)))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        hidden, self.swiglu = config.mlp_hidden or 4 * config.n_embd, config.mlp == "swiglu"
        # SwiGLU: c_fc holds the gate's rows, then the up projection's
        self.c_fc = nn.Linear(config.n_embd, 2 * hidden if self.swiglu else hidden, bias=config.biases)
        self.c_proj = nn.Linear(hidden, config.n_embd, bias=config.biases)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        if self.swiglu:
            gate, up = self.c_fc(x).chunk(2, dim=-1)
            return self.dropout(self.c_proj(F.silu(gate) * up))
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x))))


def norm(config):
    if config.norm == "rmsnorm":
        return nn.RMSNorm(config.n_embd, eps=config.norm_eps)
    return nn.LayerNorm(config.n_embd, eps=config.norm_eps, bias=config.biases)


class Block(nn.Module):
    def __init__(self, config, layer):
        super().__init__()
        self.ln_1 = norm(config)
        self.attn = CausalSelfAttention(config, layer)
        self.ln_2 = norm(config)
        self.mlp = MLP(config)
        self.parallel = config.parallel_residual

    def forward(self, x, pos, cache):
        if self.parallel:  # GPT-NeoX: attention and MLP both read the block's input
            return x + self.attn(self.ln_1(x), pos, cache) + self.mlp(self.ln_2(x))
        x = x + self.attn(self.ln_1(x), pos, cache)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config, i) for i in range(config.n_layer)]),
            ln_f=norm(config),
        ))
        if config.pos_emb == "learned":
            self.transformer.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.rope_cache = {}  # positions.cached_tables'
        if config.tie_embeddings:
            self.transformer.wte.weight = self.lm_head.weight  # weight tying
        # GPT-2 init: N(0, 0.02), residual projections by 1/sqrt(2 * n_layer); the draws' order fixes a seed's
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                torch.nn.init.normal_(m.weight, std=0.02)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def num_params(self):
        return sum(p.numel() for p in self.parameters())

    def forward(self, idx, targets=None, cache=None, method=AS_TRAINED, last=None):
        # idx [B, T] -> logits [B, T or last, vocab] (and the mean loss given targets); cache: sample.py's
        B, T = idx.size()
        start = cache.length if cache is not None else 0
        positions = torch.arange(start, start + T, device=idx.device)
        x = self.transformer.wte(idx)
        if self.config.pos_emb == "sinusoidal":
            # Vaswani et al. scale token embeddings by sqrt(d): the unit-amplitude table would otherwise
            # drown GPT-2-initialised (std 0.02) embeddings
            table = sinusoidal_embedding(positions, self.config.n_embd).to(x.dtype)
            x = x * math.sqrt(self.config.n_embd) + table
        elif self.config.pos_emb == "learned":
            if start + T > self.config.block_size:
                raise ValueError(f"learned position table has {self.config.block_size} entries; cannot "
                                 f"encode position {start + T - 1} (a learned model cannot extrapolate)")
            x = x + self.transformer.wpe(positions)
        # one Positions per kind of layer: the NoPE layers of a RoPE model (iRoPE, RNoPE-SWA) get no rotation
        kinds = {block.attn.nope for block in self.transformer.h}
        pos = forward_positions(method, self.config, start, T, kinds, idx.device, self.rope_cache)
        x = self.transformer.drop(x)
        for block in self.transformer.h:
            x = block(x, pos[block.attn.nope], cache)
        if cache is not None:
            cache.length += T
        logits = self.lm_head(self.transformer.ln_f(x[:, -last:] if last else x))
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
        return logits, loss

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
