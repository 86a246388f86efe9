"""
Rotary position embeddings (RoPE): frequencies, the scaling methods, cos/sin tables and the rotation.

Scaling is a Hugging Face style dict (the keys `transformers` uses in `config.rope_scaling`, or its v5
`config.rope_parameters`, which may also carry the base as `rope_theta`), e.g.
    {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 256}
Keys a method does not use are ignored, as transformers dicts carry others (mscale, partial_rotary_factor).
NTK-by-parts is YaRN without its temperature ("attention_factor": 1.0). One small function per method; the
attention factor multiplies cos and sin, as in `transformers`, so logits get its square. p-RoPE: rotating_pairs.
References: PI (Chen et al. 2023), NTK-aware (bloc97 2023), YaRN (Peng et al. 2023), Llama 3.1 (Meta 2024),
p-RoPE (Barbero et al., "Round and Round We Go! What makes Rotary Positional Encodings useful?", 2024).
"""
import math
import numbers

import torch

ROPE_TYPES = ("default", "linear", "ntk", "dynamic", "yarn", "llama3")
LAYOUTS = ("half", "interleaved")
EXAMPLE = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256}


def default_inv_freq(dim, base):
    # inv_freq_i = base^(-2i/d), i = 0 .. d/2-1; float64 so scaled variants don't lose digits
    return 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)


def linear_inv_freq(dim, base, factor):
    # Position Interpolation: position m becomes m / factor
    return default_inv_freq(dim, base) / factor


def ntk_inv_freq(dim, base, factor):
    # NTK-aware: stretch the base so the lowest frequency is interpolated by `factor`, the highest (almost) kept
    return default_inv_freq(dim, base * factor ** (dim / (dim - 2)))


def dynamic_inv_freq(dim, base, factor, original_len, seq_len):
    # Dynamic NTK as in transformers: `factor` is an extra NTK multiplier a (1: plain), the scale follows the length
    if seq_len is None or seq_len <= original_len:
        return default_inv_freq(dim, base)
    scale = factor * seq_len / original_len - (factor - 1)
    return default_inv_freq(dim, base * scale ** (dim / (dim - 2)))


def yarn_correction_dim(num_rotations, dim, base, original_len):  # the pair turning num_rotations times over L
    return dim * math.log(original_len / (num_rotations * 2 * math.pi)) / (2 * math.log(base))


def yarn_inv_freq(dim, base, factor, original_len, beta_fast=32.0, beta_slow=1.0, truncate=True):
    # NTK-by-parts: pairs that rotate more than beta_fast times over the original context keep their
    # frequency (extrapolate), pairs rotating less than beta_slow times are interpolated (PI),
    # linear ramp in the pair index between them (as the YaRN authors' code and transformers do).
    low = yarn_correction_dim(beta_fast, dim, base, original_len)
    high = yarn_correction_dim(beta_slow, dim, base, original_len)
    if truncate:  # widen the ramp to whole pairs (default); transformers' "truncate": False keeps exact bounds
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # avoid 0/0, as transformers does
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extrapolated = default_inv_freq(dim, base)
    return extrapolated * (1 - ramp) + (extrapolated / factor) * ramp


def yarn_attention_factor(factor):  # sqrt(1/t) = 0.1 ln(s) + 1, applied to q and k alike
    return 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0


def llama3_inv_freq(dim, base, factor, original_len, low_freq_factor=1.0, high_freq_factor=4.0):
    # Llama 3.1, numerics as transformers' _compute_llama3_parameters: wavelengths longer than
    # L / low_freq_factor are interpolated (PI), shorter than L / high_freq_factor kept, and in between
    # a blend linear in the rotation count L / wavelen (continuous at both ends)
    inv_freq = default_inv_freq(dim, base)
    wavelen = 2 * math.pi / inv_freq
    smooth = (original_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    scaled = torch.where(wavelen > original_len / low_freq_factor, inv_freq / factor, blended)
    return torch.where(wavelen < original_len / high_freq_factor, inv_freq, scaled)


def is_number(x):
    # True is an int to Python, NaN slips past `x < 1` checks, inf leaves no frequency: none is a setting
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


def scaling_type(scaling):
    # transformers' older configs name the key "type"
    return (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))


def check_scaling(scaling):
    """Validate a rope_scaling dict (at the boundary: a config, a command's options); returns (rope_type,
    factor). Raises ValueError naming what is wrong."""
    if scaling is None:
        return "default", 1.0
    if not isinstance(scaling, dict):
        raise ValueError(f"rope_scaling must be a dict or None, got {scaling!r}; e.g. {EXAMPLE}")
    rope_type = scaling_type(scaling)
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"unknown rope_type {rope_type!r}; allowed: {', '.join(ROPE_TYPES)}")
    factor = scaling.get("factor", 1.0)
    if not is_number(factor) or factor < 1:
        raise ValueError(f"rope_scaling factor must be a number >= 1, got {factor!r}")
    theta = scaling.get("rope_theta")
    if theta is not None and not (is_number(theta) and theta > 1):
        raise ValueError(f"rope_theta (the RoPE base) must be a number > 1, got {theta!r}")
    attention = scaling.get("attention_factor")
    if attention is not None and not (is_number(attention) and attention > 0):
        raise ValueError(f"attention_factor must be a number > 0, got {attention!r}")
    if rope_type in ("dynamic", "yarn", "llama3") and not scaling.get("original_max_position_embeddings"):
        raise ValueError(f"rope_type {rope_type!r} needs 'original_max_position_embeddings' (the training length)")
    low, high = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
    if rope_type == "llama3" and not (is_number(low) and is_number(high) and high > low > 0):
        raise ValueError(f"llama3 needs high_freq_factor > low_freq_factor > 0, "
                         f"got high_freq_factor={high!r}, low_freq_factor={low!r}")
    return rope_type, float(factor)


