"""Loss by token position at and past the training length, with RoPE scaling applied at inference; writes
extrapolation.{json,csv,png} into RUN_DIR (or --out) once all is computed. Options and outputs: docs/reference.md."""
import sys

import math
import time

import numpy as np
from tqdm import tqdm


from data.dataset import held_out, in_tokens, load_split
from eval.report import (BEST_N, CARD, PLOT_BINS, WEIGHTS, extrapolation_plot, extrapolation_table, json_csv,
                         label, write_all)
from eval import methods
from eval.methods import FIXED, forward_args, method_factor, parse_methods, split_method
from eval.score import choose_units, score_units, sliding_windows
from eval.summary import bin_edges, curves, helped_tokens, per_unit, summarize
from common import (MAX_FACTOR, UserError, claim_output, command_parser, parse_number, parse_list, run_cli, shared_values,
                    unless_check)
from rope import scaling_type
from runtime import load_run
from wandb_runs import extrapolation_metrics, log_results, ready_to_log

PROTOCOLS = ("windows", "sliding")
DOCS = ("all", "dev", "test")  # the held-out documents, or one half of them: dev (even-numbered files), test (odd)
DYNAMIC_MODES = ("sequence", "causal")
BINS = ("linear", "log")
CSV_FIELDS = ("method", "mode", "protocol", "eval_len", "factor", "stride", "loss", "ppl", "loss_beyond_train",
              "ppl_beyond_train", "stderr", "diff_none", "diff_none_stderr", "diff_crop", "diff_crop_stderr",
              "diff_none_inside", "diff_none_inside_stderr", "helped_tokens", "ppl_helped", "n_units", "tokens",
              "seconds", "available", "reason")


def parse_args(argv):
    p = command_parser(__doc__, "run_dir", "out", "device", "seed", "wandb", "check")
    for name, default, text in (
            ("lengths", "1,2,4,8,16", "multiples of the training length"),
            ("methods", ",".join(FIXED), f"any of {', '.join(methods.METHODS)} (pairs needs --pair_factors), each with "
             "optional settings: name:key=value (yarn:beta_fast=4)"),
            ("docs", "all", "held-out documents scored: all, dev (even-numbered) or test (odd-numbered): settings are chosen on dev"),
            ("protocols", ",".join(PROTOCOLS), "windows (each from position 0) and/or sliding (every token once)"),
            ("stride", "half", "the sliding protocol's stride: half of each length, or tokens"),
            ("tokens", "16384", "scored tokens per length and protocol"),
            ("min_units", "2", "at least this many windows (or stretches) per length, where the held-out text has them"),
            ("bins", "linear", "position bins: linear or log"),
            ("factor", "auto", "auto (eval length / training length) or one number >= 1 for every length"),
            ("dynamic_factor", None, "dynamic-ntk's extra NTK multiplier a (default 1: plain dynamic NTK)"),
            methods.PAIRS_OPTION,
            ("dynamic_modes", None, "dynamic-ntk's: sequence (one forward) and/or causal (exact per "
                                    "position, slow; default sequence)"),
            ("crop_stride", "auto", "crop's truncation windows advance by this many tokens (auto: L/8; 1: exact, slow)"),
            ("helped_threshold", "2", "helped tokens: where some method beats crop by more than this many nats"),
            ("plot", "auto", f"methods drawn in extrapolation.png (auto: {','.join(CARD)} and the {BEST_N} others nearest crop past L)")):
        shown = "" if default is None else f" (default {default})"
        p.add_argument(f"--{name}", default=default, help=text + shown)
    a = p.parse_args(argv)
    refuse_unused(a)
    args = dict(shared_values(a), options=[x for x in argv if x != a.run_dir],  # as given, so a study can tell how a run was scored
                protocols=parse_list(a.protocols, "protocols", str, PROTOCOLS),
                dynamic_modes=parse_list(a.dynamic_modes or "sequence", "dynamic_modes", str, DYNAMIC_MODES),
                methods=parse_methods(a.methods),
                lengths=parse_list(a.lengths, "lengths", float))
    if any(m <= 0 for m in args["lengths"]):
        raise UserError(f"--lengths must be positive multiples of the training length, got {a.lengths}")
    if "windows" not in args["protocols"]:
        raise UserError("--protocols sliding alone draws no extrapolation.png (it plots the windows protocol): "
                         "use --protocols windows,sliding")
    if a.docs not in DOCS:
        raise UserError(f"unknown --docs {a.docs!r}; allowed: {', '.join(DOCS)}")
    if a.bins not in BINS:
        raise UserError(f"unknown --bins {a.bins!r}; allowed: {', '.join(BINS)}")
    return dict(args, bins=a.bins, docs=a.docs, stride=None if a.stride == "half" else parse_number(a.stride, "stride", int, 1),
                tokens=parse_number(a.tokens, "tokens", int, 1), min_units=parse_number(a.min_units, "min_units", int, 2),
                factor=None if a.factor == "auto" else parse_number(a.factor, "factor", float, 1, MAX_FACTOR),
                dynamic_factor=parse_number(a.dynamic_factor or "1", "dynamic_factor", float, 1, MAX_FACTOR),
                helped_threshold=parse_number(a.helped_threshold, "helped_threshold", float, 0),
                crop_stride=None if a.crop_stride == "auto" else parse_number(a.crop_stride, "crop_stride", int, 1),
                pair_factors=methods.parse_pairs(a.pair_factors),
                plot=None if a.plot == "auto" else parse_methods(a.plot))


