"""
Rotary position embeddings (RoPE): frequencies, the scaling methods, cos/sin tables and the rotation.

Scaling is a Hugging Face style dict (`transformers`' `config.rope_scaling`, or its v5 `config.rope_parameters`),
e.g. {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 256}, with transformers' numerics.
Every type takes COMMON_KEYS: "rope_type" (legacy "type"), "rope_theta" (v5: the base), the training length
"original_max_position_embeddings" (a config fills in its block_size) and "partial_rotary_factor" p: only the rotary
dim d' = int(p * d) rotates, at base^(-2i/d'); the other pairs get frequency 0 (`interleaved`: the first d' channels,
as GPT-J; `half`: [0, d'/2) and [d/2, d/2 + d'/2), GPT-NeoX's first d' up to a fixed channel permutation). A type also
takes the keys transformers' rope utilities read for it (KEYS); any other key is an error (transformers only warns).
The attention factor multiplies cos and sin of the rotary dims, as in `transformers`, so their logits get its square;
NTK-by-parts is YaRN without it ("attention_factor": 1.0). References: PI (Chen et al. 2023), NTK-aware (bloc97 2023),
YaRN (Peng et al. 2023), LongRoPE (Ding et al. 2024), Llama 3.1 (Meta 2024), p-RoPE (rotating_pairs: Barbero et al.,
"Round and Round We Go! What makes Rotary Positional Encodings useful?", 2024), proportional RoPE (Gemma 4).
"""
import math
import numbers

import torch

COMMON_KEYS = ("rope_type", "type", "rope_theta", "partial_rotary_factor", "original_max_position_embeddings")
KEYS = {"default": (), "linear": ("factor",), "ntk": ("factor",), "dynamic": ("factor",),  # and COMMON_KEYS
        "yarn": ("factor", "attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate"),
        "longrope": ("short_factor", "long_factor", "factor", "attention_factor"),
        "llama3": ("factor", "low_freq_factor", "high_freq_factor"), "proportional": ("factor",)}
ROPE_TYPES = tuple(KEYS)  # "ntk" is this repo's static NTK-aware, not a transformers type
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


def yarn_attention_factor(factor, mscale=None, mscale_all_dim=None):
    # YaRN's sqrt(1/t) = 0.1 m ln(s) + 1 (m = 1 in the paper). As transformers: both m's given (DeepSeek-V2/V3), their
    # ratio (1 when equal: DeepSeek's attention scales its softmax by the denominator^2 itself); one alone is ignored
    def temperature(m):
        return 0.1 * m * math.log(factor) + 1.0 if factor > 1 else 1.0
    return temperature(mscale) / temperature(mscale_all_dim) if mscale and mscale_all_dim else temperature(1.0)


def longrope_inv_freq(dim, base, short_factor, long_factor, original_len, seq_len):
    # LongRoPE (Phi-3): a searched interpolation factor per pair, the short set up to the original length and the
    # long set past it (transformers switches on the length of the forward, as `dynamic` does)
    factors = long_factor if seq_len and seq_len > original_len else short_factor
    return default_inv_freq(dim, base) / torch.tensor(factors, dtype=torch.float64)


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


