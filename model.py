"""
A small GPT (decoder-only transformer) with a choice of position encoding:
learned (GPT-2), sinusoidal (Vaswani et al.), rope (Su et al.; p-RoPE with rope_fraction < 1,
Barbero et al. 2024; NoPE layers interleaved and local RoPE layers, iRoPE / RNoPE-SWA), alibi (Press et al.
2022) or none (NoPE); any of them with Scalable-Softmax (Nakanishi 2025).
nanoGPT's model, plus RoPE scaling at inference and a KV cache for generation.
"""
import json
import math
from dataclasses import asdict, dataclass
from typing import NamedTuple

import torch
import torch.nn as nn
from torch.nn import functional as F

from rope import (LAYOUTS, apply_rope, check_scaling, pair_attention, rope_cos_sin, rope_frequencies, rotating_pairs,
                  scaling_type)

POS_EMBS = ("learned", "sinusoidal", "rope", "alibi", "none")


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
    rope_fraction: float | None = None  # p-RoPE: the share of pairs that rotate (None, not 1.0: older checkpoints)
    nope_every: int | None = None  # iRoPE / RNoPE-SWA: every k-th layer (from 1) attends globally without positions
    rope_window: int | None = None  # RNoPE-SWA: the RoPE layers attend only to their last rope_window positions
    ssmax: bool = False  # Scalable-Softmax (Nakanishi 2025): logits times s_h * log(keys seen), s_h learned per head
    train_len: int | None = None  # the original training length the methods scale from: block_size, or a fine-tune's first run's

    def __post_init__(self):
        self.train_len = self.train_len or self.block_size
        small = [f"{k}={getattr(self, k)!r}" for k in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd") if getattr(self, k) < 1]
        if small:
            raise ValueError(f"{', '.join(small)}: model sizes must be >= 1")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout={self.dropout!r} is not allowed; use 0 <= dropout < 1")
        if not self.rope_base > 1:
            raise ValueError(f"rope_base={self.rope_base!r} is not allowed; use a base > 1")
        for key, allowed in (("pos_emb", POS_EMBS), ("rope_layout", LAYOUTS)):
            if getattr(self, key) not in allowed:
                raise ValueError(f"unknown {key} {getattr(self, key)!r}; allowed: {', '.join(allowed)}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}")
        if self.pos_emb == "rope" and (self.n_embd // self.n_head) % 2:
            raise ValueError(f"RoPE needs an even head dimension, got n_embd/n_head = {self.n_embd // self.n_head}")
        if self.pos_emb == "alibi" and self.rope_scaling is not None:
            raise ValueError(f"rope_scaling={self.rope_scaling!r} given to pos_emb='alibi': ALiBi has no rotation to scale")
        if self.rope_fraction is not None and self.pos_emb != "rope":
            raise ValueError(f"rope_fraction={self.rope_fraction!r} is p-RoPE's; it needs pos_emb='rope', not {self.pos_emb!r}")
        for key in ("nope_every", "rope_window"):
            if (value := getattr(self, key)) is not None and (type(value) is not int or value < 1):
                raise ValueError(f"{key} must be an integer >= 1 (or None), got {value!r}")
            if value is not None and self.pos_emb != "rope":
                raise ValueError(f"{key}={value!r} sets the layers of a RoPE model (iRoPE, RNoPE-SWA); it needs "
                                 f"pos_emb='rope', not {self.pos_emb!r}")
        if self.pos_emb == "rope":
            rotating_pairs(self.n_embd // self.n_head, self.rope_fraction)  # raises for a bad fraction
        check_scaling(self.full_rope_scaling(), self.n_embd // self.n_head)

    def full_rope_scaling(self, scaling=None):
        """`scaling` (default: as trained) whose original length defaults to block_size, as in transformers, and whose
        rope_theta and partial_rotary_factor (the model's, not a scaling's: v5 keeps them in the dict) default to the
        trained dict's."""
        trained = self.rope_scaling if isinstance(self.rope_scaling, dict) else {}
        own = {k: trained[k] for k in ("rope_theta", "partial_rotary_factor") if k in trained}
        scaling = scaling or self.rope_scaling
        return ({"original_max_position_embeddings": self.block_size, **own, **scaling} if isinstance(scaling, dict)
                else scaling)


@dataclass(frozen=True)
class Method:
    """How positions are treated, for one call (GPT.forward, generate, the scorers); eval/methods.py builds one per
    method name. rope_scaling: a rope_scaling dict replacing the trained one (None: as trained); causal_dynamic: exact
    per-position dynamic scaling (a full forward, no cache); window: attend to at most the last `window` positions;
    sinks: of those, keep the first `sinks` positions of the sequence instead, at StreamingLLM's cache positions (Xiao
    et al. 2023); logn_len: log-n attention scaling past this length; extend: (window, group): pairs at least `window`
    apart take far_positions' (ReRoPE: group None; Self-Extend); leak: with extend (group None), leaky ReRoPE's k:
    beyond the window distances grow k times slower (the far pairs rotated with linear scaling by k); crop: truncation, the input cut to its last `crop`
    tokens (Method.kept) before a forward. rope_scaling, causal_dynamic and extend act on the RoPE layers only; window
    on every layer (GPT.layer_positions)."""
    rope_scaling: dict | None = None
    causal_dynamic: bool = False
    window: int | None = None
    sinks: int = 0
    logn_len: int | None = None
    extend: tuple | None = None
    leak: int | None = None
    crop: int | None = None

    def __post_init__(self):
        if self.sinks and (not self.window or self.causal_dynamic or not 0 < self.sinks < self.window):
            raise ValueError(f"sinks={self.sinks} needs a window longer than it, without causal_dynamic (window={self.window})")
        if self.extend and (self.window or self.causal_dynamic or self.extend[0] < 1):
            raise ValueError(f"extend={self.extend} needs a window >= 1 and neither a sliding window nor causal_dynamic")

    def kept(self, idx):
        """The tokens [B, T] a forward sees: under crop the last `crop`, at positions 0 .. crop - 1; else all."""
        return idx[:, -self.crop:] if self.crop else idx

    def given(self):
        """The fields set, for reports: {} for the model as trained."""
        return {k: v for k, v in asdict(self).items() if v}


AS_TRAINED = Method()


class Positions(NamedTuple):
    """What the layers of one kind (RoPE, NoPE) share in one forward, built once by GPT.forward."""
    cos: torch.Tensor | None  # [Tk, head_dim] rotation tables (rope.rope_cos_sin); None without RoPE
    sin: torch.Tensor | None
    mask: torch.Tensor | None  # None: plain causal; bool [T, Tk] keys each query sees; float [H, T, Tk] ALiBi bias
    q_scale: torch.Tensor | None  # [T, 1] log-n scaling of each query
    per_query: tuple | None  # (inv_freq [T, head_dim/2], attention [head_dim/2]): exact causal dynamic scaling
    sinks: tuple | None  # StreamingLLM with RoPE: (n sinks, cos, sin [T, head_dim] of each query at its cache position)
    log_n: torch.Tensor | None = None  # [T, 1] log of how many keys each query sees: SSMax's
    far: tuple | None = None  # ReRoPE / Self-Extend: (cos, sin of each query [T, D], of each key [Tk, D], window)


class KVCache:
    """Per-layer keys and values so far, keys *before* rotation: every step re-rotates them with the frequencies
    for the current length, exact for dynamic NTK."""

    def __init__(self, n_layer):
        self.kv, self.length = [None] * n_layer, 0  # length: tokens already in the cache

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


def visible(T, Tk, window, device, sinks=0):
    """Bool [T, Tk]: may query i (the i-th of the T newest of Tk positions) see key j: causal, within `window`,
    which keeps the first `sinks` positions and the last window - sinks (StreamingLLM)."""
    q = torch.arange(Tk - T, Tk, device=device)[:, None]
    k = torch.arange(Tk, device=device)
    return (k <= q) & ((k > q - window + sinks) | (k < sinks)) if window else k <= q


def cache_positions(T, Tk, window, device):
    """Each query's position in a StreamingLLM cache of `window` slots: its own up to window - 1, then window - 1."""
    return torch.arange(Tk - T, Tk, device=device).clamp(max=window - 1)


def alibi_slopes(n_head):
    """ALiBi's per-head slopes (Press et al. 2022). For n heads a power of two, the geometric sequence
    2^(-8/n), 2^(-16/n), ..., 2^(-8). Otherwise the slopes of the power of two p just below n, then every
    other slope of 2p (its 1st, 3rd, 5th, ...) for the n - p heads left, as the authors' code does: the
    extra heads get slopes between p's, not a sequence with another ratio."""
    def geometric(n):
        return [2 ** (-8 * (i + 1) / n) for i in range(n)]
    p = 2 ** math.floor(math.log2(n_head))
    return torch.tensor(geometric(p) + geometric(2 * p)[0::2][:n_head - p])


def alibi_bias(slopes, T, Tk, window, device, sinks=0):
    """ALiBi as a float mask [H, T, Tk] added to the scaled logits: -slope_h * (i - j) where query i (the i-th
    of the T newest of Tk positions) sees key j, -inf elsewhere; a sink j is at distance (cache position of i) - j."""
    k = torch.arange(Tk, device=device)
    distance = torch.arange(Tk - T, Tk, device=device)[:, None] - k
    if sinks:
        distance = torch.where(k < sinks, cache_positions(T, Tk, window, device)[:, None] - k, distance)
    bias = -slopes.to(device)[:, None, None] * distance
    return bias.masked_fill(~visible(T, Tk, window, device, sinks), float("-inf"))


def logn_scale(n, train_len):
    # log-n scaling (Su 2023): a query that sees n > L tokens gets its logits scaled by log(n) / log(L),
    # exactly 1 up to L, so attention entropy stays near what training saw
    return (n.double().log() / math.log(train_len)).clamp(min=1).float()


def far_positions(T, Tk, window, group, device=None):
    """Where the T newest of Tk positions sit for the pairs at least `window` apart: (queries [T], keys [Tk]).
    ReRoPE (group None, Su 2023): every such pair at distance `window` (query at window, key at 0). Self-Extend
    (Jin et al. 2024): grouped positions, query floor(i/G) + W - floor(W/G), key floor(j/G), so that the grouped
    distances carry on from W. Clamped into [0, Tk): a query short of the window has no far keys anyway."""
    q, k = torch.arange(Tk - T, Tk, device=device), torch.arange(Tk, device=device)
    if group is None:
        return torch.full_like(q, window).clamp(max=Tk - 1), torch.zeros_like(k)
    return (q // group + window - window // group).clamp(max=Tk - 1), k // group


def merged_attention(q_near, k_near, q_far, k_far, v, window, mask=None):
    """Attention whose logit for query i and key j is q_near . k_near where i - j < window, q_far . k_far beyond
    (ReRoPE, Self-Extend: two rotations of the same q and k); mask: bool [T, Tk] (None: causal). Chunks of queries
    keep the two logit matrices to ~16 MB."""
    B, H, T, D = q_near.shape
    Tk = k_near.size(2)
    j = torch.arange(Tk, device=v.device)
    chunk = max(1, (1 << 22) // (B * H * Tk))
    out = []
    for s in range(0, T, chunk):
        i = torch.arange(Tk - T + s, Tk - T + min(s + chunk, T), device=v.device)[:, None]
        near = q_near[:, :, s:s + chunk] @ k_near.transpose(-1, -2)
        att = torch.where(i - j < window, near, q_far[:, :, s:s + chunk] @ k_far.transpose(-1, -2)) / math.sqrt(D)
        seen = (j <= i) if mask is None else mask[s:s + chunk]
        out.append(att.masked_fill(~seen, float("-inf")).softmax(dim=-1).to(v.dtype) @ v)
    return torch.cat(out, dim=2)


def causal_dynamic_attention(q, k, v, inv_freq, attention_factor, mask, layout):
    """Exact causal dynamic scaling: query t and every key it sees (bool mask [T, T]) rotated with inv_freq[t],
    the frequencies for length t + 1; chunks of queries keep the re-rotated keys to ~16 MB."""
    B, H, T, D = q.shape
    pos = torch.arange(T, device=q.device)
    chunk = max(1, (1 << 22) // (B * H * T * D))
    out = []
    # last chunk first: the re-rotated keys then shrink from chunk to chunk and the allocator reuses the
    # freed memory (growing sizes fragment glibc's heap to several GB at long lengths)
    for s in reversed(range(0, T, chunk)):
        e = min(s + chunk, T)
        cos, sin = rope_cos_sin(inv_freq[s:e], pos[:e], attention_factor, layout)  # (C, e, D): a table per query
        keys = apply_rope(k[:, :, None, :e], cos, sin, layout)  # (B, H, C, e, D)
        own = (torch.arange(e - s, device=q.device), pos[s:e])  # each query's own position in its table
        query = apply_rope(q[:, :, s:e], cos[own], sin[own], layout)  # (B, H, C, D)
        att = torch.einsum("bhcd,bhced->bhce", query, keys) / math.sqrt(D)
        att = att.masked_fill(~mask[s:e, :e], float("-inf")).softmax(dim=-1)
        out.append(att.to(v.dtype) @ v[:, :, :e])
    return torch.cat(out[::-1], dim=2)


class Attend(nn.Module):
    """softmax(q k^T / sqrt(d) + mask) v: a module so that a probe can read its inputs with a forward hook."""

    def forward(self, q, k, v, mask, dropout_p):
        if mask is not None and mask.dim() == 3:  # ALiBi's [H, T, Tk] as [1, H, T, Tk]: SDPA's fused CPU kernel takes
            mask = mask[None]  # it so, and falls back to a 6x slower path for a 3-D mask (measured at 4096 tokens)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None and q.size(2) > 1,
                                              dropout_p=dropout_p)


class CausalSelfAttention(nn.Module):

    def __init__(self, config, layer):
        super().__init__()
        self.layer, self.n_head, self.dropout, self.layout = layer, config.n_head, config.dropout, config.rope_layout
        self.nope = bool(config.nope_every) and (layer + 1) % config.nope_every == 0  # a NoPE layer of a RoPE model
        # SSMax's s_h starts at 1 / log L: s_h * log n is then 1 at the training length, plain softmax there
        s = torch.full((config.n_head,), 1 / math.log(max(2, config.block_size)))
        self.ssmax = nn.Parameter(s) if config.ssmax else None
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=False)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=False)
        self.attend = Attend()
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x, pos, cache):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).view(B, T, 3 * self.n_head, C // self.n_head).transpose(1, 2).split(self.n_head, dim=1)
        if cache is not None:  # keys are cached before rotation: dynamic scaling changes their angles as it grows
            k, v = cache.update(self.layer, k, v)
        Tk = k.size(2)  # the T queries are the last T of Tk positions
        unrotated, unrotated_k = q, k
        if pos.cos is not None:
            q = apply_rope(q, pos.cos[Tk - T:], pos.sin[Tk - T:], self.layout)
            k = apply_rope(k, pos.cos, pos.sin, self.layout)
        if pos.sinks is not None:  # RoPE: the sink keys see the query at its cache position, a second rotation of q
            n, cos, sin = pos.sinks
            sink = (torch.arange(Tk, device=k.device) < n)[:, None]
            # [q, q'] . [k, 0] for the recent keys, [q, q'] . [0, k] for the sinks; sqrt(2) keeps the 1/sqrt(head_dim) scale
            q = torch.cat((q, apply_rope(unrotated, cos, sin, self.layout)), dim=-1) * math.sqrt(2)
            k = torch.cat((k * ~sink, k * sink), dim=-1)
            v = torch.cat((v, torch.zeros_like(v)), dim=-1)  # SDPA's fused kernels want v as wide as q (3x faster)
        far = None
        if pos.far is not None:  # ReRoPE / Self-Extend: the same q and k at the far pairs' positions
            q_cos, q_sin, k_cos, k_sin, far_window = pos.far
            far = [apply_rope(unrotated, q_cos, q_sin, self.layout), apply_rope(unrotated_k, k_cos, k_sin, self.layout)]
        for scale in (pos.q_scale, None if self.ssmax is None else self.ssmax[:, None, None] * pos.log_n):
            if scale is not None:  # one per query (and head): before or after the rotation alike
                q = q * scale.to(q.dtype)
                far = far and [far[0] * scale.to(q.dtype), far[1]]
        if far is not None:
            y = merged_attention(q, k, *far, v, far_window, pos.mask)
        elif pos.per_query is not None:  # exact causal dynamic: rotates q and k itself
            y = causal_dynamic_attention(q, k, v, *pos.per_query, pos.mask, self.layout)
        else:
            mask = pos.mask.to(q.dtype) if pos.mask is not None and pos.mask.is_floating_point() else pos.mask
            y = self.attend(q, k, v, mask, self.dropout if self.training else 0.0)[..., :C // self.n_head]
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C)))


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

    def forward(self, x, pos, cache):
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
            ln_f=nn.LayerNorm(config.n_embd, bias=False),
        ))
        if config.pos_emb == "learned":
            self.transformer.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.rope_cache = {}  # GPT.rotary's
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        # GPT-2 init: N(0, 0.02), residual projections scaled by 1/sqrt(2 * n_layer) (this order of draws: a
        # seed gives the same weights as before)
        self.apply(lambda m: torch.nn.init.normal_(m.weight, std=0.02) if isinstance(m, (nn.Linear, nn.Embedding)) else None)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def num_params(self):
        return sum(p.numel() for p in self.parameters())

    def frequencies(self, seq_len, scaling=None):
        """(inv_freq [head_dim/2], attention_factor) over seq_len tokens with a rope_scaling (None: as trained)."""
        cfg = self.config
        return rope_frequencies(cfg.n_embd // cfg.n_head, cfg.rope_base, cfg.full_rope_scaling(scaling), seq_len,
                                cfg.rope_fraction)

    def rotary(self, seq_len, scaling, causal_dynamic, device):
        """rotary_tables, cached per scaling and device (a host-to-device copy per forward stalls a GPU): a length's
        tables are the first rows of a longer length's, unless the frequencies follow the length (dynamic, longrope)."""
        follows = causal_dynamic or scaling_type(self.config.full_rope_scaling(scaling)) in ("dynamic", "longrope")
        # no json for training's scaling=None: torch.compile cannot trace json.dumps, and would split the graph there
        name = None if scaling is None else json.dumps(scaling, sort_keys=True, default=repr)
        key = (name, causal_dynamic, str(device), seq_len if follows else None)
        if key not in self.rope_cache or self.rope_cache[key][0] < seq_len:
            if len(self.rope_cache) >= 64:  # many lengths of a dynamic scaling (generation): start again
                self.rope_cache.clear()
            self.rope_cache[key] = seq_len, self.rotary_tables(seq_len, scaling, causal_dynamic, device)
        cos, sin, per_query = self.rope_cache[key][1]
        return (None, None, per_query) if cos is None else (cos[:seq_len], sin[:seq_len], None)

    def rotary_tables(self, seq_len, scaling, causal_dynamic, device):
        """(cos, sin, per_query) of RoPE for one forward over positions [0, seq_len), shared by every layer:
        the tables of rope.rope_cos_sin, or with causal_dynamic per_query = (inv_freq [seq_len, head_dim/2],
        attention [head_dim/2] (rope.pair_attention)), row t the frequencies for length t + 1 (exact causal dynamic)."""
        cfg = self.config
        if causal_dynamic:
            freqs = [self.frequencies(n, scaling) for n in range(1, seq_len + 1)]
            attention = pair_attention(cfg.n_embd // cfg.n_head, cfg.full_rope_scaling(scaling), freqs[-1][1])
            return None, None, (torch.stack([f for f, _ in freqs]).to(device), attention.to(device))
        inv_freq, attention_factor = self.frequencies(seq_len, scaling)
        attention = pair_attention(cfg.n_embd // cfg.n_head, cfg.full_rope_scaling(scaling), attention_factor)
        cos, sin = rope_cos_sin(inv_freq.to(device), torch.arange(seq_len, device=device), attention.to(device),
                                cfg.rope_layout)
        return cos, sin, None

    def attention_mask(self, T, Tk, window, sinks, exact, device):
        """The mask of one kind of layer (T queries, the last of Tk positions): None where SDPA's causal flag does
        it, else bool [T, Tk] (causal, within `window` with its `sinks`), or ALiBi's float bias [H, T, Tk]."""
        if self.config.pos_emb == "alibi":
            return alibi_bias(alibi_slopes(self.config.n_head), T, Tk, window, device, sinks)
        if not exact and (not window or window >= Tk) and T in (1, Tk):
            return None
        return visible(T, Tk, window, device, sinks)

    def layer_positions(self, rope, start, T, method, device):
        """The Positions of one kind of layer over T queries after `start` cached ones. rope: (cos, sin, per_query) of
        GPT.rotary, None for a layer without rotation. A RoPE layer with a rope_window attends within the smaller of
        it and the method's window, keeping the method's sinks only where that is the method's (a layer trained
        local never saw far-off sinks)."""
        window, sinks, extend = method.window, method.sinks, method.extend
        if rope is not None and self.config.rope_window and not (window and window < self.config.rope_window):
            window, sinks = self.config.rope_window, 0
        cos, sin, per_query = rope or (None, None, None)
        rotated_sinks = None
        if sinks and cos is not None:
            at = cache_positions(T, start + T, window, device)
            rotated_sinks = (sinks, cos[at], sin[at])
        far = None
        if extend and cos is not None and method.leak:
            # leaky ReRoPE: query at i + w(k-1), key at j, both with frequencies / k: distance w + (d - w) / k past w
            shift = extend[0] * (method.leak - 1)
            slow_cos, slow_sin, _ = self.rotary(start + T + shift, {"rope_type": "linear", "factor": float(method.leak)},
                                                False, device)
            at_q, at_k = torch.arange(start, start + T, device=device) + shift, torch.arange(start + T, device=device)
            far = (slow_cos[at_q], slow_sin[at_q], slow_cos[at_k], slow_sin[at_k], extend[0])
        elif extend and cos is not None:
            at_q, at_k = far_positions(T, start + T, *extend, device)
            far = (cos[at_q], sin[at_q], cos[at_k], sin[at_k], extend[0])
        seen = torch.arange(start + 1, start + T + 1, device=device)  # keys each query sees: causal, within the window
        seen = seen.clamp(max=window) if window else seen
        return Positions(cos=cos, sin=sin, mask=self.attention_mask(T, start + T, window, sinks, per_query is not None, device),
                         q_scale=logn_scale(seen, method.logn_len)[:, None] if method.logn_len else None,
                         per_query=per_query, sinks=rotated_sinks, far=far,
                         log_n=seen.float().log()[:, None] if self.config.ssmax else None)

    def forward(self, idx, targets=None, cache=None, method=AS_TRAINED, last=None):
        """idx [B, T] -> logits [B, T, vocab] (and the mean loss if targets are given); last: of the last positions only.
        cache: a KVCache, continued in place. method: how positions are treated in this call (Method)."""
        B, T = idx.size()
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
        rope = (self.rotary(start + T, method.rope_scaling, method.causal_dynamic, idx.device)
                if self.config.pos_emb == "rope" else None)
        # one Positions per kind of layer: the NoPE layers of a RoPE model (iRoPE, RNoPE-SWA) get no rotation
        pos = {nope: self.layer_positions(None if nope else rope, start, T, method, idx.device)
               for nope in {block.attn.nope for block in self.transformer.h}}
        x = self.transformer.drop(x)
        for block in self.transformer.h:
            x = block(x, pos[block.attn.nope], cache)
        if cache is not None:
            cache.length += T
        logits = self.lm_head(self.transformer.ln_f(x[:, -last:] if last else x))  # last: what a scorer reads
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
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, on_token=None, method=AS_TRAINED):
        """Sample max_new_tokens after idx [B, T], every step with the same Method: past block_size the encoding
        extrapolates. Through a KV cache, except under crop: each token from its last `crop` tokens at positions 0 ..
        crop - 1 (nanoGPT's sampling), the kept tokens moving at every step. on_token(ids [B, 1]) sees each step's
        tokens as they come (sample.py streams them)."""
        cache = None if method.crop else KVCache(self.config.n_layer)
        if cache is None:
            logits, _ = self(method.kept(idx))
        else:
            logits, _ = self(idx[:, :self.exact_prefill(idx.size(1), method.rope_scaling)], cache=cache, method=method)
            for t in range(cache.length, idx.size(1)):  # the rest of the prompt, one token per forward
                logits, _ = self(idx[:, t:t + 1], cache=cache, method=method)
        for _ in range(max_new_tokens):
            idx_next = sample_next(logits[:, -1, :], temperature, top_k)
            idx = torch.cat((idx, idx_next), dim=1)
            if on_token:
                on_token(idx_next)
            logits, _ = self(method.kept(idx)) if cache is None else self(idx_next, cache=cache, method=method)
        return idx

    def exact_prefill(self, T, rope_scaling):
        """How many of T prompt tokens one forward can take exactly. All of them unless the scaling is dynamic:
        its frequencies follow the length of the forward, so past the original length one forward would give
        every prompt token the prompt's length where generation gives token t the length t + 1 (exact)."""
        scaling = self.config.full_rope_scaling(rope_scaling) if self.config.pos_emb == "rope" else None
        if scaling_type(scaling) == "dynamic":
            return min(T, scaling["original_max_position_embeddings"])
        return T


def sample_next(logits, temperature=1.0, top_k=None):
    """One token id per row [B, 1] from logits [B, vocab]: divided by the temperature, cut to the top_k."""
    logits = logits.float() / max(temperature, 1e-8)
    if top_k is not None:
        v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
        logits[logits < v[:, [-1]]] = -float("inf")
    return torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)
