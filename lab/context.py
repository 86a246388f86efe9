"""Does more context help? The same targets scored with c = L/4 .. 16L tokens of context per method; writes
context.{json,csv,png} into RUN_DIR (or --out) once all is computed (docs/methodology.md). Given several runs (seeds
of a config, or configs read on the same targets), each run's go into its own folder and their means over the runs of
each config into --out: context_mean.{json,md}.

Units: --units held-out windows of C_max + 1 tokens (C_max the largest context); targets: the last m tokens of each.
At context c a method scores the unit's last c + 1 tokens from position 0 and keeps the last m NLLs, so a target
has c - m + 1 to c tokens of context. crop is exact truncation: each target predicted from exactly its own last
block_size tokens (fewer where c is shorter). whole-L is the whole-window reading at L: the unit's last L + 1 tokens in
one window from position 0, so the targets see L - m + 1 to L tokens (1 to L with --targets L; bojone/rerope's
"RoPE-4k" row), the same at every context.
A scaling method's factor stays fixed while the context grows (--factor; default: C_max / L, the factor the
largest context needs), so a change along the sweep comes from the context, not from a larger factor."""
import re
import shlex
import sys
import time
from pathlib import Path

import math
import numpy as np
from tqdm import tqdm


from data.dataset import doc_windows, held_out, in_tokens, load_split
from eval import methods
from eval.methods import FIXED, forward_args, method_factor
from eval.report import fmt, json_csv, line_style, png, pyplot, write_all
from eval.score import score_rows
from lab.crop import score_cropped
from eval.summary import mean_stderr
from lab.pages import generated, write_page
from runtime import load_run
from common import (MAX_FACTOR, UserError, claim_output, command_parser, parse_number, parse_list, run_cli,
                    run_home, shared_values)
from eval.reading import unique_runs

WHOLE = "whole-L"  # the whole-window reading at L: a baseline of this sweep, not a method of the forward
CSV_FIELDS = ("method", "context", "multiple", "factor", "loss", "ppl", "stderr", "diff_crop", "diff_crop_stderr", "available",
              "reason", "seconds")


def parse_args(argv):
    p = command_parser(__doc__, "run_dir", "out", "device", "seed")
    p.add_argument("more_runs", nargs="*", help="more run folders, on the same targets (needs --out, for their means)")
    for name, default, text in (
            ("contexts", "0.25,0.5,1,2,4,8,16", "context lengths, multiples of the training length"),
            ("methods", "none,crop,whole-L,pi,ntk,yarn,llama3", "eval/methods.py's, and whole-L"),
            ("units", "32", "held-out windows"), ("docs", "all", "held-out documents: all, dev or test"),
            ("targets", "auto", "targets per window: auto (training length // 8) or a number"),
            ("factor", "max", "the methods' factor at every context: max (the largest context's), grow (each "
                              "context's own, so the factor grows with the context) or one number >= 1")):
        p.add_argument(f"--{name}", default=default, help=f"{text} (default {default})")
    a = p.parse_args(argv)
    contexts = parse_list(a.contexts, "contexts", float)
    if not all(0 < x < math.inf for x in contexts):  # also nan
        raise UserError(f"--contexts must be positive multiples of the training length, got {a.contexts}")
    if a.docs not in ("all", "dev", "test"):
        raise UserError(f"unknown --docs {a.docs!r}; allowed: all, dev, test")
    if a.more_runs and a.out is None:
        raise UserError("several runs need --out: the folder for their means (each run's sweep goes into its folder)")
    return dict(shared_values(a), more_runs=[Path(r) for r in a.more_runs], contexts=contexts,
                options=[x for x in argv if x not in (a.run_dir, *a.more_runs)],
                methods=parse_list(a.methods, "methods", str, FIXED + (WHOLE,)), docs=a.docs, units=parse_number(a.units, "units", int, 1),
                targets=None if a.targets == "auto" else parse_number(a.targets, "targets", int, 1),
                factor=a.factor if a.factor in ("max", "grow") else parse_number(a.factor, "factor", float, 1, MAX_FACTOR))


def factor_at(method, c, C, train_len, factor):
    """The factor a method scales by at context c (None: it has none): under "max" the one the largest context C needs,
    under "grow" c's own (the factor then grows with the context), else the number given. dynamic-ntk's scale follows
    the length by itself (its factor is another thing, the extra multiplier): it keeps its own."""
    if method == "dynamic-ntk":
        return method_factor(method, c, train_len)
    return method_factor(method, c, train_len, {"max": method_factor(method, C, train_len), "grow": None}.get(factor, factor))


