"""Rotary position embeddings (RoPE): frequencies, the scaling methods, cos/sin tables and the rotation.
Scaling is a Hugging Face style dict (`rope_scaling`), e.g. {"rope_type": "yarn", "factor": 8.0,
"original_max_position_embeddings": 256}, with transformers' numerics. References: PI (Chen et al. 2023),
NTK-aware (bloc97 2023), YaRN (Peng et al. 2023), LongRoPE (Ding et al. 2024), Llama 3.1 (Meta 2024), p-RoPE
(Barbero et al. 2024), Gemma 4's proportional."""
import math
from typing import Callable, NamedTuple

import torch

ORIGINAL = "original_max_position_embeddings"
COMMON_KEYS = ("rope_type", "type", "rope_theta", "partial_rotary_factor", ORIGINAL)
LAYOUTS = ("half", "interleaved")
YARN_BETAS = {"beta_fast": 32.0, "beta_slow": 1.0}  # transformers' defaults, in rotations over the original L


def default_inv_freq(dim, base):
    # inv_freq_i = base^(-2i/d), i = 0 .. d/2-1; float64 so scaled variants don't lose digits
    return 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)


def factor_of(scaling):
    return float(scaling.get("factor", 1.0))


# one function per rope type: (dim, base, scaling, seq_len) -> (inv_freq [dim // 2], attention factor)

def unscaled(dim, base, scaling, seq_len):
    return default_inv_freq(dim, base), 1.0


def linear(dim, base, scaling, seq_len):  # Position Interpolation: position m becomes m / factor
    return default_inv_freq(dim, base) / factor_of(scaling), 1.0


def ntk(dim, base, scaling, seq_len):
    # NTK-aware: the base stretched so the lowest frequency is interpolated by `factor`, the highest kept
    return default_inv_freq(dim, base * factor_of(scaling) ** (dim / (dim - 2))), 1.0


def dynamic(dim, base, scaling, seq_len):
    # as transformers: `factor` is an extra NTK multiplier a (1: plain); the scale follows the length
    factor, original_len = factor_of(scaling), scaling[ORIGINAL]
    if seq_len is None or seq_len <= original_len:
        return default_inv_freq(dim, base), 1.0
    scale = factor * seq_len / original_len - (factor - 1)
    return default_inv_freq(dim, base * scale ** (dim / (dim - 2))), 1.0


def yarn_correction_dim(num_rotations, dim, base, original_len):  # the pair turning num_rotations times
    return dim * math.log(original_len / (num_rotations * 2 * math.pi)) / (2 * math.log(base))


def yarn_inv_freq(dim, base, factor, original_len, beta_fast=32.0, beta_slow=1.0, truncate=True):
    # NTK-by-parts: pairs turning more than beta_fast times over the original context keep their frequency,
    # those turning fewer than beta_slow times are interpolated (PI), a ramp in the pair index between
    low = yarn_correction_dim(beta_fast, dim, base, original_len)
    high = yarn_correction_dim(beta_slow, dim, base, original_len)
    if truncate:  # the ramp widened to whole pairs (default); "truncate": False keeps exact bounds
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # avoid 0/0, as transformers does
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extrapolated = default_inv_freq(dim, base)
    return extrapolated * (1 - ramp) + (extrapolated / factor) * ramp


def yarn_attention_factor(factor, mscale=None, mscale_all_dim=None):
    # YaRN's sqrt(1/t) = 0.1 m ln(s) + 1 (paper: m = 1). As transformers: both m's given (DeepSeek-V2/3),
    # their ratio (1 when equal: DeepSeek scales its softmax by the denominator^2 itself); one alone ignored
    def temperature(m):
        return 0.1 * m * math.log(factor) + 1.0 if factor > 1 else 1.0
    return temperature(mscale) / temperature(mscale_all_dim) if mscale and mscale_all_dim else temperature(1)


