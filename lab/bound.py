"""The RoPE base bound's math (Men et al., NeurIPS 2024): B_m = sum_i cos(m theta_i) and where it first turns negative,
for any frequencies; shared by lab/base_bound.py, lab/probes.py and lab/pairs.py."""
import torch

from rope import default_inv_freq, rotating_pairs


def trained_freq(head_dim, base, fraction=None):
    """The frequencies a model trains with (float64); fraction (p-RoPE): only the highest pairs rotate, the others 0."""
    inv_freq = default_inv_freq(head_dim, base)
    inv_freq[rotating_pairs(head_dim, fraction):] = 0
    return inv_freq


def bound_curve(inv_freq, max_len, start=0):
    """B_m = sum_i cos(m theta_i) for m = start .. max_len (float64), of any frequencies: a scaling method's too."""
    # B_m < 0: attention no longer prefers a key similar to the query at distance m (docs/methodology.md, base bound)
    return torch.cos(torch.arange(start, max_len + 1, dtype=torch.float64)[:, None] * inv_freq.double()).sum(-1)


def first_negative(inv_freq, max_len):
    """The first distance m in 1 .. max_len with B_m < 0, or None. In doubling chunks: most bases of a scan fail early."""
    start, size = 1, 256
    while start <= max_len:
        negative = (bound_curve(inv_freq, min(start + size - 1, max_len), start) < 0).nonzero()
        if len(negative):
            return start + int(negative[0])
        start, size = start + size, 2 * size


def base_bound_curve(head_dim, base, max_len, start=0, fraction=None):
    """B_m for m = start .. max_len at the trained frequencies; an unrotated pair (p-RoPE) adds 1."""
    return bound_curve(trained_freq(head_dim, base, fraction), max_len, start)


def base_bound_note(cfg, eval_multiple=16):
    """A line if the RoPE base is below Men et al.'s bound (B_m < 0) up to eval_multiple x block_size, else None."""
    L, head_dim = cfg.block_size, cfg.head_dim
    if cfg.pos_emb == "rope" and (m := first_negative(trained_freq(head_dim, cfg.rope_base, cfg.rope_fraction), eval_multiple * L)):
        reach = "its own training length" if m <= L else f"evaluation lengths past {m} ({m / L:.2g}x the training length)"
        fraction = f", rope_fraction {cfg.rope_fraction:g}" if cfg.rope_fraction else ""
        return (f"note: rope_base={cfg.rope_base:g} is below the RoPE base bound (Men et al. 2024) for {reach}: B_m < 0 "
                f"from distance {m}, head dim {head_dim}{fraction} (python lab/base_bound.py --head_dim {head_dim})")
