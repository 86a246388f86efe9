"""How positions enter attention: forward_positions turns a PositionArgs into one Positions per kind of
layer, which `attention` applies: SDPA (causal, windowed, or ALiBi's bias), StreamingLLM's rotated sinks, near
and far rotations merged (ReRoPE, Self-Extend, leaky ReRoPE), or exact causal dynamic scaling."""
import json
import math
from dataclasses import asdict, dataclass
from typing import NamedTuple

import torch
import torch.nn as nn
from torch.nn import functional as F

from rope import ROPE_TYPES, apply_rope, rope_tables, scaling_type

SINKS = 4  # StreamingLLM's number of attention sinks (Xiao et al. 2023)
MIN_BLOCK_SIZE = SINKS + 1  # the shortest trained context every default method can score


@dataclass(frozen=True)
class PositionArgs:
    """How one forward treats positions. rope_scaling, causal_dynamic, extend: on RoPE layers only."""
    rope_scaling: dict | None = None  # replaces the trained one (None: as trained)
    causal_dynamic: bool = False  # exact per-position dynamic scaling (a full forward, no cache)
    window: int | None = None  # attend to at most the last `window` positions
    sinks: int = 0  # of those, the sequence's first `sinks` instead, at cache positions (StreamingLLM)
    logn_len: int | None = None  # log-n attention scaling past this length
    extend: tuple | None = None  # (window, group): pairs >= window apart at far_positions
    leak: int | None = None  # with extend, leaky ReRoPE's k
    crop: int | None = None  # truncation: the input cut to its last `crop` tokens before a forward

    def cropped(self, idx):  # under crop the last `crop` tokens [B, crop], at positions 0 .. crop - 1
        return idx[:, -self.crop:] if self.crop else idx

    def settings(self):  # the fields set, for reports: {} for the model as trained
        return {k: v for k, v in asdict(self).items() if v}


AS_TRAINED = PositionArgs()


def sinusoidal_embedding(positions, dim):
    # PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(p / 10000^(2i/d))
    inv_freq = torch.exp(torch.arange(0, dim, 2, device=positions.device) * (-math.log(10000.0) / dim))
    angles = positions.float()[:, None] * inv_freq
    return torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)


def visible(T, Tk, window, device, sinks=0):
    # [T, Tk]: may query i (of the T newest of Tk positions) see key j: causal, within `window`, which keeps
    # the first `sinks` positions and the last window - sinks (StreamingLLM)
    q = torch.arange(Tk - T, Tk, device=device)[:, None]
    k = torch.arange(Tk, device=device)
    return (k <= q) & ((k > q - window + sinks) | (k < sinks)) if window else k <= q


def cache_positions(T, Tk, window, device):  # each query's position in a StreamingLLM cache of `window` slots
    return torch.arange(Tk - T, Tk, device=device).clamp(max=window - 1)


def alibi_slopes(n_head):
    # ALiBi (Press et al. 2022): for n a power of two 2^(-8/n), 2^(-16/n), ..., 2^(-8); else those of the
    # power of two p below n, then every other slope of 2p for the rest (authors' code)
    def geometric(n):
        return [2 ** (-8 * (i + 1) / n) for i in range(n)]
    p = 2 ** math.floor(math.log2(n_head))
    return torch.tensor(geometric(p) + geometric(2 * p)[0::2][:n_head - p])


def alibi_bias(slopes, T, Tk, window, device, sinks=0):
    # [H, T, Tk] added to the logits: -slope_h * (i - j) where query i sees key j, else -inf; a sink j is at
    # distance (cache position of i) - j
    k = torch.arange(Tk, device=device)
    distance = torch.arange(Tk - T, Tk, device=device)[:, None] - k
    if sinks:
        distance = torch.where(k < sinks, cache_positions(T, Tk, window, device)[:, None] - k, distance)
    bias = -slopes.to(device)[:, None, None] * distance
    return bias.masked_fill(~visible(T, Tk, window, device, sinks), float("-inf"))