def refuse_unused(a):
    """Options that apply to no method evaluated are refused, not ignored; --plot draws evaluated ones."""
    given = parse_methods(a.methods)
    names = [split_method(m)[0] for m in given]
    for option, method in (("pair_factors", "pairs"), ("dynamic_factor", "dynamic-ntk"),
                           ("dynamic_modes", "dynamic-ntk")):
        if getattr(a, option) is not None and method not in names:
            raise UserError(f"--{option} applies to the method {method} only, which --methods {a.methods} "
                            f"leaves out: add {method} to --methods, or drop --{option}")
    if "pairs" in names and a.pair_factors is None:
        raise UserError("--methods pairs needs --pair_factors: one factor >= 1 per frequency pair, "
                        "fastest first")
    if a.plot != "auto" and (absent := [m for m in parse_methods(a.plot) if m not in given]):
        raise UserError(f"--plot {', '.join(absent)}: not in --methods {a.methods}; --plot draws methods "
                        "evaluated")


def window_positions(n, protocol, eval_len, stride):
    """[n]: each target's position in its window under the protocol (the same for every method and unit)."""
    if protocol == "sliding":
        return np.concatenate([np.arange(eval_len - k, eval_len) for _, k in sliding_windows(n, eval_len, stride)])
    return np.arange(n)


