"""Compare runs evaluated by eval/extrapolate.py, one figure and one markdown table across runs:
`python eval/compare.py RUN_DIR... [--out out/compare] [--metric ppl|ppl_beyond_train] [--protocol windows|sliding]`
writes compare.md and compare.png into --out."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: runs from any folder

from eval.report import fmt, label, line_style, load_report, panels, png, pyplot, write_all
from common import UserError, claim_output, command_parser, unique_runs, run_cli, run_labels, shared_values

METRICS = ("ppl", "ppl_beyond_train")
PROTOCOLS = ("windows", "sliding")


def lines(reports, protocol):
    """({row label: {multiple of train length: entry}}, the multiples in order): one row per run / method (mode)."""
    rows = {}
    for rep, r in ((rep, r) for rep in reports for r in rep["results"] if r["protocol"] == protocol):
        rows.setdefault(f"{rep['run']} / {label(r)}", {})[r["eval_len"] / rep["train_len"]] = r
    return rows, sorted({m for cells in rows.values() for m in cells})


def markdown(reports, metric, protocol):
    (rows, cols), train_lens = lines(reports, protocol), {rep["train_len"] for rep in reports}
    head = [f"{m:g}x" + (f" ({round(m * min(train_lens))})" if len(train_lens) == 1 else "") for m in cols]
    body = [f"| {name} | " + " | ".join(fmt(cells[m][metric]) if m in cells else "" for m in cols) + " |" for name, cells in rows.items()]
    return (f"{metric.replace('_', ' ')} by eval length (multiples of the training length), {protocol} protocol\n\n"
            + "\n".join(["| run / method (mode) | " + " | ".join(head) + " |", "| --- |" + " ---: |" * len(head), *body]) + "\n")


def plot(reports, metric, protocol):
    """PNG bytes: one panel per run (three a row, shared axes), one line per method (mode), the same colour in every panel."""
    names = list(dict.fromkeys(label(r) for rep in reports for r in rep["results"] if r["protocol"] == protocol))
    fig, places = panels(pyplot(), len(reports), 3, 1, (5, 4), sharex=True, sharey=True)
    for (ax,), rep in zip(places, reports):
        for name in names:
            if points := sorted((r["eval_len"] / rep["train_len"], r[metric]) for r in rep["results"]
                                if r["protocol"] == protocol and label(r) == name and r[metric] is not None):
                ax.plot(*zip(*points), marker="o", ms=3, lw=1.2, label=name, **line_style(name, names.index(name)))
        ax.set(title=rep["run"], xlabel="eval length / training length", ylabel=metric.replace("_", " "))
        ax.legend(fontsize=7, ncol=2)
    ax, ticks = places[0][0], lines(reports, protocol)[1]
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [f"{m:g}x" for m in ticks])
    ax.minorticks_off()
    ax.set_yscale("log")
    fig.suptitle(f"{metric.replace('_', ' ')} against eval length, {protocol} protocol")
    return png(fig)


def compare(run_dirs, out, metric, protocol):
    for name, value, allowed in (("metric", metric, METRICS), ("protocol", protocol, PROTOCOLS)):
        if value not in allowed:
            raise UserError(f"unknown --{name} {value!r}; allowed: {', '.join(allowed)}")
    claim_output(out, "compare")
    reports = [load_report(d, protocol) for d in unique_runs(run_dirs, "run")]  # a run with nothing to compare is an error, not a gap
    for rep, name in zip(reports, run_labels(run_dirs, [rep["run"] for rep in reports])):
        rep["run"] = name  # two runs named alike would share a row
    if lacking := [d for d, rep in zip(run_dirs, reports) if any(metric not in r for r in rep["results"])]:
        raise UserError(f"{lacking[0]}/extrapolation.json has no {metric} in its results; re-run eval/extrapolate.py {lacking[0]}")
    table = markdown(reports, metric, protocol)
    write_all(out, {"compare.png": plot(reports, metric, protocol), "compare.md": table})
    print(table + f"-> {out}/compare.{{md,png}}")


def parse_args(argv):
    p = command_parser(__doc__, "out", out="out/compare")
    p.add_argument("run_dirs", nargs="+", help="run folders holding extrapolation.json")
    p.add_argument("--metric", default="ppl", help=f"plotted metric: {' | '.join(METRICS)} (default ppl)")
    p.add_argument("--protocol", default="windows", help=f"{' | '.join(PROTOCOLS)} (default windows)")
    a = p.parse_args(argv)
    return dict(vars(a), **shared_values(a))


def main(argv):
    run_cli("compare.py", lambda: compare(**parse_args(argv)))


if __name__ == "__main__":
    main(sys.argv[1:])
