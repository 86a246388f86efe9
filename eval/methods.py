"""The position methods every command shares: for each name its model.Method and the encodings it applies to
(docs/methodology.md). Nothing else in the repository decides any of this. `crop` is truncation for every encoding:
Method(crop=L), which the scorers and generation apply by cutting the input (Method.kept)."""
import math

from model import Method
from runtime import UserError, number

METHODS = ("none", "crop", "window", "sinks", "pi", "ntk", "dynamic-ntk", "yarn", "ntk-by-parts", "llama3", "logn",
           "ntk+logn", "self-extend", "rerope", "crop-L", "leaky-rerope", "pairs")
FIXED = METHODS[:-3]  # the default list; crop-L equals crop but for a fine-tune, leaky-rerope is the lab's, pairs takes --pair_factors
ANY_ENCODING = ("none", "crop", "crop-L", "logn")  # act on the input or on attention; the others need relative positions
MASKS = ("window", "sinks")  # masks over positions past L: for RoPE, ALiBi and NoPE, whose positions are relative
SINKS = 4  # StreamingLLM's number of attention sinks (Xiao et al. 2023)
EXTEND = ("self-extend", "rerope", "leaky-rerope")  # exact positions within a neighbour window, grouped, clipped or slowed beyond it
# A method's settings, given as name:key=value[:key=value] (yarn:beta_fast=4): what the regime study tunes. None: the
# method's own rule (the neighbour window: half the trained context; Self-Extend's group, leaky ReRoPE's slowdown:
# the smallest that keeps every distance inside it).
SETTINGS = {"yarn": ("beta_fast", "beta_slow"), "ntk-by-parts": ("beta_fast", "beta_slow"), "self-extend": ("window", "group"),
            "rerope": ("window",), "leaky-rerope": ("window", "k")}
INTEGER = ("window", "group", "k")


def parse_methods(text):
    """--methods as given: names of METHODS, each with optional settings (SETTINGS); repeats dropped."""
    specs = [t.strip() for t in text.split(",") if t.strip()]
    if not specs:
        raise UserError("--methods is empty")
    for spec in specs:
        name, *settings = spec.split(":")
        if name not in METHODS:
            raise UserError(f"unknown --methods {name}; allowed: {', '.join(METHODS)}")
        for setting in settings:
            key, _, value = setting.partition("=")
            if key not in SETTINGS.get(name, ()):
                raise UserError(f"{spec!r}: {name} takes no setting {key!r}; it takes "
                                f"{', '.join(SETTINGS.get(name, ())) or 'none'} (name:key=value)")
            if not number(value, f"methods {spec}: {key}", *((int, 1) if key in INTEGER else (float, 0))) > 0:
                raise UserError(f"--methods {spec}: {key} must be > 0 (YaRN's betas: rotations over L), got {value}")
    return list(dict.fromkeys(specs))


def split_method(spec):
    """'yarn:beta_fast=4' -> ('yarn', {'beta_fast': 4.0}): a method's name and settings (checked by parse_methods)."""
    name, *settings = spec.split(":")
    return name, {k: (int if k in INTEGER else float)(v) for k, _, v in (s.partition("=") for s in settings)}