def yarn(dim, base, scaling, seq_len):
    # "attention_factor": 1.0 makes it NTK-by-parts (no temperature); none given: YaRN's temperature
    s, get = factor_of(scaling), scaling.get
    betas = [get(key) or default for key, default in YARN_BETAS.items()]
    inv_freq = yarn_inv_freq(dim, base, s, scaling[ORIGINAL], *betas, get("truncate", True))
    return inv_freq, get("attention_factor") or yarn_attention_factor(s, get("mscale"), get("mscale_all_dim"))


def longrope(dim, base, scaling, seq_len):
    # LongRoPE (Phi-3): a searched factor per pair, the short set up to the original length, the long past it
    # (on the forward's length, as transformers). Temperature sqrt(1 + ln s / ln L) unless attention_factor
    s, original_len = factor_of(scaling), scaling[ORIGINAL]
    factors = scaling["long_factor"] if seq_len and seq_len > original_len else scaling["short_factor"]
    temperature = math.sqrt(1 + math.log(s) / math.log(original_len)) if s > 1 else 1.0
    return (default_inv_freq(dim, base) / torch.tensor(factors, dtype=torch.float64),
            scaling.get("attention_factor") or temperature)


def llama3(dim, base, scaling, seq_len):
    # Llama 3.1 (as transformers): wavelengths longer than L / low_freq_factor are interpolated (PI), shorter
    # than L / high_freq_factor kept, in between a blend linear in L / wavelen (continuous at both ends)
    factor, original_len, get = factor_of(scaling), scaling[ORIGINAL], scaling.get
    low_freq_factor, high_freq_factor = get("low_freq_factor", 1.0), get("high_freq_factor", 4.0)
    inv_freq = default_inv_freq(dim, base)
    wavelen = 2 * math.pi / inv_freq
    smooth = (original_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    scaled = torch.where(wavelen > original_len / low_freq_factor, inv_freq / factor, blended)
    return torch.where(wavelen < original_len / high_freq_factor, inv_freq, scaled), 1.0


class RopeType(NamedTuple):
    init: Callable
    keys: tuple = ()  # the keys it reads beyond COMMON_KEYS
    required: tuple = ()
    follows_length: bool = False  # its frequencies follow the length of the forward
    whole_head: bool = False  # it runs over the whole head (Gemma 4's proportional)


ROPE_TYPES = {  # "ntk" is this repo's static NTK-aware, not a transformers type
    "default": RopeType(unscaled),
    "linear": RopeType(linear, ("factor",), ("factor",)),
    "ntk": RopeType(ntk, ("factor",), ("factor",)),
    "dynamic": RopeType(dynamic, ("factor",), ("factor", ORIGINAL), follows_length=True),
    "yarn": RopeType(yarn, ("factor", "attention_factor", *YARN_BETAS, "mscale", "mscale_all_dim",
                            "truncate"), ("factor", ORIGINAL)),
    "longrope": RopeType(longrope, ("short_factor", "long_factor", "factor", "attention_factor"), (ORIGINAL,),
                         follows_length=True),
    "llama3": RopeType(llama3, ("factor", "low_freq_factor", "high_freq_factor"), ("factor", ORIGINAL)),
    # Gemma 4: int(p * d // 2) pairs at the whole head's frequencies, then PI
    "proportional": RopeType(linear, ("factor",), whole_head=True),
}


def scaling_type(scaling):  # transformers' older configs name the key "type"
    scaling = scaling or {}
    return scaling.get("rope_type", scaling.get("type", "default"))


def complete_scaling(scaling, trained, block_size):
    # `scaling` (None: the trained one) with, unless set, its original length block_size (as transformers) and
    # the trained dict's rope_theta and partial_rotary_factor (v5 keeps the model's in the dict)
    own = {k: trained[k] for k in ("rope_theta", "partial_rotary_factor") if k in (trained or {})}
    scaling = scaling or trained
    return None if scaling is None else {ORIGINAL: block_size, **own, **scaling}


def rotating_pairs(head_dim, fraction):
    # p-RoPE: the highest round(fraction * head_dim / 2) frequencies rotate (None: every pair)
    return head_dim // 2 if fraction is None else round(fraction * (head_dim // 2))


def rope_frequencies(head_dim, base, scaling=None, seq_len=None, fraction=None, slowdown=1):
    """(inv_freq [head_dim // 2] float32, attention_factor) at seq_len tokens. fraction: p-RoPE's share of
    rotating pairs (a pair rotates if it and partial_rotary_factor both let it); slowdown: every frequency
    divided by it, in float64 as the scaling methods divide."""
    scaling = scaling or {}
    kind = ROPE_TYPES[scaling_type(scaling)]
    # transformers' rotary dim d' = int(head_dim * partial_rotary_factor) rotates at base^(-2i/d')
    rotary = int(head_dim * scaling.get("partial_rotary_factor", 1.0))
    base = scaling.get("rope_theta") or base
    inv_freq, attention_factor = kind.init(head_dim if kind.whole_head else rotary, base, scaling, seq_len)
    # pairs past the rotary dim pass through (frequency 0); p-RoPE: scaled as full RoPE, then its lowest pairs
    # set to 0 (no position to scale there; they keep YaRN's temperature, the whole logit's)
    inv_freq = torch.cat((inv_freq, inv_freq.new_zeros(head_dim // 2 - len(inv_freq))))
    inv_freq[rotary // 2:] = 0
    inv_freq[rotating_pairs(head_dim, fraction):] = 0
    return (inv_freq / slowdown).float(), float(attention_factor)


def frequencies(config, scaling=None, seq_len=None, slowdown=1):
    # a GPTConfig's, under a method's scaling (None: the trained one), completed here, once
    full = complete_scaling(scaling, config.rope_scaling, config.block_size)
    return rope_frequencies(config.head_dim, config.rope_base, full, seq_len, config.rope_fraction, slowdown)


def rope_tables(config, scaling, seq_len, positions, slowdown=1):
    inv_freq, attention_factor = frequencies(config, scaling, seq_len, slowdown)
    attention = pair_attention(config, attention_factor).to(positions.device)
    return rope_cos_sin(inv_freq.to(positions.device), positions, attention, config.rope_layout)


def pair_attention(config, attention_factor):
    # transformers scales only the rotary dims' cos and sin: partial_rotary_factor's other pairs keep 1
    # (p-RoPE's unrotated pairs keep the factor: it is the whole logit's)
    rotary = config.rotary_dim // 2
    return torch.tensor([attention_factor] * rotary + [1.0] * (config.head_dim // 2 - rotary))


def rope_cos_sin(inv_freq, positions, attention_factor=1.0, layout="half"):
    """float32 tables [..., len(positions), head_dim] for apply_rope, times the attention factor (logits get
    its square): each pair angle's cosine, and its sine signed -/+ on its first/second channel. inv_freq
    may carry leading dims (a frequency set per query: exact causal dynamic NTK)."""
    angles = positions.float()[:, None] * inv_freq.unsqueeze(-2).float()
    cos, sin = angles.cos() * attention_factor, angles.sin() * attention_factor
    if layout == "half":
        return torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1)
    return torch.stack((cos, cos), dim=-1).flatten(-2), torch.stack((-sin, sin), dim=-1).flatten(-2)


def apply_rope(x, cos, sin, layout="half"):
    """Rotate each channel pair (a, b) of x [..., T, head_dim] by +angle (the textbook direction) to
    (a cos - b sin, a sin + b cos), as x * cos + (x with each pair swapped) * sin: two multiplies and an add.
    half: pairs (x_i, x_{i+d/2}) as GPT-NeoX / HF LLaMA; interleaved: (x_2i, x_2i+1) as GPT-J / Meta LLaMA."""
    if layout == "half":
        swapped = x.roll(x.size(-1) // 2, dims=-1)  # (x2, x1): one op, forward and backward
    else:
        swapped = torch.stack((x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)
    return x * cos.to(x.dtype) + swapped * sin.to(x.dtype)