def far_positions(T, Tk, window, group, device=None):
    # (queries [T], keys [Tk]) positions for pairs >= W = window apart, clamped below Tk. ReRoPE (group None,
    # Su 2023): query at W, key at 0. Self-Extend (Jin et al. 2024): query i // G + W - W // G, key j // G
    # (grouped distances carry on from W)
    q, k = torch.arange(Tk - T, Tk, device=device), torch.arange(Tk, device=device)
    if group is None:
        return torch.full_like(q, window).clamp(max=Tk - 1), torch.zeros_like(k)
    return (q // group + window - window // group).clamp(max=Tk - 1), k // group


def merged_attention(q_near, k_near, q_far, k_far, v, window, mask=None):
    # logit q_near . k_near where i - j < window, q_far . k_far beyond, by chunks of queries (logits ~16 MB);
    # a chunk reads the keys it sees (none past its last query), near ones from its first query - window + 1
    B, H, T, D = q_near.shape
    Tk = k_near.size(2)
    q_near, q_far = q_near / math.sqrt(D), q_far / math.sqrt(D)
    chunk = max(1, (1 << 22) // (B * H * Tk))
    out = []
    for s in range(0, T, chunk):
        first, end = Tk - T + s, Tk - T + min(s + chunk, T)  # the chunk's queries' positions
        hi = end if mask is None else Tk
        lo = max(0, first - window + 1)  # keys below lo are far from every query in the chunk
        i, j = torch.arange(first, end, device=v.device)[:, None], torch.arange(lo, hi, device=v.device)
        att = q_far[:, :, s:s + chunk] @ k_far[:, :, :hi].transpose(-1, -2)
        near = q_near[:, :, s:s + chunk] @ k_near[:, :, lo:hi].transpose(-1, -2)
        att[..., lo:] = torch.where(i - j < window, near, att[..., lo:])
        if mask is None:
            att[..., lo:].masked_fill_(j > i, float("-inf"))
        else:
            att.masked_fill_(~mask[s:s + chunk], float("-inf"))
        out.append(att.softmax(dim=-1).to(v.dtype) @ v[:, :, :hi])
    return torch.cat(out, dim=2)


class Rotation(NamedTuple):  # rope_cos_sin's tables: queries [T, D], keys [Tk, D]
    q_cos: torch.Tensor
    q_sin: torch.Tensor
    k_cos: torch.Tensor
    k_sin: torch.Tensor


class Positions(NamedTuple):
    """What one kind of layer (RoPE, NoPE) does with positions in a forward; unused fields stay None."""
    mask: torch.Tensor | None = None  # None: causal; bool [T, Tk]: the keys a query sees; [H, T, Tk]: ALiBi's
    q_scale: torch.Tensor | None = None  # [T, 1] log-n's logit scale per query
    log_n: torch.Tensor | None = None  # [T, 1] log of the keys a query sees: SSMax's, times its learned s_h
    layout: str = "half"
    rotation: Rotation | None = None  # q and k at their own positions
    far: Rotation | None = None  # ReRoPE, Self-Extend: for the pairs at least far_window apart
    far_window: int = 0
    sinks: int = 0  # StreamingLLM: keys 0 .. sinks - 1 see each query at its cache position [T, D]
    sink_cos: torch.Tensor | None = None
    sink_sin: torch.Tensor | None = None
    dynamic_freq: torch.Tensor | None = None  # exact causal dynamic: [T, head_dim / 2], row t length t + 1's
    dynamic_attention: torch.Tensor | None = None  # and its attention factor per pair [head_dim / 2]

    def scales(self, ssmax):  # each query's logit scales (and head's: SSMax's s_h), before or after rotation
        ssmax = None if ssmax is None else ssmax[:, None, None] * self.log_n
        return [s for s in (self.q_scale, ssmax) if s is not None]


def rotated(q, k, rotation, layout):
    if rotation is None:
        return q, k
    q_cos, q_sin, k_cos, k_sin = rotation
    return apply_rope(q, q_cos, q_sin, layout), apply_rope(k, k_cos, k_sin, layout)


def scaled(q, scales):
    for scale in scales:
        q = q * scale.to(q.dtype)
    return q


def attention(q, k, v, pos, ssmax=None, dropout=0.0):
    # softmax(q k^T / sqrt(D) + mask) v of unrotated q [B, H, T, D], k, v [B, H, Tk, D], rotated, scaled and
    # masked as `pos` says; ssmax: SSMax's s_h [H] or None
    scales = pos.scales(ssmax)
    if pos.dynamic_freq is not None:  # a frequency set per query: rotates q and k itself
        from causal_dynamic import causal_dynamic_attention
        freq, attention_factor = pos.dynamic_freq, pos.dynamic_attention
        return causal_dynamic_attention(scaled(q, scales), k, v, freq, attention_factor, pos.mask, pos.layout)
    if pos.far is not None:  # q and k rotated at their own positions near, at the far positions beyond
        q_far, k_far = rotated(q, k, pos.far, pos.layout)
        q, k = rotated(q, k, pos.rotation, pos.layout)
        q, q_far = scaled(q, scales), scaled(q_far, scales)
        return merged_attention(q, k, q_far, k_far, v, pos.far_window, pos.mask)
    unrotated, (q, k), width, mask = q, rotated(q, k, pos.rotation, pos.layout), v.size(-1), pos.mask
    if pos.sinks:  # the sinks see the query at its cache position: a second rotation of q
        sink = (torch.arange(k.size(2), device=k.device) < pos.sinks)[:, None]
        # [q, q'] . [k, 0] for the recent keys, [q, q'] . [0, k] for the sinks; sqrt(2) keeps 1/sqrt(head_dim)
        at_cache = apply_rope(unrotated, pos.sink_cos, pos.sink_sin, pos.layout)
        q = torch.cat((q, at_cache), dim=-1) * math.sqrt(2)
        k = torch.cat((k * ~sink, k * sink), dim=-1)
        v = torch.cat((v, torch.zeros_like(v)), dim=-1)  # SDPA's fused kernels want v as wide as q (faster)
    elif mask is not None and mask.is_floating_point():  # ALiBi's [H, T, Tk] as [1, H, T, Tk]: SDPA's
        mask = mask.to(q.dtype)[None]  # fused CPU kernel takes it so, and falls back to a slow path for 3-D
    return F.scaled_dot_product_attention(scaled(q, scales), k, v, attn_mask=mask, dropout_p=dropout,
                                          is_causal=mask is None and q.size(2) > 1)[..., :width]


class Attend(nn.Module):  # `attention` as a module, so that a probe can read its inputs with a hook
    def forward(self, q, k, v, pos, ssmax, dropout):
        return attention(q, k, v, pos, ssmax, dropout)


def forward_positions(method, config, start, T, kinds, device, cache):
    # {nope: Positions} for a GPT's kinds of layer (True: a RoPE model's NoPE layers), once per forward
    tables = cached_tables(method, config, start + T, device, cache) if config.pos_emb == "rope" else None
    return {nope: layer_positions(method, None if nope else tables, start, T, config, device)
            for nope in kinds}


def cached_tables(method, config, n, device, cache):
    # rope.py's (cos, sin) [n, D] (exact causal dynamic: its frequencies), cached per scaling and device (a
    # copy to the GPU per forward stalls it); a longer length's serve unless they follow the length
    scaling, dynamic = method.rope_scaling, method.causal_dynamic
    follows = dynamic or ROPE_TYPES[scaling_type(scaling or config.rope_scaling)].follows_length
    # no json for training's scaling=None: torch.compile cannot trace json.dumps and would split the graph
    name = None if scaling is None else json.dumps(scaling, sort_keys=True, default=repr)
    key = (name, dynamic, str(device), n if follows else None)
    if key not in cache or cache[key][0] < n:
        if len(cache) >= 64:  # many lengths of a dynamic scaling (generation): start again
            cache.clear()
        if dynamic:
            from causal_dynamic import causal_dynamic_frequencies
            cache[key] = n, causal_dynamic_frequencies(config, scaling, n, device)
        else:
            cache[key] = n, rope_tables(config, scaling, n, torch.arange(n, device=device))
    tables = cache[key][1]
    return tables if dynamic else (tables[0][:n], tables[1][:n])


def far_rotation(method, config, cos, sin, start, T, device):
    # for the pairs at least method.extend's window apart; cos, sin: the near tables [Tk, D]
    (window, group), Tk = method.extend, start + T
    if not method.leak:
        at_q, at_k = far_positions(T, Tk, window, group, device)
        return Rotation(cos[at_q], sin[at_q], cos[at_k], sin[at_k])
    # leaky ReRoPE (Su 2023): the run's frequencies / k, query i at i + w(k - 1), key j at j: a distance
    # d >= w becomes w + (d - w) / k
    queries = torch.arange(start, Tk, device=device) + window * (method.leak - 1)
    q_cos, q_sin = rope_tables(config, None, Tk, queries, slowdown=method.leak)
    k_cos, k_sin = rope_tables(config, None, Tk, torch.arange(Tk, device=device), slowdown=method.leak)
    return Rotation(q_cos, q_sin, k_cos, k_sin)


def layer_positions(method, tables, start, T, config, device):
    # a RoPE layer with a rope_window attends within the smaller window, with the method's sinks only if
    # that window is the method's (a layer trained local never saw far-off sinks)
    rope = tables is not None
    window, sinks, Tk = method.window, method.sinks, start + T
    if rope and config.rope_window and not (window and window < config.rope_window):
        window, sinks = config.rope_window, 0
    seen = torch.arange(start + 1, Tk + 1, device=device)  # keys each query sees
    seen = seen.clamp(max=window) if window else seen
    dynamic, mask, logn = rope and method.causal_dynamic, None, None  # mask None: SDPA's causal flag
    if config.pos_emb == "alibi":
        mask = alibi_bias(alibi_slopes(config.n_head), T, Tk, window, device, sinks)
    elif dynamic or (window and window < Tk) or T not in (1, Tk):
        mask = visible(T, Tk, window, device, sinks)
    if method.logn_len:  # log-n scaling (Su 2023): a query seeing n > L keys has its logits scaled by
        # log(n) / log(L), 1 up to L, so that attention entropy stays near training's
        logn = (seen.double().log() / math.log(method.logn_len)).clamp(min=1).float()[:, None]
    base = Positions(mask, logn, seen.float().log()[:, None] if config.ssmax else None, config.rope_layout)
    if not rope:
        return base
    if dynamic:
        return base._replace(dynamic_freq=tables[0], dynamic_attention=tables[1])
    cos, sin = tables
    base = base._replace(rotation=Rotation(cos[start:], sin[start:], cos, sin))
    if method.extend:
        far = far_rotation(method, config, cos, sin, start, T, device)
        return base._replace(far=far, far_window=method.extend[0])
    if sinks:
        at = cache_positions(T, Tk, window, device)
        return base._replace(sinks=sinks, sink_cos=cos[at], sink_sin=sin[at])
    return base
