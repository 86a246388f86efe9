"""Loss by token position at and past the training length, with RoPE scaling applied at inference; writes
extrapolation.{json,csv,png} into RUN_DIR (or --out). Options and outputs: docs/reference.md."""
import argparse
import sys
import time

import numpy as np
from tqdm import tqdm

from common import (MAX_FACTOR, UserError, claim_output, command_parser, parse_list, parse_number, run_cli,
                    shared_values, unless_check)
from data.dataset import held_out, in_tokens, load_split
from eval import methods
from eval.methods import FIXED, forward_args, method_factor, parse_methods
from eval.score import choose_units, score_units, sliding_windows
from eval.summary import label, summarize_grid
from rope import scaling_type
from runtime import load_run

PROTOCOLS = ("windows", "sliding")
DOCS = ("all", "dev", "test")  # the held-out documents, or a half: dev (even-numbered files), test (odd)


def checked(parse, auto=None):  # an argparse type from our parser: a bad value is its one-line message
    def convert(text):
        try:
            return None if text == auto else parse(text)
        except UserError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return convert


def number(name, kind, low, high=None, auto=None):
    return checked(lambda t: parse_number(t, name, kind, low, high), auto)


def listed(name, kind, allowed=None):
    return checked(lambda t: parse_list(t, name, kind, allowed))


def multiples(text):
    values = parse_list(text, "lengths", float)
    if min(values) <= 0:
        raise UserError(f"--lengths must be positive multiples of the training length, got {text}")
    return values


OPTIONS = (  # name, default, type (or the choices), help
    ("lengths", "1,2,4,8,16", checked(multiples), "multiples of the training length"),
    ("methods", ",".join(FIXED), checked(parse_methods), f"any of {', '.join(methods.METHODS)} (pairs needs "
     "--pair_factors), each with optional settings: name:key=value (yarn:beta_fast=4)"),
    ("docs", "all", DOCS, "held-out documents scored: all, dev (even-numbered) or test "
     "(odd-numbered): settings are chosen on dev"),
    ("protocols", ",".join(PROTOCOLS), listed("protocols", str, PROTOCOLS),
     "windows (each from position 0) and/or sliding (every token once)"),
    ("stride", "half", number("stride", int, 1, auto="half"), "the sliding protocol's stride: half of each "
     "length, or tokens"),
    ("tokens", "16384", number("tokens", int, 1), "scored tokens per length and protocol"),
    ("min_units", "2", number("min_units", int, 2), "at least this many windows (or stretches) per length, "
     "where the held-out text has them"),
    ("bins", "linear", ("linear", "log"), "position bins: linear or log"),
    ("factor", "auto", number("factor", float, 1, MAX_FACTOR, auto="auto"), "auto (eval length / training "
     "length) or one number >= 1 for every length"),
    ("dynamic_factor", None, number("dynamic_factor", float, 1, MAX_FACTOR), "dynamic-ntk's extra NTK "
     "multiplier a (default 1: plain dynamic NTK)"),
    ("pair_factors", None, checked(methods.parse_pairs), methods.PAIRS_OPTION[2]),
    ("dynamic_modes", None, listed("dynamic_modes", str, ("sequence", "causal")),
     "dynamic-ntk's: sequence (one forward) and/or causal (exact per position, slow; default sequence)"),
    ("crop_stride", "auto", number("crop_stride", int, 1, auto="auto"), "crop's truncation windows advance "
     "by this many tokens (auto: L/8; 1: exact, slow)"),
    ("helped_threshold", "2", number("helped_threshold", float, 0), "helped tokens: where some method beats "
     "crop by more than this many nats"),
    ("plot", "auto", checked(parse_methods, "auto"), "methods drawn in "
     "extrapolation.png (auto: none, pi, ntk, yarn and the 4 others nearest crop past L)"),
)


