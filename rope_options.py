"""RoPE's settings off by default, checked where a config or checkpoint brings them in (config.gpt_config): a
Hugging Face rope_scaling dict, p-RoPE's rope_fraction, iRoPE's nope_every and RNoPE-SWA's rope_window."""
import numbers

from common import MAX_FACTOR, UserError
from config import is_number
from rope import COMMON_KEYS, ORIGINAL, ROPE_TYPES, complete_scaling, scaling_type


def check_rope_options(c):  # c: a GPTConfig whose other fields gpt_config checked
    if c.rope_scaling is not None and c.pos_emb != "rope":  # it would train and be stored, unused
        raise UserError(f"rope_scaling={c.rope_scaling!r} given to pos_emb={c.pos_emb!r}: "
                        f"{'ALiBi' if c.pos_emb == 'alibi' else 'it'} has no rotation to scale; remove "
                        "rope_scaling or use pos_emb='rope'")
    if c.rope_fraction is not None and c.pos_emb != "rope":
        raise UserError(f"rope_fraction={c.rope_fraction!r} is p-RoPE's; it needs pos_emb='rope', "
                        f"not {c.pos_emb!r}")
    for key in ("nope_every", "rope_window"):
        if (value := getattr(c, key)) is not None and (type(value) is not int or value < 1):
            raise UserError(f"{key} must be an integer >= 1 (or None), got {value!r}")
        if value is not None and c.pos_emb != "rope":
            raise UserError(f"{key}={value!r} sets the layers of a RoPE model (iRoPE, RNoPE-SWA); it needs "
                            f"pos_emb='rope', not {c.pos_emb!r}")
    if c.pos_emb == "rope" and (fraction := c.rope_fraction) is not None:  # p-RoPE: at least one pair turns
        if not (is_number(fraction) and 0 < fraction <= 1):
            raise UserError("rope_fraction must be a number in (0, 1] (or None: every pair rotates), "
                            f"got {fraction!r}")
        if round(fraction * (pairs := c.head_dim // 2)) < 1:
            raise UserError(f"rope_fraction={fraction!r} rotates round({fraction!r} * {pairs}) = 0 of the "
                            f"{pairs} pairs; use at least {1 / pairs:.3g} (or pos_emb='none')")
    check_scaling(c.rope_scaling, c.head_dim, c.block_size)


def check_scaling(scaling, head_dim=None, block_size=None):
    """(rope_type, factor) of a rope_scaling dict, checked (head_dim: its rotary dimension too)."""
    if scaling is None:
        return "default", 1.0
    if not isinstance(scaling, dict):
        raise UserError(f"rope_scaling must be a dict or None, got {scaling!r}; "
                        f"e.g. {dict(rope_type='yarn', factor=4.0, **{ORIGINAL: 256})}")
    if block_size:
        scaling = complete_scaling(None, scaling, block_size)
    if (rope_type := scaling_type(scaling)) not in ROPE_TYPES:
        raise UserError(f"unknown rope_type {rope_type!r}; allowed: {', '.join(ROPE_TYPES)}")
    kind, get = ROPE_TYPES[rope_type], scaling.get
    if unknown := [key for key in scaling if key not in COMMON_KEYS + kind.keys]:
        # transformers warns and ignores it: a key ignored is a silent wrong number
        raise UserError(f"rope_scaling key {unknown[0]!r} is not one rope_type {rope_type!r} uses; "
                        f"allowed: {', '.join(COMMON_KEYS + kind.keys)}")
    if "factor" in kind.required and "factor" not in scaling:
        raise UserError(f"rope_type {rope_type!r} needs 'factor'")  # transformers: a missing required key
    factor = get("factor", 1.0)
    if not is_number(factor) or not 1 <= factor <= MAX_FACTOR:  # past MAX_FACTOR the math overflows
        most = f"; at most {MAX_FACTOR:g}" if factor != 1 else ""
        raise UserError(f"rope_scaling factor must be a number >= 1, got {factor!r}{most}")
    if (theta := get("rope_theta")) is not None and not (is_number(theta) and theta > 1):
        raise UserError(f"rope_theta (the RoPE base) must be a number > 1, got {theta!r}")
    # None: transformers' default; beta: its log is taken; mscale < 0 flips logits
    for key in ("attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim"):
        value, low = get(key), ">=" if key.startswith("mscale") else ">"
        if value is not None and not (is_number(value) and (value >= 0 if low == ">=" else value > 0)):
            raise UserError(f"{key} must be a number {low} 0, got {value!r}")
    if (truncate := get("truncate")) is not None and not isinstance(truncate, bool):  # YaRN's ramp
        raise UserError(f"truncate must be True or False, got {truncate!r}")
    original = get(ORIGINAL)
    if ORIGINAL in kind.required and original is None:
        raise UserError(f"rope_type {rope_type!r} needs '{ORIGINAL}' (the training length)")
    if original is not None and not (isinstance(original, numbers.Integral) and not isinstance(original, bool)
                                     and original >= 1):
        raise UserError(f"{ORIGINAL} must be an integer >= 1 (the training length), got {original!r}")
    low, high = get("low_freq_factor", 1.0), get("high_freq_factor", 4.0)  # Llama 4's are equal
    if rope_type == "llama3" and not (is_number(low) and is_number(high) and high >= low > 0):
        raise UserError(f"llama3 needs high_freq_factor >= low_freq_factor > 0, "
                        f"got high_freq_factor={high!r}, low_freq_factor={low!r}")
    if rope_type == "longrope" and "factor" not in scaling and get("attention_factor") is None:
        raise UserError("longrope needs 'factor' (its attention factor's s: config.json's "
                        f"max_position_embeddings / {ORIGINAL}) or 'attention_factor'")
    if not (is_number(partial := get("partial_rotary_factor", 1.0)) and 0 < partial <= 1):
        raise UserError(f"partial_rotary_factor must be a number in (0, 1], got {partial!r}")
    dim = int(head_dim * partial) if head_dim else None
    if dim is not None and not kind.whole_head and (dim < 2 or dim % 2):
        raise UserError(f"partial_rotary_factor={partial!r}: rotary dim int({head_dim} * p) = {dim}, "
                        "odd or 0")
    for key in ("short_factor", "long_factor") if rope_type == "longrope" else ():
        values, n = get(key), dim // 2 if dim else "rotary dim / 2"
        if not (isinstance(values, (list, tuple)) and all(is_number(v) and v > 0 for v in values)
                and len(values) == (n if dim else len(values))):
            raise UserError(f"longrope's {key} must be a list of {n} numbers > 0 (one a pair), got "
                            f"{str(values)[:50]}")
    return rope_type, float(factor)
