"""The position methods of one forward: how a method (Method, built by eval/methods.py) treats positions, turned once
per forward into each kind of layer's Positions, whose variant attends: plain SDPA (causal, masked by a window, or
biased by ALiBi), with StreamingLLM's rotated sinks, merged near and far rotations (ReRoPE, Self-Extend), or exact
causal dynamic scaling. Also the encodings added to the input (sinusoidal) and ALiBi's bias; model.py holds the GPT."""
import math
from dataclasses import asdict, dataclass
from typing import Callable, NamedTuple

import torch
import torch.nn as nn
from torch.nn import functional as F

from rope import apply_rope, rope_cos_sin


@dataclass(frozen=True)
class Method:
    """How positions are treated, for one call (GPT.forward, generate, the scorers); eval/methods.py builds one per
    method name. rope_scaling: a rope_scaling dict replacing the trained one (None: as trained); causal_dynamic: exact
    per-position dynamic scaling (a full forward, no cache); window: attend to at most the last `window` positions;
    sinks: of those, keep the first `sinks` positions of the sequence instead, at StreamingLLM's cache positions (Xiao
    et al. 2023); logn_len: log-n attention scaling past this length; extend: (window, group): pairs at least `window`
    apart take far_positions' (ReRoPE: group None; Self-Extend); leak: with extend (group None), leaky ReRoPE's k: beyond
    the window distances grow k times slower (the far pairs rotated with linear scaling by k); crop: truncation, the
    input cut to its last `crop` tokens (Method.cropped) before a forward. rope_scaling, causal_dynamic and extend act on the RoPE layers only;
    window on every layer (layer_positions)."""
    rope_scaling: dict | None = None
    causal_dynamic: bool = False
    window: int | None = None
    sinks: int = 0
    logn_len: int | None = None
    extend: tuple | None = None
    leak: int | None = None
    crop: int | None = None

    def __post_init__(self):  # eval/methods.py builds these: a bad combination is a bug there
        if self.sinks and (not self.window or self.causal_dynamic or not 0 < self.sinks < self.window):
            raise ValueError(f"sinks={self.sinks} needs a window longer than it, without causal_dynamic (window={self.window})")
        if self.extend and (self.window or self.causal_dynamic or self.extend[0] < 1):
            raise ValueError(f"extend={self.extend} needs a window >= 1 and neither a sliding window nor causal_dynamic")

    def cropped(self, idx):
        """The tokens [B, T] a forward sees: under crop the last `crop`, at positions 0 .. crop - 1; else all."""
        return idx[:, -self.crop:] if self.crop else idx

    def settings(self):
        """The fields set, for reports: {} for the model as trained."""
        return {k: v for k, v in asdict(self).items() if v}


AS_TRAINED = Method()


# ----------------------------------------------------------------------------- encodings, masks and biases

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


def leaky_positions(T, Tk, method, device):
    """Leaky ReRoPE (Su 2023) with frequencies / k: query i at i + w(k - 1), key j at j, so a distance d >= w becomes
    w + (d - w) / k. (queries [T], keys [Tk])."""
    shift = method.extend[0] * (method.leak - 1)
    return torch.arange(Tk - T, Tk, device=device) + shift, torch.arange(Tk, device=device)


# ----------------------------------------------------------------------------- the attention variants

class Attend(nn.Module):
    """softmax(q k^T / sqrt(d) + mask) v: a module so that a probe can read its inputs with a forward hook."""

    def forward(self, q, k, v, mask, dropout_p):
        if mask is not None and mask.dim() == 3:  # ALiBi's [H, T, Tk] as [1, H, T, Tk]: SDPA's fused CPU kernel takes
            mask = mask[None]  # it so, and falls back to a 6x slower path for a 3-D mask (measured at 4096 tokens)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None and q.size(2) > 1,
                                              dropout_p=dropout_p)


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


class Positions(NamedTuple):
    """What one kind of layer (RoPE, NoPE) does with positions in one forward, built once by layer_positions: rotation
    tables [Tk, head_dim] (None: no rotation), the mask (None: causal; bool [T, Tk]: the keys each query sees; float
    [H, T, Tk]: ALiBi's bias), per-query scales [T, 1] (log-n; SSMax's log of the keys seen), and the variant that
    attends with them, given its own tables in `extra`."""
    variant: Callable
    cos: torch.Tensor | None = None
    sin: torch.Tensor | None = None
    mask: torch.Tensor | None = None
    q_scale: torch.Tensor | None = None
    log_n: torch.Tensor | None = None
    layout: str = "half"
    extra: tuple = ()

    def rotated(self, q, k):
        if self.cos is None:
            return q, k
        Tk, T = k.size(2), q.size(2)  # the T queries are the last T of Tk positions
        return apply_rope(q, self.cos[Tk - T:], self.sin[Tk - T:], self.layout), apply_rope(k, self.cos, self.sin, self.layout)

    def scales(self, ssmax):
        """Each query's logit scales (and head's, SSMax's s_h): before or after the rotation alike."""
        return [s for s in (self.q_scale, None if ssmax is None else ssmax[:, None, None] * self.log_n) if s is not None]


