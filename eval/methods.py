"""The position methods every command shares, one entry each in METHODS_TABLE (docs/methodology.md; adding
one: docs/adding_a_method.md): nothing else decides where a method applies, its factor or the positions.Method
it builds. Formulas live in rope.py (rope_scaling dicts) and positions.py (masks, attention)."""
import math
from typing import Callable, NamedTuple

from common import MAX_FACTOR, UserError, parse_number
from model import POS_EMBS
from positions import SINKS, Method
from rope import ORIGINAL, YARN_BETAS

ROPE, RELATIVE = ("rope",), ("rope", "alibi", "none")  # RELATIVE: positions enter attention only, so a mask can move them
BETAS = ("beta_fast", "beta_slow")  # YaRN's ramp, in rotations over L: what the regime study tunes
INTEGER = ("window", "group", "k")  # settings that count tokens (or a group size, a slowdown): the rest are numbers


class Entry(NamedTuple):
    encodings: tuple  # the pos_emb values it applies to
    # its factor s: "ratio" (default length / L, never below 1), "multiplier" (transformers' dynamic a, default 1: the
    # scale follows the length by itself), "per pair" (a list, no default) or None (it takes none)
    factor: str | None
    positions: Callable  # At -> the fields of its positions.Method
    settings: tuple = ()  # what a user may set, as name:key=value[:key=value] (yarn:beta_fast=4); unset: the method's rule
    default: bool = True  # in --methods' default list
    shortest: int = 1  # the shortest trained context (block_size) it can score with: its window's, or sinks' and more


class At(NamedTuple):  # what a method's positions may depend on
    s: float | list | None  # its factor
    L: int  # the original training length it scales from
    run_len: int  # the run's own (a fine-tune's block_size): the longest context its weights saw, which crop keeps
    length: int  # the length scored
    given: dict  # its settings, as given


def yarn(a, **keys):
    return {"rope_scaling": {"rope_type": "yarn", "factor": a.s, ORIGINAL: a.L, **a.given, **keys}}


