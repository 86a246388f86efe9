"""
Rotary position embeddings (RoPE): frequencies, the scaling methods, cos/sin tables and the rotation.

Scaling is a Hugging Face style dict (the keys `transformers` uses in `config.rope_scaling`), e.g.
    {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 256}
Each method is one small function returning (inv_freq, attention_factor); the attention factor
multiplies both cos and sin, as in `transformers`, so attention logits get its square.
References: PI (Chen et al. 2023), NTK-aware (bloc97 2023), YaRN (Peng et al. 2023).
"""
import math

import torch

ROPE_TYPES = ("default", "linear", "ntk", "dynamic", "yarn")
LAYOUTS = ("half", "interleaved")


def default_inv_freq(dim, base):
    # inv_freq_i = base^(-2i/d), i = 0 .. d/2-1; float64 so scaled variants don't lose digits
    return 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)


def linear_inv_freq(dim, base, factor):
    # Position Interpolation: position m becomes m / factor
    return default_inv_freq(dim, base) / factor


def ntk_inv_freq(dim, base, factor):
    # NTK-aware: stretch the base so the lowest frequency is interpolated by `factor`
    # while the highest is (almost) untouched
    return default_inv_freq(dim, base * factor ** (dim / (dim - 2)))


def dynamic_inv_freq(dim, base, factor, original_len, seq_len):
    # Dynamic NTK, numerics as in transformers: `factor` is an extra NTK multiplier `a`
    # (a = 1 is plain dynamic NTK), the scale follows the current length.
    if seq_len is None or seq_len <= original_len:
        return default_inv_freq(dim, base)
    scale = factor * seq_len / original_len - (factor - 1)
    return default_inv_freq(dim, base * scale ** (dim / (dim - 2)))


def yarn_correction_dim(num_rotations, dim, base, original_len):
    # the pair index whose wavelength fits `num_rotations` times into the original context
    return dim * math.log(original_len / (num_rotations * 2 * math.pi)) / (2 * math.log(base))


def yarn_inv_freq(dim, base, factor, original_len, beta_fast=32.0, beta_slow=1.0):
    # NTK-by-parts: pairs that rotate more than beta_fast times over the original context keep their
    # frequency (extrapolate), pairs rotating less than beta_slow times are interpolated (PI),
    # linear ramp in the pair index between them (as the YaRN authors' code and transformers do).
    low = max(math.floor(yarn_correction_dim(beta_fast, dim, base, original_len)), 0)
    high = min(math.ceil(yarn_correction_dim(beta_slow, dim, base, original_len)), dim - 1)
    if low == high:
        high += 0.001  # avoid 0/0, as transformers does
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extrapolated = default_inv_freq(dim, base)
    return extrapolated * (1 - ramp) + (extrapolated / factor) * ramp


def yarn_attention_factor(factor):
    # sqrt(1/t) = 0.1 ln(s) + 1, applied to q and k alike
    return 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0


def check_scaling(scaling):
    """Validate a rope_scaling dict; returns (rope_type, factor). Raises ValueError naming what is wrong."""
    if scaling is None:
        return "default", 1.0
    if not isinstance(scaling, dict):
        raise ValueError(f"rope_scaling must be a dict or None, got {scaling!r}")
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"unknown rope_type {rope_type!r}; allowed: {', '.join(ROPE_TYPES)}")
    factor = scaling.get("factor", 1.0)
    if not isinstance(factor, (int, float)) or factor < 1:
        raise ValueError(f"rope_scaling factor must be a number >= 1, got {factor!r}")
    if rope_type in ("dynamic", "yarn") and not scaling.get("original_max_position_embeddings"):
        raise ValueError(f"rope_type {rope_type!r} needs 'original_max_position_embeddings' (the training length)")
    return rope_type, float(factor)


def rope_frequencies(head_dim, base, scaling=None, seq_len=None):
    """(inv_freq [head_dim // 2] float32, attention_factor) for a rope_scaling dict.
    seq_len is the length of the sequence being processed; only `dynamic` uses it."""
    if head_dim % 2:
        raise ValueError(f"RoPE needs an even head dimension, got head_dim={head_dim}")
    rope_type, factor = check_scaling(scaling)
    attention_factor = 1.0
    if rope_type == "default":
        inv_freq = default_inv_freq(head_dim, base)
    elif rope_type == "linear":
        inv_freq = linear_inv_freq(head_dim, base, factor)
    elif rope_type == "ntk":
        inv_freq = ntk_inv_freq(head_dim, base, factor)
    elif rope_type == "dynamic":
        inv_freq = dynamic_inv_freq(head_dim, base, factor, scaling["original_max_position_embeddings"], seq_len)
    else:  # yarn
        inv_freq = yarn_inv_freq(head_dim, base, factor, scaling["original_max_position_embeddings"],
                                 scaling.get("beta_fast") or 32.0, scaling.get("beta_slow") or 1.0)
        attention_factor = scaling.get("attention_factor") or yarn_attention_factor(factor)
    return inv_freq.float(), float(attention_factor)


def rope_cos_sin(inv_freq, positions, attention_factor=1.0):
    """cos/sin tables [..., len(positions), head_dim // 2], in float32, scaled by the attention factor.
    inv_freq may carry leading dims (one frequency set per query, for exact causal dynamic NTK)."""
    angles = positions.float()[:, None] * inv_freq.unsqueeze(-2).float()
    return angles.cos() * attention_factor, angles.sin() * attention_factor


def apply_rope(x, cos, sin, layout="half"):
    """Rotate each channel pair of x [..., T, head_dim] by +angle (the textbook direction).
    half: pairs (x_i, x_{i+d/2}) as GPT-NeoX / HF LLaMA; interleaved: (x_2i, x_2i+1) as GPT-J / Meta LLaMA."""
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    if layout == "half":
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