def check_scaling(scaling, head_dim=None):
    """Validate a rope_scaling dict (at the boundary: a config, a command's options); returns (rope_type,
    factor). With head_dim also the rotary dimension and longrope's lists. Raises ValueError naming what is wrong."""
    if scaling is None:
        return "default", 1.0
    if not isinstance(scaling, dict):
        raise ValueError(f"rope_scaling must be a dict or None, got {scaling!r}; e.g. {EXAMPLE}")
    rope_type = scaling_type(scaling)
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"unknown rope_type {rope_type!r}; allowed: {', '.join(ROPE_TYPES)}")
    unknown = [key for key in scaling if key not in COMMON_KEYS + KEYS[rope_type]]
    if unknown:  # transformers warns and ignores it: a key ignored is a silent wrong number
        raise ValueError(f"rope_scaling key {unknown[0]!r} is not one rope_type {rope_type!r} uses; "
                         f"allowed: {', '.join(COMMON_KEYS + KEYS[rope_type])}")
    if rope_type in ("linear", "ntk", "dynamic", "yarn", "llama3") and "factor" not in scaling:
        raise ValueError(f"rope_type {rope_type!r} needs 'factor'")  # transformers: a missing required key
    factor = scaling.get("factor", 1.0)
    if not is_number(factor) or factor < 1:
        raise ValueError(f"rope_scaling factor must be a number >= 1, got {factor!r}")
    theta = scaling.get("rope_theta")
    if theta is not None and not (is_number(theta) and theta > 1):
        raise ValueError(f"rope_theta (the RoPE base) must be a number > 1, got {theta!r}")
    attention = scaling.get("attention_factor")
    if attention is not None and not (is_number(attention) and attention > 0):
        raise ValueError(f"attention_factor must be a number > 0, got {attention!r}")
    for key in ("beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate"):  # None: transformers' default
        value, flag = scaling.get(key), key == "truncate"  # YaRN's ramp bounds: whole pairs (True) or exact
        if value is not None and not (isinstance(value, bool) if flag else is_number(value)):
            raise ValueError(f"{key} must be {'True or False' if flag else 'a number'}, got {value!r}")
    for key in ("beta_fast", "beta_slow"):  # a number of rotations over L: its log is taken
        if scaling.get(key) is not None and not scaling[key] > 0:
            raise ValueError(f"{key} must be a number > 0 (rotations over the original length), got {scaling[key]!r}")
    for key in ("mscale", "mscale_all_dim"):  # below 0 the attention temperature can turn negative: logits flipped
        if scaling.get(key) is not None and not scaling[key] >= 0:
            raise ValueError(f"{key} must be a number >= 0, got {scaling[key]!r}")
    original = scaling.get("original_max_position_embeddings")
    if rope_type in ("dynamic", "yarn", "longrope", "llama3") and original is None:
        raise ValueError(f"rope_type {rope_type!r} needs 'original_max_position_embeddings' (the training length)")
    if original is not None and (isinstance(original, bool) or not isinstance(original, numbers.Integral) or original < 1):
        raise ValueError(f"original_max_position_embeddings must be an integer >= 1 (the training length), got {original!r}")
    low, high = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
    if rope_type == "llama3" and not (is_number(low) and is_number(high) and high >= low > 0):  # Llama 4: equal
        raise ValueError(f"llama3 needs high_freq_factor >= low_freq_factor > 0, "
                         f"got high_freq_factor={high!r}, low_freq_factor={low!r}")
    if rope_type == "longrope" and "factor" not in scaling and attention is None:
        raise ValueError("longrope needs 'factor' (its attention factor's s: config.json's max_position_embeddings / "
                         "original_max_position_embeddings) or 'attention_factor'")
    partial = scaling.get("partial_rotary_factor", 1.0)
    if not (is_number(partial) and 0 < partial <= 1):
        raise ValueError(f"partial_rotary_factor must be a number in (0, 1], got {partial!r}")
    dim = int(head_dim * partial) if head_dim else None
    if dim is not None and rope_type != "proportional" and (dim < 2 or dim % 2):
        raise ValueError(f"partial_rotary_factor={partial!r}: rotary dim int({head_dim} * p) = {dim}, odd or 0")
    for key in ("short_factor", "long_factor") if rope_type == "longrope" else ():
        values, n = scaling.get(key), dim // 2 if dim else "rotary dim / 2"
        if not (isinstance(values, (list, tuple)) and all(is_number(v) and v > 0 for v in values)
                and len(values) == (n if dim else len(values))):
            raise ValueError(f"longrope's {key} must be a list of {n} numbers > 0 (one a pair), got {str(values)[:50]}")
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