def parse_args(argv):
    p = command_parser(__doc__, "run_dir", "out", "device", "seed", "wandb", "check")
    for name, default, kind, text in OPTIONS:
        check = {"choices" if isinstance(kind, tuple) else "type": kind}
        p.add_argument(f"--{name}", default=default, **check,
                       help=text + ("" if default is None else f" (default {default})"))
    a = p.parse_args(argv)
    names = [m.name for m in a.methods]  # an option of no method evaluated is refused, not ignored
    for option, method in (("pair_factors", "pairs"), ("dynamic_factor", "dynamic-ntk"),
                           ("dynamic_modes", "dynamic-ntk")):
        if getattr(a, option) is not None and method not in names:
            raise UserError(f"--{option} applies to the method {method} only, which --methods "
                            f"{','.join(a.methods)} leaves out: add {method} to --methods, or drop "
                            f"--{option}")
    if "pairs" in names and a.pair_factors is None:
        raise UserError("--methods pairs needs --pair_factors: one factor >= 1 per frequency pair, "
                        "fastest first")
    if a.plot and (absent := [m for m in a.plot if m not in a.methods]):
        raise UserError(f"--plot {', '.join(absent)}: not in --methods {','.join(a.methods)}; --plot draws "
                        "methods evaluated")
    if "windows" not in a.protocols:
        raise UserError("--protocols sliding alone draws no extrapolation.png (it plots the windows "
                        "protocol): use --protocols windows,sliding")
    # options: as given, so a study can tell how a run was scored
    return dict(vars(a), **shared_values(a), options=[x for x in argv if x != a.run_dir],
                dynamic_modes=a.dynamic_modes or ["sequence"], dynamic_factor=a.dynamic_factor or 1.0)


def window_positions(n, protocol, eval_len, stride):  # [n]: each target's position in its window
    if protocol == "sliding":
        plan = sliding_windows(n, eval_len, stride)
        return np.concatenate([np.arange(eval_len - k, eval_len) for _, k in plan])
    return np.arange(n)


