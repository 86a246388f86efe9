"""The position methods every command shares, one entry each in METHODS_TABLE (adding one:
docs/adding_a_method.md). Formulas live in rope.py and positions.py."""
import math
from typing import Callable, NamedTuple

from common import MAX_FACTOR, UserError, parse_number
from model import POS_EMBS
from positions import SINKS, PositionArgs
from rope import ORIGINAL, YARN_BETAS

ROPE, RELATIVE = ("rope",), ("rope", "alibi", "none")  # RELATIVE: positions enter attention only
BETAS = ("beta_fast", "beta_slow")  # YaRN's ramp, in rotations over L
INTEGER = ("window", "group", "k")  # settings that count tokens (or a group, a slowdown); others are numbers


class Entry(NamedTuple):
    encodings: tuple  # the pos_emb values it applies to
    # "ratio" (default length / L, never below 1), "multiplier" (transformers' dynamic a, default 1: the scale
    # follows the length by itself), "per pair" (a list, no default) or None
    factor: str | None
    positions: Callable  # Inputs -> the fields of its PositionArgs
    settings: tuple = ()  # what a user may set, as name:key=value (yarn:beta_fast=4); unset: its rule
    default: bool = True  # in the default --methods
    shortest: int = 1  # the shortest block_size it can score with (its window's, or sinks')


class Inputs(NamedTuple):  # what a method's positions may depend on
    factor: float | list | None
    L: int  # the original training length it scales from
    run_len: int  # the run's own block_size: the longest context its weights saw, which crop keeps
    length: int  # scored
    settings: dict


def yarn(a, **keys):
    return {"rope_scaling": {"rope_type": "yarn", "factor": a.factor, ORIGINAL: a.L, **a.settings, **keys}}


def scaling(a, rope_type, **keys):
    return {"rope_scaling": {"rope_type": rope_type, "factor": a.factor, **keys}}