def rope_frequencies(head_dim, base, scaling=None, seq_len=None, fraction=None):
    """(inv_freq [head_dim // 2] float32, attention_factor) for a rope_scaling dict.
    seq_len is the length of the sequence being processed; `dynamic` and `longrope` use it. A "rope_theta" in the dict
    (transformers v5 rope_parameters) replaces `base`. fraction: p-RoPE's share of rotating pairs (None: all); with a
    partial_rotary_factor too, a pair rotates only if both let it. The dict is trusted: check_scaling validates it."""
    scaling = scaling or {}
    rope_type, factor = scaling_type(scaling), float(scaling.get("factor", 1.0))
    base, partial = scaling.get("rope_theta") or base, scaling.get("partial_rotary_factor", 1.0)
    # transformers' rotary dim d' = int(head_dim * partial_rotary_factor): every formula runs over it, not head_dim
    dim, original_len = int(head_dim * partial), scaling.get("original_max_position_embeddings")
    attention_factor = 1.0
    if rope_type == "default":
        inv_freq = default_inv_freq(dim, base)
    elif rope_type == "linear":
        inv_freq = linear_inv_freq(dim, base, factor)
    elif rope_type == "ntk":
        inv_freq = ntk_inv_freq(dim, base, factor)
    elif rope_type == "dynamic":
        inv_freq = dynamic_inv_freq(dim, base, factor, original_len, seq_len)
    elif rope_type == "llama3":
        inv_freq = llama3_inv_freq(dim, base, factor, original_len,
                                   scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0))
    elif rope_type == "longrope":  # temperature sqrt(1 + ln s / ln L), s: "factor" (transformers' else: max_pos / L)
        inv_freq = longrope_inv_freq(dim, base, scaling["short_factor"], scaling["long_factor"], original_len, seq_len)
        temperature = math.sqrt(1 + math.log(factor) / math.log(original_len)) if factor > 1 else 1.0
        attention_factor = scaling.get("attention_factor") or temperature
    elif rope_type == "proportional":  # Gemma 4: int(p * d // 2) pairs at the full head's frequencies, then PI
        inv_freq = linear_inv_freq(head_dim, base, factor)
        inv_freq[int(partial * head_dim // 2):] = 0
    else:  # yarn; "attention_factor": 1.0 makes it NTK-by-parts (no temperature)
        inv_freq = yarn_inv_freq(dim, base, factor, original_len, scaling.get("beta_fast") or 32.0,
                                 scaling.get("beta_slow") or 1.0, scaling.get("truncate", True))
        # validated > 0 when given, so only a missing one falls back to YaRN's temperature
        attention_factor = scaling.get("attention_factor") or yarn_attention_factor(
            factor, scaling.get("mscale"), scaling.get("mscale_all_dim"))
    # pairs past the rotary dim pass through (frequency 0); p-RoPE: scaled as full RoPE, then the lowest pairs set to 0
    # (no position to scale there), which keep YaRN's temperature (the whole logit's; see pair_attention)
    inv_freq = torch.cat((inv_freq, inv_freq.new_zeros(head_dim // 2 - len(inv_freq))))
    inv_freq[rotating_pairs(head_dim, fraction):] = 0
    return inv_freq.float(), float(attention_factor)


def pair_attention(head_dim, scaling, attention_factor):
    """The attention factor per pair [head_dim // 2] for rope_cos_sin: transformers scales only the rotary dims' cos
    and sin, so partial_rotary_factor's other pairs keep 1 (p-RoPE's unrotated pairs keep it: the whole logit's)."""
    rotary = int(head_dim * (scaling or {}).get("partial_rotary_factor", 1.0)) // 2
    return torch.tensor([attention_factor] * rotary + [1.0] * (head_dim // 2 - rotary))


def rope_cos_sin(inv_freq, positions, attention_factor=1.0, layout="half"):
    """Per-channel tables [..., len(positions), head_dim] in float32 for apply_rope, scaled by the attention
    factor (a number, or one per pair: pair_attention): the cosine of each channel's pair angle, and the sine
    signed for the channel's place in its pair (-sin on the pair's first channel, +sin on its second). inv_freq
    may carry leading dims (one frequency set per query, for exact causal dynamic NTK). layout as in apply_rope."""
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