def run_grid(model, tokens, docs, args, train_len):
    eval_lens = in_tokens(args["lengths"], "lengths", train_len, docs)
    if len(set(eval_lens)) < len(eval_lens):  # one length scored twice would count twice in a study
        T = next(T for T in eval_lens if eval_lens.count(T) > 1)
        same = [f"{m:g}" for m, n in zip(args["lengths"], eval_lens) if n == T]
        raise UserError(f"--lengths {' and '.join(same)} are both {T} tokens at training length {train_len}: "
                        "give each length once")
    # the grid in output order: only dynamic-ntk has modes, its causal one only under windows
    grid = [(p, T, m, mode) for p in args["protocols"] for T in eval_lens for m in args["methods"] for mode in
            ((args["dynamic_modes"] if p == "windows" else ["sequence"]) if split_method(m)[0] == "dynamic-ntk" else [None])]
    reasons = methods.reasons(model.config, [(m, T) for p, T, m, _ in grid])
    if "sliding" in args["protocols"] and (args["stride"] or 0) > min(eval_lens):
        raise UserError(f"--stride {args['stride']} is longer than the evaluation length {min(eval_lens)}; "
                         f"use a stride <= {min(eval_lens)}")
    units = {(p, T): choose_units(docs, p, T, args["tokens"], args["min_units"], args["seed"])
             for p in args["protocols"] for T in eval_lens}
    crop_stride = args["crop_stride"] or max(1, model.config.block_size // 8)
    if crop_stride > model.config.block_size:  # crop's targets would see a single token: not truncation to L
        raise UserError(f"--crop_stride {crop_stride} is longer than the run's context "
                        f"{model.config.block_size}: use --crop_stride <= {model.config.block_size} (each "
                        "target keeps at least L - stride + 1 tokens)")
    scored, results, done = {}, [], {}
    for (protocol, T, method, mode), reason in tqdm(list(zip(grid, reasons)), desc="extrapolate", unit="eval"):
        n, starts = units[protocol, T]
        given = {"dynamic-ntk": args["dynamic_factor"], "pairs": args["pair_factors"]}.get(split_method(method)[0], args["factor"])
        factor = method_factor(method, T, train_len, given)
        stride = (args["stride"] or T // 2) if protocol == "sliding" else None
        how = forward_args(method, T, train_len, model.config.block_size, factor, mode == "causal")
        t0 = time.time()
        # crop depends on the units alone: the sliding protocol's lengths share their stretches, and so crop's scores
        key = ("crop", how.crop, n, tuple(starts)) if how.crop else (protocol, T, method, mode)
        if not reason and key not in done:
            done[key] = score_units(model, tokens, starts, n, protocol, T, stride, how, crop_stride)
        scored[protocol, T, method, mode] = None if reason else done[key]
        results.append(dict(method=method, mode=mode, protocol=protocol, eval_len=T, factor=factor, stride=stride,
                            positions=how.settings(), n_units=len(starts), tokens=n * len(starts),
                            available=reason is None, reason=reason, seconds=round(time.time() - t0, 3)))
    helped = {k[:2]: helped_tokens(scored, *k[:2], args["helped_threshold"]) for k in scored}
    for r in results:
        key = r["protocol"], r["eval_len"]
        nll, mask = scored[(*key, r["method"], r["mode"])], helped[key]
        pos = window_positions(nll.shape[1], *key, r["stride"]) if nll is not None else None
        refs = [None if r["method"] == ref else scored.get((*key, ref, None)) for ref in ("none", "crop")]
        r.update(summarize(None if nll is None else per_unit(nll, pos, train_len, *refs)))
        r["helped_tokens"] = None if mask is None else int(mask.sum())
        r["ppl_helped"] = math.exp(nll[mask].mean()) if mask is not None and nll is not None and mask.any() else None
        if r["protocol"] == "windows" and nll is not None:
            r["loss_by_position"] = nll.mean(axis=0).round(6).tolist()
            r["curve"] = curves(nll, scored.get((*key, "none", None)), bin_edges(r["eval_len"], args["bins"]))
            if (crop := scored.get((*key, "crop", None))) is not None and r["method"] != "crop":
                edges = np.linspace(0, r["eval_len"], PLOT_BINS + 1).round().astype(int)
                r["crop_curve"] = curves(nll - crop, None, np.unique(edges), "diff_crop", "diff_crop_stderr")
    starts = {f"{p} {T}": [int(s) for s in units[p, T][1]] for p, T in units}
    # each unit's held-out document (the one holding its first token): a study resamples documents, not windows
    unit_docs = {k: (np.searchsorted(docs[:, 0], v, side="right") - 1).tolist() for k, v in starts.items()}
    return results, starts, unit_docs, crop_stride


def log_wandb(report, ckpt, run_dir, png_path):
    """Into the model's wandb run (wandb_runs.py): the numbers as summary metrics, the curves by position, the table and figure."""
    import wandb
    log_results(run_dir, ckpt["config"], *extrapolation_metrics(report), media={
        "extrapolation/table": wandb.Table(columns=[*CSV_FIELDS], data=[[r[k] for k in CSV_FIELDS] for r in report["results"]]),
        "extrapolation/plot": wandb.Image(str(png_path))})


def extrapolate(args):
    model, ckpt, data_dir, weights = load_run(args["run_dir"], args["device"])
    claim_output(args["out"], "extrapolation")  # before the computation: a folder that cannot be written fails now
    logs = ckpt["config"].get("wandb_log", False) if args["wandb_log"] is None else args["wandb_log"]
    if logs:  # a bad wandb setting or run file: one line now, not after the outputs are written
        ready_to_log(args["run_dir"])
    train_len, pos_emb = model.config.train_len, model.config.pos_emb
    if train_len != model.config.block_size:
        print(f"fine-tuned run: methods scale from the original training length {train_len}; it was fine-tuned at "
              f"{model.config.block_size}, crop's window")
    args = dict(args, methods=methods.usable(args["methods"], pos_emb))
    if "pairs" in args["methods"]:
        methods.check_pairs(args["pair_factors"], model.config)
    if scaling_type(model.config.rope_scaling) != "default":  # a partial rotary factor alone is no scaling
        print(f"the run was trained with rope_scaling={model.config.rope_scaling}: `none` evaluates it as trained, "
              f"the other methods replace it")
    tokens, docs = load_split(data_dir, "val")
    docs = held_out(docs, args["docs"])
    t0 = time.time()
    results, units, unit_docs, crop_stride = run_grid(model, tokens, docs, args, train_len)
    spent = {k: sum(r["seconds"] for r in results if label(r) == k) for k in dict.fromkeys(map(label, results))}  # the benchmark line
    report = dict(train_len=train_len, context_len=model.config.block_size, pos_emb=pos_emb,
                  run=ckpt["config"].get("wandb_run_name") or args["run_dir"].name, checkpoint_iter=ckpt["iter_num"],
                  **{WEIGHTS: weights},
                  options=args["options"], seed=args["seed"], tokens_per_length=args["tokens"], stride=args["stride"] or "half",
                  bins=args["bins"], dataset=str(data_dir), docs=args["docs"], crop_stride=crop_stride,
                  crop_context=[model.config.block_size - crop_stride + 1, model.config.block_size], seconds=round(time.time() - t0, 1),
                  seconds_by_method=dict(sorted(spent.items(), key=lambda kv: -kv[1])), units=units, unit_docs=unit_docs,
                  documents=len(docs), dynamic_factor=args["dynamic_factor"], dynamic_modes=args["dynamic_modes"], results=results)
    out = args["out"]  # the figure drawn first: a failure leaves the earlier outputs as they were
    write_all(out, {"extrapolation.png": extrapolation_plot(report, args["plot"]), **json_csv("extrapolation", report, results, CSV_FIELDS)})
    print(extrapolation_table(report), f"{len(results)} evaluations in {report['seconds']:.0f}s: "
          + ", ".join(f"{k} {v:.1f}s" for k, v in report["seconds_by_method"].items()),
          f"-> {out}/extrapolation.{{json,csv,png}}", sep="\n")
    if logs:
        log_wandb(report, ckpt, args["run_dir"], out / "extrapolation.png")
    return report


def main(argv):
    return run_cli("extrapolate.py", lambda: unless_check(extrapolate, parse_args(argv)))


if __name__ == "__main__":
    main(sys.argv[1:])