def near(a):  # Self-Extend's and ReRoPE's window of exact distances: half the trained context unless set
    return a.settings.get("window") or max(1, a.run_len // 2)


def self_extend_group(length, run_len, window):
    # Self-Extend's group size: the smallest G whose largest grouped distance (length - 1) // G + W - W // G
    # the model was trained on (< run_len), as Jin et al. choose G for a target length
    return next((g for g in range(1, length + 1) if (length - 1) // g + window - window // g < run_len), 1)


def leaky_k(length, run_len, window):
    # leaky ReRoPE's slowdown: the smallest k whose largest distance, window + (length - 1 - window) / k, the
    # model was trained on (at most run_len - 1)
    return max(1, math.ceil((length - 1 - window) / (run_len - 1 - window))) if length > run_len else 1


def self_extend(a):
    return {"extend": (near(a), a.settings.get("group") or self_extend_group(a.length, a.run_len, near(a)))}


def leaky_rerope(a):  # Su 2023: beyond the window distances grow k times slower, w + (d - w) / k
    return {"extend": (near(a), None), "leak": a.settings.get("k") or leaky_k(a.length, a.run_len, near(a))}


def pairs(a):  # LongRoPE's per-pair factors, the same at every length and no temperature
    return {"rope_scaling": {"rope_type": "longrope", "short_factor": a.factor, "long_factor": a.factor,
                             "attention_factor": 1.0, ORIGINAL: a.L}}


METHODS_TABLE = {
    "none": Entry(POS_EMBS, None, lambda a: {}),
    "crop": Entry(POS_EMBS, None, lambda a: {"crop": a.run_len}),  # truncation to the last run_len tokens
    "window": Entry(RELATIVE, None, lambda a: {"window": a.run_len}),  # sliding window: the last run_len
    "sinks": Entry(RELATIVE, None, lambda a: {"window": a.run_len, "sinks": min(SINKS, a.run_len - 1)},
                   shortest=SINKS + 1),
    "pi": Entry(ROPE, "ratio", lambda a: scaling(a, "linear")),
    "ntk": Entry(ROPE, "ratio", lambda a: scaling(a, "ntk")),
    "dynamic-ntk": Entry(ROPE, "multiplier", lambda a: scaling(a, "dynamic", **{ORIGINAL: a.L})),
    "yarn": Entry(ROPE, "ratio", yarn, BETAS),
    "ntk-by-parts": Entry(ROPE, "ratio", lambda a: yarn(a, attention_factor=1.0), BETAS),
    "llama3": Entry(ROPE, "ratio", lambda a: scaling(a, "llama3", **{ORIGINAL: a.L}, low_freq_factor=1.0,
                                                     high_freq_factor=4.0)),
    "logn": Entry(POS_EMBS, None, lambda a: {"logn_len": a.L}),
    "ntk+logn": Entry(ROPE, "ratio", lambda a: {**scaling(a, "ntk"), "logn_len": a.L}),
    # exact distances below half the trained context, beyond it grouped (Self-Extend) or all at that half
    "self-extend": Entry(ROPE, None, self_extend, ("window", "group"), shortest=2),
    "rerope": Entry(ROPE, None, lambda a: {"extend": (near(a), None)}, ("window",), shortest=2),
    # truncation to the last train_len tokens: a fine-tune's own positive control
    "crop-L": Entry(POS_EMBS, None, lambda a: {"crop": a.L}, default=False),
    "leaky-rerope": Entry(ROPE, None, leaky_rerope, ("window", "k"), default=False, shortest=3),
    "pairs": Entry(ROPE, "per pair", pairs, default=False),  # scale only the pairs you choose
}
METHODS = tuple(METHODS_TABLE)
FIXED = tuple(m for m, e in METHODS_TABLE.items() if e.default)
MASKS = tuple(m for m, e in METHODS_TABLE.items() if e.encodings == RELATIVE)  # masks over positions past L


class MethodSpec(str):  # a method as given ('yarn:beta_fast=4'), parsed once; a str, so reports keep the text
    name: str
    settings: dict
    entry: Entry


def method_spec(text):  # a MethodSpec passes as is
    if isinstance(text, MethodSpec):
        return text
    name, *pairs = text.split(":")
    if name not in METHODS:
        raise UserError(f"unknown --methods {name}; allowed: {', '.join(METHODS)}")
    keys = [p.partition("=")[0] for p in pairs]
    if repeated := [k for k in keys if keys.count(k) > 1]:
        raise UserError(f"--methods {text}: {repeated[0]} is given twice; give each setting once")
    spec, entry, settings = MethodSpec(text), METHODS_TABLE[name], {}
    for key, _, value in (p.partition("=") for p in pairs):
        if key not in entry.settings:
            raise UserError(f"{text!r}: {name} takes no setting {key!r}; it takes "
                            f"{', '.join(entry.settings) or 'none'} (name:key=value)")
        # past these bounds the RoPE math overflows (a beta's logarithm, a slowdown's positions)
        kind = int if key in INTEGER else float
        low = 1 if kind is int else 1 / MAX_FACTOR
        settings[key] = parse_number(value, f"methods {text}: {key}", kind, low, MAX_FACTOR)
    betas = {**YARN_BETAS, **settings}
    if BETAS[0] in entry.settings and not betas["beta_fast"] > betas["beta_slow"]:
        raise UserError(f"--methods {text}: beta_fast {betas['beta_fast']:g} must be above beta_slow "
                        f"{betas['beta_slow']:g} (pairs turning more than beta_fast times over L are kept, "
                        "fewer than beta_slow interpolated; defaults 32, 1)")
    spec.name, spec.settings, spec.entry = name, settings, entry
    return spec


def parse_methods(text):  # repeats dropped
    specs = [t.strip() for t in text.split(",") if t.strip()]
    if not specs:
        raise UserError("--methods is empty")
    return [method_spec(t) for t in dict.fromkeys(specs)]


def applicable(methods, pos_emb):
    return [m for m in methods if pos_emb in method_spec(m).entry.encodings]


def usable(names, pos_emb):  # those that apply, saying which do not; none left: a one-line error
    applying = applicable(names, pos_emb)
    if dropped := [m for m in names if m not in applying]:
        note = f"pos_emb={pos_emb}: {', '.join(dropped)} do not apply"
        if not applying:
            raise UserError(f"{note}; use --methods {','.join(applicable(METHODS, pos_emb))}")
        print(f"{note}; evaluating {', '.join(applying)}")
    return applying


def method_factor(method, length, train_len, factor=None):
    # Entry.factor's at `length` tokens: the one pinned, or its default
    kind = method_spec(method).entry.factor
    if kind == "ratio":
        return factor or max(1.0, length / train_len)
    return {"multiplier": factor or 1.0, "per pair": factor}.get(kind)


def forward_args(method, length, train_len, run_len, factor=None, causal=False):
    # train_len: the length methods scale from; run_len: the run's own block_size, which crop keeps
    spec = method_spec(method)
    inputs = Inputs(method_factor(spec, length, train_len, factor), train_len, run_len, length, spec.settings)
    return PositionArgs(causal_dynamic=causal, **spec.entry.positions(inputs))


PAIRS_OPTION = ("pair_factors", None, "the method pairs' factors, one >= 1 per frequency pair, fastest first")


def parse_pairs(text):  # repeats kept
    if text is not None:
        return [parse_number(t, "pair_factors", float, 1, MAX_FACTOR) for t in text.split(",")]


def check_pairs(factors, config):  # parse_pairs' (each >= 1; the commands refuse none): one per pair
    n = config.rotary_dim // 2
    if len(factors) != n:
        raise UserError(f"--pair_factors has {len(factors)} factors, smallest {min(factors):g}; this model "
                        f"has {n} frequency pairs: give {n} factors >= 1, fastest pair first")


def unavailable(config, method, length):
    # why a method cannot score `length` tokens on a model, or None
    spec, pos_emb = method_spec(method), config.pos_emb
    if not applicable([spec], pos_emb):
        what = "masks relative positions" if spec.name in MASKS else "rescales RoPE"
        return f"{what}: a pos_emb={config.pos_emb!r} model takes {', '.join(applicable(METHODS, pos_emb))}"
    if config.block_size < spec.entry.shortest:  # a run trained too short
        return (f"its window needs a run trained at block_size >= {spec.entry.shortest}, this one's is "
                f"{config.block_size}")
    if spec.settings.get("window", 0) >= config.block_size - 1:  # leaky ReRoPE would divide by zero there
        return f"its window must be below the trained context minus one, {config.block_size - 1}"
    crops = "crop" in spec.entry.positions(Inputs(None, config.train_len, config.block_size, length, {}))
    if config.pos_emb == "learned" and length > config.block_size and not crops:
        return (f"a learned position table has {config.block_size} entries and cannot encode position "
                f"{length - 1} (no extrapolation): use crop (truncation) or fewer tokens")
    return None


def reasons(config, cells):
    # unavailable per (method, tokens) cell; none scorable: every command's one-line error, before any work
    why = [unavailable(config, method, n) for method, n in cells]
    if cells and all(why):
        raise UserError(f"nothing to evaluate: {cells[0][0]} at {cells[0][1]} tokens: {why[0]}")
    return why