def score(model, units, c, m, how, L):
    """Per-unit mean NLL of the last m targets of each unit's last c + 1 tokens under a positions.PositionArgs, from position 0;
    under crop each target from exactly its own last how.crop tokens; whole-L (how None) from the last L + 1 tokens."""
    if how is None:
        return score_rows(model, units[:, -(min(c, L) + 1):], last=m)[0].mean(axis=1)
    if how.crop:
        return score_cropped(model, units[:, -(c + 1):], m, how.crop)[0].mean(axis=1)
    return score_rows(model, units[:, -(c + 1):], last=m, method=how)[0].mean(axis=1)


def plot(report):
    plt, L, rs = pyplot(), report["train_len"], report["results"]
    fig, ax = plt.subplots(figsize=(8, 5))
    for method in dict.fromkeys(r["method"] for r in rs):
        if not (mine := [r for r in rs if r["method"] == method and r["available"]]):
            ax.plot([], [], " ", label=f"{method}: n/a")  # in the legend, so its absence is visible
            continue
        x, y, e = (np.array([r[k] or 0.0 for r in mine]) for k in ("context", "loss", "stderr"))
        style = line_style(method)
        ax.plot(x, y, ms=4, lw=1.2, label=method, **style)
        ax.fill_between(x, y - e, y + e, alpha=0.15, color=style["color"], lw=0)
    ax.axvline(L, color="grey", ls=":", lw=1)
    ax.set_xscale("log", base=2)
    ax.set_xticks(report["contexts"], [str(c) for c in report["contexts"]])
    ax.set(xlabel="context c (tokens)", ylabel="NLL of the same targets (mean, +-1 s.e. over units)",
           title=f"{report['run']} ({report['pos_emb']}, trained at {L}, dotted): {report['units']} units x "
                 f"{report['targets']} targets,\neach with c - {report['targets']} + 1 to c tokens of context "
                 f"(crop, dashed: at most {report['context_len']}); {factor_text(report)}")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)  # beside the curves, not on them
    return png(fig, bbox_inches="tight")  # tight: the legend and the long title uncut


def factor_text(report):
    f, top = report["factor"], max(report["contexts"]) / report["train_len"]
    return (f"factor fixed at {max(1.0, top):g} (the largest context's)" if f == "max" else "factor c / L (grows with c)"
            if f == "grow" else f"factor fixed at {f:g}")


def table(report):
    cs, rows = report["contexts"], {}
    for r in report["results"]:
        rows.setdefault(r["method"], {})[r["context"]] = fmt(r["loss"], 3)
    body = [["method"] + [str(c) for c in cs]] + [[k] + [v[c] for c in cs] for k, v in rows.items()]
    width = [max(len(row[i]) for row in body) for i in range(len(body[0]))]
    return f"loss (NLL) by context in tokens, {factor_text(report)}:\n" + "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, width)) for row in body)


