"""Exact causal dynamic scaling (--dynamic_modes causal): query t, and every key it sees, rotated with the
frequencies of length t + 1, as token-by-token generation does (one forward of T tokens otherwise gives every
query length T's). Opt-in and slow: positions.py imports it only when asked."""
import math

import torch

from rope import apply_rope, frequencies, pair_attention, rope_cos_sin


def causal_dynamic_frequencies(config, scaling, seq_len, device):
    """Frequencies [seq_len, head_dim / 2] (row t: length t + 1's), and the full length's attention factor
    per pair."""
    freqs = [frequencies(config, scaling, n) for n in range(1, seq_len + 1)]
    attention = pair_attention(config, freqs[-1][1])
    return torch.stack([f for f, _ in freqs]).to(device), attention.to(device)


def causal_dynamic_attention(q, k, v, inv_freq, attention_factor, mask, layout):
    B, H, T, D = q.shape
    pos = torch.arange(T, device=q.device)
    chunk = max(1, (1 << 22) // (B * H * T * D))  # queries per chunk: its re-rotated keys ~16 MB
    out = []
    # last chunk first: the re-rotated keys then shrink from chunk to chunk and the allocator reuses the
    # freed memory (growing sizes fragment glibc's heap to several GB at long lengths)
    for s in reversed(range(0, T, chunk)):
        e = min(s + chunk, T)
        cos, sin = rope_cos_sin(inv_freq[s:e], pos[:e], attention_factor, layout)  # (C, e, D): one per query
        keys = apply_rope(k[:, :, None, :e], cos, sin, layout)  # (B, H, C, e, D)
        own = (torch.arange(e - s, device=q.device), pos[s:e])  # each query's own position in its table
        query = apply_rope(q[:, :, s:e], cos[own], sin[own], layout)  # (B, H, C, D)
        att = torch.einsum("bhcd,bhced->bhce", query, keys) / math.sqrt(D)
        att = att.masked_fill(~mask[s:e, :e], float("-inf")).softmax(dim=-1)
        out.append(att.to(v.dtype) @ v[:, :, :e])
    return torch.cat(out[::-1], dim=2)