def run_grid(model, tokens, docs, args, train_len):
    eval_lens = in_tokens(args["lengths"], "lengths", train_len, docs)
    if len(set(eval_lens)) < len(eval_lens):  # one length scored twice would count twice in a study
        T = next(T for T in eval_lens if eval_lens.count(T) > 1)
        same = [f"{m:g}" for m, n in zip(args["lengths"], eval_lens) if n == T]
        raise UserError(f"--lengths {' and '.join(same)} are both {T} tokens at training length {train_len}: "
                        "give each length once")
    # in output order: only dynamic-ntk has modes, its causal one only under windows
    modes = {"windows": args["dynamic_modes"], "sliding": ["sequence"]}
    grid = [(p, T, m, mode) for p in args["protocols"] for T in eval_lens for m in args["methods"]
            for mode in (modes[p] if m.name == "dynamic-ntk" else [None])]
    why = methods.reasons(model.config, [(m, T) for p, T, m, _ in grid])
    if "sliding" in args["protocols"] and (args["stride"] or 0) > min(eval_lens):
        raise UserError(f"--stride {args['stride']} is longer than the evaluation length {min(eval_lens)}; "
                         f"use a stride <= {min(eval_lens)}")
    units = {(p, T): choose_units(docs, p, T, args["tokens"], args["min_units"], args["seed"])
             for p in args["protocols"] for T in eval_lens}
    crop_stride = args["crop_stride"] or max(1, model.config.block_size // 8)
    if crop_stride > model.config.block_size:  # crop's targets would see a single token
        raise UserError(f"--crop_stride {crop_stride} is longer than the run's context "
                        f"{model.config.block_size}: use --crop_stride <= {model.config.block_size} (each "
                        "target keeps at least L - stride + 1 tokens)")
    scored, results, done = {}, [], {}
    for (protocol, T, method, mode), reason in tqdm(list(zip(grid, why)), desc="extrapolate", unit="eval"):
        n, starts = units[protocol, T]
        pinned = {"dynamic-ntk": args["dynamic_factor"], "pairs": args["pair_factors"]}
        factor = method_factor(method, T, train_len, pinned.get(method.name, args["factor"]))
        stride = (args["stride"] or T // 2) if protocol == "sliding" else None
        pos_args = forward_args(method, T, train_len, model.config.block_size, factor, mode == "causal")
        t0 = time.time()
        # crop's scores depend on the units alone: lengths with the same units (sliding's) share them
        key = ("crop", pos_args.crop, n, tuple(starts)) if pos_args.crop else (protocol, T, method, mode)
        if not reason and key not in done:
            done[key] = score_units(model, tokens, starts, n, protocol, T, stride, pos_args, crop_stride)
        scored[protocol, T, method, mode] = None if reason else done[key]
        results.append(dict(method=method, mode=mode, protocol=protocol, eval_len=T, factor=factor,
                            stride=stride, positions=pos_args.settings(), n_units=len(starts),
                            tokens=n * len(starts), available=reason is None, reason=reason,
                            seconds=round(time.time() - t0, 3)))
    positions = {(p, T): window_positions(units[p, T][0], p, T, args["stride"] or T // 2) for p, T in units}
    summarize_grid(results, scored, positions, train_len, args["bins"], args["helped_threshold"])
    starts = {f"{p} {T}": [int(s) for s in units[p, T][1]] for p, T in units}
    # each unit's held-out document (holding its first token): a study resamples documents, not windows
    unit_docs = {k: (np.searchsorted(docs[:, 0], v, side="right") - 1).tolist() for k, v in starts.items()}
    return results, starts, unit_docs, crop_stride


def extrapolate(args):
    model, ckpt, data_dir, weights = load_run(args["run_dir"], args["device"])
    claim_output(args["out"], "extrapolation")  # a folder that cannot be written fails now
    logs = ckpt["config"].get("wandb_log", False) if args["wandb_log"] is None else args["wandb_log"]
    if logs:  # a bad wandb setting or run file: one line now, not after the work
        from wandb_runs import ready_to_log
        ready_to_log(args["run_dir"])
    cfg = model.config
    if cfg.train_len != cfg.block_size:
        print(f"fine-tuned run: methods scale from the original training length {cfg.train_len}; it was "
              f"fine-tuned at {cfg.block_size}, crop's window")
    args = dict(args, methods=methods.usable(args["methods"], cfg.pos_emb))
    if "pairs" in args["methods"]:
        methods.check_pairs(args["pair_factors"], cfg)
    if scaling_type(cfg.rope_scaling) != "default":  # a partial rotary factor alone is no scaling
        print(f"the run was trained with rope_scaling={cfg.rope_scaling}: `none` evaluates it as trained, "
              f"the other methods replace it")
    tokens, docs = load_split(data_dir, "val")
    docs = held_out(docs, args["docs"])
    t0 = time.time()
    results, units, unit_docs, crop_stride = run_grid(model, tokens, docs, args, cfg.train_len)
    spent = {k: sum(r["seconds"] for r in results if label(r) == k) for k in map(label, results)}
    report = dict(train_len=cfg.train_len, context_len=cfg.block_size, pos_emb=cfg.pos_emb,
                  run=ckpt["config"].get("wandb_run_name") or args["run_dir"].name,
                  checkpoint_iter=ckpt["iter_num"], weights_id=weights, options=args["options"],
                  seed=args["seed"], tokens_per_length=args["tokens"], stride=args["stride"] or "half",
                  bins=args["bins"], dataset=str(data_dir), docs=args["docs"], crop_stride=crop_stride,
                  crop_context=[cfg.block_size - crop_stride + 1, cfg.block_size],
                  seconds=round(time.time() - t0, 1),
                  seconds_by_method=dict(sorted(spent.items(), key=lambda kv: -kv[1])), units=units,
                  unit_docs=unit_docs, documents=len(docs), dynamic_factor=args["dynamic_factor"],
                  dynamic_modes=args["dynamic_modes"], results=results)
    from eval.report import write_extrapolation  # the table, figure and CSV
    write_extrapolation(report, args["out"], args["plot"])
    if logs:
        from wandb_runs import log_extrapolation
        log_extrapolation(report, ckpt, args["run_dir"], args["out"] / "extrapolation.png")
    return report


def main(argv):
    return run_cli("extrapolate.py", lambda: unless_check(extrapolate, parse_args(argv)))


if __name__ == "__main__":
    main(sys.argv[1:])