def context_sweep(args):
    model, ckpt, data_dir, weights = load_run(args["run_dir"], args["device"])
    claim_output(args["out"], "context")  # before the computation: a folder that cannot be written fails now
    L, run_len, pos_emb = model.config.train_len, model.config.block_size, model.config.pos_emb
    kept = methods.usable([m for m in args["methods"] if m != WHOLE], pos_emb) + [WHOLE] * (WHOLE in args["methods"])
    tokens, docs = load_split(data_dir, "val")
    docs = held_out(docs, args["docs"])
    m, contexts = args["targets"] or max(1, L // 8), sorted(set(in_tokens(args["contexts"], "contexts", L, docs)))
    if bad := [c for c in contexts if c < m] + ([run_len] if "crop" in kept and run_len < m else []):
        raise UserError(f"context {bad[0]} tokens is shorter than the {m} targets: each context needs c >= m "
                         f"(use larger --contexts or fewer --targets)")
    cells = [(c, meth) for c in contexts for meth in kept]
    grid = [(c, meth, why) for (c, meth), why in
            zip(cells, methods.reasons(model.config, [("crop" if meth == WHOLE else meth, c) for c, meth in cells]))]
    C = contexts[-1]
    try:  # one set of units for every context and method: the comparisons are paired
        starts = doc_windows(docs, C + 1, args["units"], np.random.default_rng(args["seed"]))
    except UserError as e:
        raise UserError(f"context {C} ({C / L:g}x, units of {C + 1} tokens): {e}") from None
    if len(starts) < args["units"]:  # doc_windows takes every window there is: say that the sample is smaller
        print(f"the held-out text holds {len(starts)} units of {C + 1} tokens, fewer than --units {args['units']}")
    units, t0, results = np.stack([tokens[s:s + C + 1] for s in starts]).astype(np.int64), time.time(), []
    for c, method, reason in tqdm(grid, desc="context", unit="eval"):
        s = None if method == WHOLE else factor_at(method, c, C, L, args["factor"])
        how = None if method == WHOLE else forward_args(method, c, L, run_len, s)
        # the context its targets see: c - m + 1 to c tokens, at most run_len under crop, at most L under whole-L
        t1, cap = time.time(), L if how is None else how.crop or c
        seen = [min(c - m + 1, cap), min(c, cap)] if how is not None and how.crop else [min(c, cap) - m + 1, min(c, cap)]
        per_unit = None if reason else score(model, units, c, m, how, L)
        loss, stderr = (None, None) if reason else mean_stderr(per_unit)
        results.append(dict(method=method, context=c, multiple=c / L, factor=s, context_range=seen, loss=loss,
                            ppl=None if reason else math.exp(loss), stderr=stderr, raw=per_unit,
                            available=reason is None, reason=reason, seconds=round(time.time() - t1, 3)))
    crop = {r["context"]: r["raw"] for r in results if r["method"] == "crop"}
    for r in results:  # paired differences to crop at the same context, on the same units
        ref = crop.get(r["context"]) if r["method"] != "crop" else None
        raw = r.pop("raw")
        r["diff_crop"], r["diff_crop_stderr"] = (None, None) if raw is None or ref is None else mean_stderr(raw - ref)
        r["per_unit"] = None if raw is None else np.round(raw, 6).tolist()
    report = dict(run=ckpt["config"].get("wandb_run_name") or args["run_dir"].name, weights_id=weights,
                  pos_emb=pos_emb, train_len=L,
                  context_len=run_len, units=len(starts), targets=m, seed=args["seed"], contexts=contexts, factor=args["factor"],
                  options=args["options"], seconds=round(time.time() - t0, 1), starts=[int(s) for s in starts],
                  results=results)
    write_all(args["out"], {"context.png": plot(report), **json_csv("context", report, results, CSV_FIELDS)})
    print(table(report), f"-> {args['out']}/context.{{json,csv,png}}", sep="\n")
    return report


def config_name(run):
    return re.sub(r"_seed\d+$", "", run)


def means(reports):
    """{config: {method: {context: (mean, standard error over its runs, runs)}}}: runs of one config (names differing
    only in _seed<k>) averaged, context by context; refused unless every run scored the same targets."""
    first = reports[0]
    if bad := [r["run"] for r in reports if (r["starts"], r["targets"]) != (first["starts"], first["targets"])]:
        raise UserError(f"run {bad[0]} scored other targets than {first['run']} (units of another length, or other "
                        "--targets): runs are averaged on the same targets only; give them contexts up to the same length")
    cells = {}
    for rep in reports:
        for r in rep["results"]:
            if r["available"]:
                cells.setdefault(config_name(rep["run"]), {}).setdefault(r["method"], {}).setdefault(r["context"], []).append(r["loss"])
    return {cfg: {m: {c: (float(np.mean(v)), float(np.std(v, ddof=1) / math.sqrt(len(v))) if len(v) > 1 else None, len(v))
                      for c, v in sorted(byc.items())} for m, byc in rows.items()} for cfg, rows in cells.items()}


def mean_table(avg, command):
    contexts = sorted({c for rows in avg.values() for byc in rows.values() for c in byc})
    lines = [f"# Loss by context on the same targets, mean over runs\n\n{generated(command)}\n",
             "Mean NLL of the same targets at each context (tokens) [+- standard error over the runs; n: runs]; "
             "the last column, the change per doubling of context.\n",
             "| config | method | n | " + " | ".join(map(str, contexts)) + " | per doubling |",
             "|---" * (len(contexts) + 4) + "|"]
    for cfg, rows in avg.items():
        for method, byc in rows.items():
            cells = [f"{byc[c][0]:.3f}" + (f" +-{byc[c][1]:.3f}" if byc[c][1] is not None else "") if c in byc else ""
                     for c in contexts]
            steps = [byc[b][0] - byc[a][0] for a, b in zip(contexts, contexts[1:]) if a in byc and b in byc and b == 2 * a]
            n = max(v[2] for v in byc.values())
            lines.append(f"| {cfg} | {method} | {n} | " + " | ".join(cells) + " | " + ", ".join(f"{d:+.3f}" for d in steps) + " |")
    return "\n".join(lines) + "\n"


def sweeps(args):
    runs = [args["run_dir"], *args["more_runs"]]
    if len(runs) == 1:
        return context_sweep(args)
    out = claim_output(args["out"], "context_mean")
    reports = [context_sweep(dict(args, run_dir=r, out=run_home(r))) for r in unique_runs(runs, "run")]
    avg = means(reports)
    command = shlex.join(["python", "lab/context.py", *map(str, runs), *args["options"]])
    md = mean_table(avg, command)
    write_page(out, "context_mean", md, dict(command=command, means=avg))
    return avg


def main(argv):
    return run_cli("context.py", lambda: sweeps(parse_args(argv)))


if __name__ == "__main__":
    main(sys.argv[1:])