def near(a):  # Self-Extend's and ReRoPE's neighbour window: exact distances below it, half the trained context unless set
    return a.given.get("window") or max(1, a.run_len // 2)


def self_extend_group(length, run_len, window):
    """Self-Extend's group size: the smallest G whose largest grouped distance (length - 1) // G + W - W // G
    is one the model was trained on (< run_len), as Jin et al. choose G for a target length."""
    return next((g for g in range(1, length + 1) if (length - 1) // g + window - window // g < run_len), 1)


def leaky_k(length, run_len, window):
    """Leaky ReRoPE's slowdown: the smallest k whose largest distance, window + (length - 1 - window) / k, is
    one the model was trained on (at most run_len - 1)."""
    return max(1, math.ceil((length - 1 - window) / (run_len - 1 - window))) if length > run_len else 1


METHODS_TABLE = {
    "none": Entry(POS_EMBS, None, lambda a: {}),  # the model as trained (with its own rope_scaling, if it had one)
    "crop": Entry(POS_EMBS, None, lambda a: {"crop": a.run_len}),  # truncation to the last run_len tokens
    "window": Entry(RELATIVE, None, lambda a: {"window": a.run_len}),  # sliding-window attention: the last run_len
    # the first SINKS tokens and the last run_len - SINKS
    "sinks": Entry(RELATIVE, None, lambda a: {"window": a.run_len, "sinks": min(SINKS, a.run_len - 1)}, shortest=SINKS + 1),
    "pi": Entry(ROPE, "ratio", lambda a: {"rope_scaling": {"rope_type": "linear", "factor": a.s}}),
    "ntk": Entry(ROPE, "ratio", lambda a: {"rope_scaling": {"rope_type": "ntk", "factor": a.s}}),
    "dynamic-ntk": Entry(ROPE, "multiplier",
                         lambda a: {"rope_scaling": {"rope_type": "dynamic", "factor": a.s, ORIGINAL: a.L}}),
    "yarn": Entry(ROPE, "ratio", yarn, BETAS),
    "ntk-by-parts": Entry(ROPE, "ratio", lambda a: yarn(a, attention_factor=1.0), BETAS),  # YaRN without its temperature
    "llama3": Entry(ROPE, "ratio", lambda a: {"rope_scaling": {"rope_type": "llama3", "factor": a.s, ORIGINAL: a.L,
                                                               "low_freq_factor": 1.0, "high_freq_factor": 4.0}}),
    "logn": Entry(POS_EMBS, None, lambda a: {"logn_len": a.L}),
    "ntk+logn": Entry(ROPE, "ratio", lambda a: {"rope_scaling": {"rope_type": "ntk", "factor": a.s}, "logn_len": a.L}),
    # exact distances below half the trained context, beyond it grouped by G (Self-Extend) or all at that half (ReRoPE)
    "self-extend": Entry(ROPE, None, lambda a: {"extend": (near(a), a.given.get("group") or self_extend_group(
        a.length, a.run_len, near(a)))}, ("window", "group"), shortest=2),
    "rerope": Entry(ROPE, None, lambda a: {"extend": (near(a), None)}, ("window",), shortest=2),
    # truncation to the last train_len tokens: a fine-tune's own positive control (crop, before a fine-tune)
    "crop-L": Entry(POS_EMBS, None, lambda a: {"crop": a.L}, default=False),
    # Leaky ReRoPE (Su 2023): beyond the window distances grow k times slower, w + (d - w) / k
    "leaky-rerope": Entry(ROPE, None, lambda a: {"extend": (near(a), None), "leak": a.given.get("k") or leaky_k(
        a.length, a.run_len, near(a))}, ("window", "k"), default=False, shortest=3),
    # LongRoPE's per-pair factors, the same at every length and no temperature: scale only the pairs you choose
    "pairs": Entry(ROPE, "per pair", lambda a: {"rope_scaling": {"rope_type": "longrope", "short_factor": a.s,
                                                                 "long_factor": a.s, "attention_factor": 1.0, ORIGINAL: a.L}},
                   default=False),
}
METHODS = tuple(METHODS_TABLE)
FIXED = tuple(m for m, e in METHODS_TABLE.items() if e.default)  # the default list (pairs needs --pair_factors)
MASKS = tuple(m for m, e in METHODS_TABLE.items() if e.encodings == RELATIVE)  # masks over positions past L


def parse_methods(text):
    """--methods as given: names of METHODS, each with optional settings (Entry.settings); repeats dropped."""
    specs = [t.strip() for t in text.split(",") if t.strip()]
    if not specs:
        raise UserError("--methods is empty")
    for spec in specs:
        check_method(spec)
    return list(dict.fromkeys(specs))


def check_method(spec):
    """A method with its settings, checked once where it comes in: each setting known, once, in range."""
    name, *settings = spec.split(":")
    if name not in METHODS:
        raise UserError(f"unknown --methods {name}; allowed: {', '.join(METHODS)}")
    keys = [s.partition("=")[0] for s in settings]
    if repeated := [k for k in keys if keys.count(k) > 1]:
        raise UserError(f"--methods {spec}: {repeated[0]} is given twice; give each setting once")
    for key, _, value in (s.partition("=") for s in settings):
        if key not in (allowed := METHODS_TABLE[name].settings):
            raise UserError(f"{spec!r}: {name} takes no setting {key!r}; it takes {', '.join(allowed) or 'none'} "
                            "(name:key=value)")
        # past these bounds the RoPE math overflows (a beta's logarithm, a slowdown's positions)
        low = 1 if key in INTEGER else 1 / MAX_FACTOR
        parse_number(value, f"methods {spec}: {key}", int if key in INTEGER else float, low, MAX_FACTOR)
    betas = {**YARN_BETAS, **split_method(spec)[1]}
    if BETAS[0] in METHODS_TABLE[name].settings and not betas["beta_fast"] > betas["beta_slow"]:
        fast, slow = betas["beta_fast"], betas["beta_slow"]
        raise UserError(f"--methods {spec}: beta_fast {fast:g} must be above beta_slow {slow:g} (pairs turning "
                        "more than beta_fast times over L are kept, fewer than beta_slow interpolated; defaults 32, 1)")


def split_method(spec):
    """'yarn:beta_fast=4' -> ('yarn', {'beta_fast': 4.0}): a method's name and settings (check_method's)."""
    name, *settings = spec.split(":")
    return name, {k: (int if k in INTEGER else float)(v) for k, _, v in (s.partition("=") for s in settings)}


def applicable(methods, pos_emb):
    """The methods that apply to an encoding, in the order given."""
    return [m for m in methods if pos_emb in METHODS_TABLE[split_method(m)[0]].encodings]


def usable(names, pos_emb):
    """The methods of `names` that apply to the encoding, saying which do not; none left: a one-line error."""
    applying = applicable(names, pos_emb)
    if dropped := [m for m in names if m not in applying]:
        note = f"pos_emb={pos_emb}: {', '.join(dropped)} do not apply"
        if not applying:
            raise UserError(f"{note}; use --methods {','.join(applicable(METHODS, pos_emb))}")
        print(f"{note}; evaluating {', '.join(applying)}")
    return applying


def method_factor(method, length, train_len, factor=None):
    """The factor in the method's arguments at `length` tokens (Entry.factor): None where it takes none; else
    the one pinned (`factor`), or its default."""
    kind = METHODS_TABLE[split_method(method)[0]].factor
    if kind == "ratio":
        return factor or max(1.0, length / train_len)
    return {"multiplier": factor or 1.0, "per pair": factor}.get(kind)  # per pair: a list, checked by check_pairs


def forward_args(method, length, train_len, run_len, factor=None, causal=False):
    """The positions.Method of a method (a name with its settings) over `length` tokens. train_len: the length
    the methods scale from (GPTConfig.train_len); run_len: the run's own block_size, which crop keeps; factor:
    pinned instead of method_factor's default; causal: dynamic scaling exact per position."""
    name, given = split_method(method)
    at = At(method_factor(method, length, train_len, factor), train_len, run_len, length, given)
    return Method(causal_dynamic=causal, **METHODS_TABLE[name].positions(at))


PAIRS_OPTION = ("pair_factors", None, "the method pairs' factors, one >= 1 per frequency pair, fastest first")


def parse_pairs(text):
    """--pair_factors as given: a list of numbers >= 1 (None if not given), repeats kept."""
    return None if text is None else [parse_number(t, "pair_factors", float, 1, MAX_FACTOR) for t in text.split(",")]


def check_pairs(factors, config):
    """--pair_factors for the method pairs: one factor >= 1 per frequency pair of the model, fastest first."""
    # the rotating pairs: a partial rotary factor (Pythia's 0.25) leaves the others unrotated
    partial = (config.rope_scaling or {}).get("partial_rotary_factor", 1.0)
    n = int(config.n_embd // config.n_head * partial) // 2
    if factors is None:
        raise UserError(f"--methods pairs needs --pair_factors: {n} factors >= 1, one per frequency pair, fastest first")
    if len(factors) != n or min(factors) < 1:
        raise UserError(f"--pair_factors has {len(factors)} factors, smallest {min(factors):g}; this model has {n} "
                         f"frequency pairs: give {n} factors >= 1, fastest pair first")


def unavailable(config, method, length):
    """Why a method cannot score `length` tokens on a model, or None: an explicit check, no caught error."""
    if not applicable([method], config.pos_emb):
        what = "masks relative positions" if method in MASKS else "rescales RoPE"
        return f"{what}: a pos_emb={config.pos_emb!r} model takes {', '.join(applicable(METHODS, config.pos_emb))}"
    if config.block_size < (shortest := METHODS_TABLE[split_method(method)[0]].shortest):  # a run trained too short
        return f"its window needs a run trained at block_size >= {shortest}, this one's is {config.block_size}"
    if split_method(method)[1].get("window", 0) >= config.block_size - 1:  # leaky ReRoPE would divide by zero there
        return f"its window must be below the trained context minus one, {config.block_size - 1}"
    at = At(None, config.train_len, config.block_size, length, {})
    if config.pos_emb == "learned" and length > config.block_size and "crop" not in METHODS_TABLE[split_method(method)[0]].positions(at):
        return (f"a learned position table has {config.block_size} entries and cannot encode position {length - 1} "
                f"(no extrapolation): use crop (truncation) or fewer tokens")
    return None


def reasons(config, cells):
    """unavailable for each (method, tokens) cell a command would score; if no cell can be scored, a one-line
    error before anything is computed or written (every command decides "nothing to evaluate" here)."""
    why = [unavailable(config, method, n) for method, n in cells]
    if cells and all(why):
        raise UserError(f"nothing to evaluate: {cells[0][0]} at {cells[0][1]} tokens: {why[0]}")
    return why