def scaled(q, scales):
    for scale in scales:
        q = q * scale.to(q.dtype)
    return q


def plain(pos, q, k, v, ssmax, attend, dropout):
    """SDPA over the rotated q and k: causal, masked (a window, sinks without rotation) or biased (ALiBi)."""
    q, k = pos.rotated(q, k)
    mask = pos.mask.to(q.dtype) if pos.mask is not None and pos.mask.is_floating_point() else pos.mask
    return attend(scaled(q, pos.scales(ssmax)), k, v, mask, dropout)


def with_sinks(pos, q, k, v, ssmax, attend, dropout):
    """StreamingLLM with RoPE: the sink keys see the query at its cache position, a second rotation of q."""
    (n, cos, sin), D = pos.extra, q.size(-1)
    unrotated, (q, k) = q, pos.rotated(q, k)
    sink = (torch.arange(k.size(2), device=k.device) < n)[:, None]
    # [q, q'] . [k, 0] for the recent keys, [q, q'] . [0, k] for the sinks; sqrt(2) keeps the 1/sqrt(head_dim) scale
    q = torch.cat((q, apply_rope(unrotated, cos, sin, pos.layout)), dim=-1) * math.sqrt(2)
    k = torch.cat((k * ~sink, k * sink), dim=-1)
    v = torch.cat((v, torch.zeros_like(v)), dim=-1)  # SDPA's fused kernels want v as wide as q (3x faster)
    return attend(scaled(q, pos.scales(ssmax)), k, v, pos.mask, dropout)[..., :D]


def merged(pos, q, k, v, ssmax, attend, dropout):
    """ReRoPE / Self-Extend: the same q and k rotated at their own positions near, at the far pairs' beyond the window."""
    q_cos, q_sin, k_cos, k_sin, window = pos.extra
    q_far, k_far = apply_rope(q, q_cos, q_sin, pos.layout), apply_rope(k, k_cos, k_sin, pos.layout)
    q, k = pos.rotated(q, k)
    scales = pos.scales(ssmax)
    return merged_attention(scaled(q, scales), k, scaled(q_far, scales), k_far, v, window, pos.mask)


def causal_dynamic(pos, q, k, v, ssmax, attend, dropout):
    """Exact causal dynamic scaling: rotates q and k itself, a frequency set per query."""
    return causal_dynamic_attention(scaled(q, pos.scales(ssmax)), k, v, *pos.extra, pos.mask, pos.layout)


def layer_positions(method, rotary, start, T, config, device, slow=None):
    """The Positions of one kind of layer over T queries after `start` cached ones: rotary, the rope.Rotary of one
    forward (None for a layer without rotation); slow: leaky ReRoPE's, frequencies / k (GPT.forward). A RoPE layer with a rope_window attends within the smaller of it and
    the method's window, keeping the method's sinks only where that is the method's (a layer trained local never saw
    far-off sinks)."""
    window, sinks, Tk = method.window, method.sinks, start + T
    if rotary is not None and config.rope_window and not (window and window < config.rope_window):
        window, sinks = config.rope_window, 0
    cos, sin, per_query = rotary or (None, None, None)
    seen = torch.arange(start + 1, Tk + 1, device=device)  # keys each query sees: causal, within the window
    seen = seen.clamp(max=window) if window else seen
    if config.pos_emb == "alibi":
        mask = alibi_bias(alibi_slopes(config.n_head), T, Tk, window, device, sinks)
    elif per_query is not None or (window and window < Tk) or T not in (1, Tk):
        mask = visible(T, Tk, window, device, sinks)
    else:  # SDPA's causal flag does it
        mask = None
    variant, extra = plain, ()
    if per_query is not None:
        variant, extra = causal_dynamic, per_query
    elif method.extend and cos is not None:
        far_cos, far_sin = (cos, sin) if slow is None else (slow.cos, slow.sin)
        at_q, at_k = far_positions(T, Tk, *method.extend, device) if slow is None else leaky_positions(T, Tk, method, device)
        variant, extra = merged, (far_cos[at_q], far_sin[at_q], far_cos[at_k], far_sin[at_k], method.extend[0])
    elif sinks and cos is not None:
        at = cache_positions(T, Tk, window, device)
        variant, extra = with_sinks, (sinks, cos[at], sin[at])
    return Positions(variant, cos, sin, mask, logn_scale(seen, method.logn_len)[:, None] if method.logn_len else None,
                     seen.float().log()[:, None] if config.ssmax else None, config.rope_layout, extra)