def rotating_pairs(head_dim, fraction):
    """p-RoPE (Barbero et al. 2024): how many of the head_dim / 2 pairs rotate, round(fraction * head_dim / 2)
    (Python's round), the highest frequencies; None is plain RoPE, every pair."""
    if fraction is None:
        return head_dim // 2
    if not (is_number(fraction) and 0 < fraction <= 1):
        raise ValueError(f"rope_fraction must be a number in (0, 1] (or None: every pair rotates), got {fraction!r}")
    n = round(fraction * (head_dim // 2))
    if n < 1:
        raise ValueError(f"rope_fraction={fraction!r} rotates round({fraction!r} * {head_dim // 2}) = 0 of the "
                         f"{head_dim // 2} pairs; use at least {1 / (head_dim // 2):.3g} (or pos_emb='none')")
    return n


def rope_frequencies(head_dim, base, scaling=None, seq_len=None, fraction=None):
    """(inv_freq [head_dim // 2] float32, attention_factor) for a rope_scaling dict.
    seq_len is the length of the sequence being processed; only `dynamic` uses it. A "rope_theta" in the dict
    (transformers v5 rope_parameters) replaces `base`. fraction: p-RoPE's share of rotating pairs (None: all).
    The dict is trusted: check_scaling validates it where it comes in."""
    rope_type, factor = scaling_type(scaling), float((scaling or {}).get("factor", 1.0))
    base = (scaling or {}).get("rope_theta") or base
    attention_factor = 1.0
    if rope_type == "default":
        inv_freq = default_inv_freq(head_dim, base)
    elif rope_type == "linear":
        inv_freq = linear_inv_freq(head_dim, base, factor)
    elif rope_type == "ntk":
        inv_freq = ntk_inv_freq(head_dim, base, factor)
    elif rope_type == "dynamic":
        inv_freq = dynamic_inv_freq(head_dim, base, factor, scaling["original_max_position_embeddings"], seq_len)
    elif rope_type == "llama3":
        inv_freq = llama3_inv_freq(head_dim, base, factor, scaling["original_max_position_embeddings"],
                                   scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0))
    else:  # yarn; "attention_factor": 1.0 makes it NTK-by-parts (no temperature)
        inv_freq = yarn_inv_freq(head_dim, base, factor, scaling["original_max_position_embeddings"],
                                 scaling.get("beta_fast") or 32.0, scaling.get("beta_slow") or 1.0,
                                 scaling.get("truncate", True))
        # validated > 0 when given, so only a missing one falls back to YaRN's temperature
        attention_factor = scaling.get("attention_factor") or yarn_attention_factor(factor)
    # p-RoPE: scaled as full RoPE (every rotating pair gets what it gets there), then the lowest pairs set to 0:
    # an unrotated pair carries no position to scale. YaRN's temperature is for the whole logit, so it stays.
    inv_freq[rotating_pairs(head_dim, fraction):] = 0
    return inv_freq.float(), float(attention_factor)


def rope_cos_sin(inv_freq, positions, attention_factor=1.0, layout="half"):
    """Per-channel tables [..., len(positions), head_dim] in float32 for apply_rope, scaled by the attention
    factor: the cosine of each channel's pair angle, and the sine signed for the channel's place in its pair
    (-sin on the pair's first channel, +sin on its second). inv_freq may carry leading dims (one frequency
    set per query, for exact causal dynamic NTK). layout as in apply_rope."""
    angles = positions.float()[:, None] * inv_freq.unsqueeze(-2).float()
    cos, sin = angles.cos() * attention_factor, angles.sin() * attention_factor
    if layout == "half":
        return torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1)
    return torch.stack((cos, cos), dim=-1).flatten(-2), torch.stack((-sin, sin), dim=-1).flatten(-2)


def apply_rope(x, cos, sin, layout="half"):
    """Rotate each channel pair (a, b) of x [..., T, head_dim] by +angle (the textbook direction):
    (a cos - b sin, a sin + b cos), as x * cos + (x with each pair swapped) * sin, with the tables of
    rope_cos_sin (two multiplies and an add; cheaper forward and backward than splitting the pairs).
    half: pairs (x_i, x_{i+d/2}) as GPT-NeoX / HF LLaMA; interleaved: (x_2i, x_2i+1) as GPT-J / Meta LLaMA."""
    if layout == "half":
        swapped = x.roll(x.size(-1) // 2, dims=-1)  # (x2, x1): one op, forward and backward
    else:
        swapped = torch.stack((x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)
    return x * cos.to(x.dtype) + swapped * sin.to(x.dtype)
