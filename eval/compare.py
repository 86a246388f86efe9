"""Compare runs evaluated by eval/extrapolate.py on one plot and in one markdown table:
`python eval/compare.py RUN_DIR... [--out out/compare] [--metric diff_crop|ppl_beyond_train|ppl] [--protocol windows|sliding]`
writes compare.md and compare.png into --out. The default, diff_crop: the loss minus crop's past the training length L."""
import sys


from eval.reading import load_report, plain_log_labels, run_labels, unique_runs
from eval.report import fmt, label, line_style, png, pyplot, signed, write_all
from common import UserError, claim_output, command_parser, run_cli, shared_values

METRICS = {"diff_crop": "loss minus crop past L (nats)", "ppl_beyond_train": "perplexity past L",
           "ppl": "perplexity over all tokens (inside L too)"}
PROTOCOLS = ("windows", "sliding")
RUN_LINES = ("-", "--", ":", "-.")  # one line style per run, the method's colour and marker in every run


def lines(reports, protocol):
    """({row label: {multiple of train length: entry}}, the multiples in order): one row per run / method (mode)."""
    rows = {}
    for rep, r in ((rep, r) for rep in reports for r in rep["results"] if r["protocol"] == protocol):
        rows.setdefault(f"{rep['run']} / {label(r)}", {})[r["eval_len"] / rep["train_len"]] = r
    return rows, sorted({m for cells in rows.values() for m in cells})


def cell(r, metric):
    if metric == "diff_crop" and r["method"] == "crop" and r.get("loss_beyond_train") is not None:
        return "0 (crop)"
    return signed(r.get(metric)) if metric == "diff_crop" else fmt(r.get(metric))


def markdown(reports, metric, protocol):
    (rows, cols), train_lens = lines(reports, protocol), {rep["train_len"] for rep in reports}
    # a length where no run has the metric (1x, past L: no targets) is left out
    cols = [m for m in cols if any(m in cells and cells[m].get(metric) is not None for cells in rows.values())] or cols
    head = [f"{m:g}x" + (f" ({round(m * min(train_lens))})" if len(train_lens) == 1 else "") for m in cols]
    body = [f"| {name} | " + " | ".join(cell(cells[m], metric) if m in cells else "" for m in cols) + " |"
            for name, cells in rows.items()]
    return (f"{METRICS[metric]} by eval length (multiples of the training length), {protocol} protocol\n\n"
            + "\n".join(["| run / method (mode) | " + " | ".join(head) + " |", "| --- |" + " ---: |" * len(head), *body]) + "\n")


def plot(reports, metric, protocol):
    """PNG bytes: every run on one plot, a method's colour and marker the same in every run (eval/report.py's STYLES), a
    line style per run; each method's points nudged sideways a little, so methods on the same numbers stay visible."""
    plt = pyplot()
    names = list(dict.fromkeys(label(r) for rep in reports for r in rep["results"] if r["protocol"] == protocol))
    spread = names[0::3] + names[1::3] + names[2::3]  # neighbours in the table (crop, window, sinks) nudged far apart
    fig, ax = plt.subplots(figsize=(9, 5.5))
    if metric == "diff_crop":
        ax.axhline(0, color="k", lw=2.5)
    ticks = set()
    for k, rep in enumerate(reports):
        for name in names:
            if points := sorted((r["eval_len"] / rep["train_len"], r[metric]) for r in rep["results"]
                                if r["protocol"] == protocol and label(r) == name and r.get(metric) is not None):
                (x, y), nudge = zip(*points), 2 ** (0.025 * (spread.index(name) - (len(names) - 1) / 2))
                ticks.update(x)
                ax.plot([m * nudge for m in x], y, lw=1.2, ms=5, alpha=0.85,
                        **dict(line_style(name), ls=RUN_LINES[k % len(RUN_LINES)]))
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(ticks), [f"{m:g}x" for m in sorted(ticks)])
    ax.minorticks_off()
    if metric != "diff_crop":
        ax.set_yscale("log")
        plain_log_labels(ax.yaxis)
    ax.set(xlabel="eval length / training length L", ylabel=METRICS[metric])
    method_keys = [plt.Line2D([], [], color="k", lw=2.5, label="crop: 0")] if metric == "diff_crop" else []
    method_keys += [plt.Line2D([], [], ms=5, label=n, **line_style(n)) for n in names if not (metric == "diff_crop" and n == "crop")]
    legend = ax.legend(handles=method_keys, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8, title="method",
                       frameon=False)
    if len(reports) > 1:
        ax.add_artist(legend).set_clip_on(False)  # kept beside the next legend, and not cut to the axes
        ax.legend(handles=[plt.Line2D([], [], color="0.3", ls=RUN_LINES[k % len(RUN_LINES)], label=rep["run"])
                           for k, rep in enumerate(reports)], loc="lower left", bbox_to_anchor=(1.01, 0), fontsize=8,
                  title="run", frameon=False)
    ax.set_title(f"{METRICS[metric]} against eval length, {protocol} protocol" +
                 ("\nbelow 0: better than truncation to the last L tokens" if metric == "diff_crop" else ""), fontsize=10)
    return png(fig, bbox_inches="tight")  # tight: the legends beside the plot, uncut


def compare(run_dirs, out, metric, protocol):
    for name, value, allowed in (("metric", metric, METRICS), ("protocol", protocol, PROTOCOLS)):
        if value not in allowed:
            raise UserError(f"unknown --{name} {value!r}; allowed: {', '.join(allowed)}")
    claim_output(out, "compare")
    reports = [load_report(d, protocol) for d in unique_runs(run_dirs, "run")]  # a run with nothing to compare is an error, not a gap
    # dev and test are different text: their numbers do not compare
    if len(docs := {rep.get("docs", "all") for rep in reports}) > 1:
        scored = ", ".join(f"{d} on {rep.get('docs', 'all')}" for d, rep in zip(run_dirs, reports))
        raise UserError(f"the reports were scored on different held-out documents ({scored}): "
                        f"evaluate every run with the same --docs ({', '.join(sorted(docs))} given)")
    for rep, name in zip(reports, run_labels(run_dirs, [rep["run"] for rep in reports])):
        rep["run"] = name  # two runs named alike would share a row
    if lacking := [d for d, rep in zip(run_dirs, reports) if any(metric not in r for r in rep["results"] if r.get("available", True))]:
        raise UserError(f"{lacking[0]}/extrapolation.json has no {metric} in its results; re-run eval/extrapolate.py {lacking[0]}")
    table = markdown(reports, metric, protocol)
    write_all(out, {"compare.png": plot(reports, metric, protocol), "compare.md": table})
    print(table + f"-> {out}/compare.{{md,png}}")


def parse_args(argv):
    p = command_parser(__doc__, "out", out="out/compare")
    p.add_argument("run_dirs", nargs="+", help="run folders holding extrapolation.json")
    p.add_argument("--metric", default="diff_crop", help=f"plotted metric: {' | '.join(METRICS)} (default diff_crop: "
                   "the loss minus crop's past the training length)")
    p.add_argument("--protocol", default="windows", help=f"{' | '.join(PROTOCOLS)} (default windows)")
    a = p.parse_args(argv)
    return dict(vars(a), **shared_values(a))


def main(argv):
    run_cli("compare.py", lambda: compare(**parse_args(argv)))


if __name__ == "__main__":
    main(sys.argv[1:])