def self_extend_group(length, run_len, window):
    """Self-Extend's group size: the smallest G whose largest grouped distance, (length - 1) // G + W - W // G, is
    one the model was trained on (< run_len), as Jin et al. choose G for a target length."""
    return next((g for g in range(1, length + 1) if (length - 1) // g + window - window // g < run_len), 1)


def leaky_k(length, run_len, window):
    """Leaky ReRoPE's slowdown: the smallest k whose largest distance, window + (length - 1 - window) / k, is one the
    model was trained on (at most run_len - 1)."""
    return max(1, math.ceil((length - 1 - window) / (run_len - 1 - window))) if length > run_len else 1


def applicable(methods, pos_emb):
    """The methods that apply to an encoding, in the order given: under RoPE all, else ANY_ENCODING's, and MASKS where
    positions are relative."""
    return [m for m in methods if pos_emb == "rope" or (name := split_method(m)[0]) in ANY_ENCODING
            or (name in MASKS and pos_emb in ("alibi", "none"))]


def usable(names, pos_emb):
    """The methods of `names` that apply to the encoding, saying which do not; none left: a one-line error."""
    kept = applicable(names, pos_emb)
    if dropped := [m for m in names if m not in kept]:
        note = f"pos_emb={pos_emb}: {', '.join(dropped)} do not apply"
        if not kept:
            raise UserError(f"{note}; use --methods {','.join(applicable(METHODS, pos_emb))}")
        print(f"{note}; evaluating {', '.join(kept)}")
    return kept


def method_factor(method, length, train_len, factor=None):
    """The factor in the method's arguments at `length` tokens: None where there is none; dynamic-ntk's is
    transformers' extra multiplier a, 1 by default (its scale follows the length by itself); the others
    default to the ratio that maps the length back onto the training length (never below 1)."""
    method = split_method(method)[0]
    if method in ANY_ENCODING + MASKS + EXTEND:
        return None
    if method == "dynamic-ntk":
        return factor or 1.0
    if method == "pairs":  # a list, checked by check_pairs
        return factor
    return factor or max(1.0, length / train_len)


def forward_args(method, length, train_len, run_len, factor=None, causal=False):
    """The model.Method of a method over `length` tokens: a Hugging Face style rope_scaling dict, an attention window,
    log-n scaling, truncation. train_len: the original training length the methods scale from (GPTConfig.train_len);
    run_len: the run's own block_size (a fine-tune's), the longest context its weights were trained on, which crop
    keeps; crop-L keeps train_len (a fine-tune cropped to the length it was extended from). factor: pinned instead of
    method_factor's default; causal: dynamic scaling exact per position. method: a name with its settings (SETTINGS)."""
    s, L = method_factor(method, length, train_len, factor), train_len
    method, given = split_method(method)
    yarn = {"rope_type": "yarn", "factor": s, "original_max_position_embeddings": L, **given}
    near = given.get("window", run_len // 2)  # Self-Extend's and ReRoPE's neighbour window: exact distances below it
    return Method(causal_dynamic=causal, **{
        "none": {},  # the model as trained (with its own rope_scaling, if it was trained with one)
        "crop": {"crop": run_len},  # truncation to the last run_len tokens
        "crop-L": {"crop": L},  # truncation to the last train_len tokens: a fine-tune's own positive control
        "window": {"window": run_len},  # sliding-window attention: each token sees its last run_len
        "sinks": {"window": run_len, "sinks": SINKS},  # the first SINKS tokens and the last run_len - SINKS
        "pi": {"rope_scaling": {"rope_type": "linear", "factor": s}},
        "ntk": {"rope_scaling": {"rope_type": "ntk", "factor": s}},
        "dynamic-ntk": {"rope_scaling": {"rope_type": "dynamic", "factor": s, "original_max_position_embeddings": L}},
        "yarn": {"rope_scaling": yarn},
        "ntk-by-parts": {"rope_scaling": {**yarn, "attention_factor": 1.0}},  # YaRN without its temperature
        "llama3": {"rope_scaling": {"rope_type": "llama3", "factor": s, "original_max_position_embeddings": L,
                                    "low_freq_factor": 1.0, "high_freq_factor": 4.0}},
        "logn": {"logn_len": L},
        "ntk+logn": {"rope_scaling": {"rope_type": "ntk", "factor": s}, "logn_len": L},
        # exact distances below half the trained context, beyond it grouped by G (Self-Extend) or all at that half (ReRoPE)
        "self-extend": {"extend": (near, given.get("group") or self_extend_group(length, run_len, near))},
        "rerope": {"extend": (near, None)},
        # Leaky ReRoPE (Su 2023): beyond the window distances grow k times slower, w + (d - w) / k
        "leaky-rerope": {"extend": (near, None), "leak": given.get("k") or leaky_k(length, run_len, near)},
        # LongRoPE's per-pair factors, the same at every length and no temperature: scale only the pairs you choose
        "pairs": {"rope_scaling": {"rope_type": "longrope", "short_factor": s, "long_factor": s, "attention_factor": 1.0,
                                   "original_max_position_embeddings": L}},
    }[method])


PAIRS_OPTION = ("pair_factors", None, "the method pairs' factors, one >= 1 per frequency pair, fastest first")


def parse_pairs(text):
    """--pair_factors as given: a list of numbers >= 1 (None if not given), repeats kept, unlike other lists."""
    return None if text is None else [number(t, "pair_factors", float, 1) for t in text.split(",")]


def check_pairs(factors, config):
    """--pair_factors for the method pairs: one factor >= 1 per frequency pair of the model, the fastest pair first."""
    n = config.n_embd // config.n_head // 2
    if factors is None:
        raise UserError(f"--methods pairs needs --pair_factors: {n} factors >= 1, one per frequency pair, fastest first")
    if len(factors) != n or min(factors) < 1:
        raise UserError(f"--pair_factors has {len(factors)} factors, smallest {min(factors):g}; this model has {n} "
                         f"frequency pairs: give {n} factors >= 1, fastest pair first")


def unavailable(config, method, length):
    """Why a method cannot score `length` tokens on a model, or None: an explicit check, never a caught error."""
    if not applicable([method], config.pos_emb):
        what = "masks relative positions" if method in MASKS else "rescales RoPE"
        return f"{what}: a pos_emb={config.pos_emb!r} model takes {', '.join(applicable(METHODS, config.pos_emb))}"
    if config.pos_emb == "learned" and length > config.block_size and split_method(method)[0] not in ("crop", "crop-L"):
        return (f"a learned position table has {config.block_size} entries and cannot encode position {length - 1} "
                f"(no extrapolation): use crop (truncation) or fewer tokens")
    return None


def reasons(config, cells):
    """unavailable for each (method, tokens) cell a command would score; if no cell can be scored, a one-line error
    before anything is computed or written (every command decides "nothing to evaluate" here)."""
    why = [unavailable(config, method, n) for method, n in cells]
    if cells and all(why):
        raise UserError(f"nothing to evaluate: {cells[0][0]} at {cells[0][1]} tokens: {why[0]}")
    return why
