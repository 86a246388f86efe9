"""Training curves of runs from the log.jsonl train.py appends at every evaluation: the validation loss and, for runs
trained with retrieval_mix, the copy top-1 inside the training length: `python lab/curves.py RUN_DIR... [--out out/curves]`
writes curves.png into --out."""
import json
import sys
from pathlib import Path


from eval.report import png, pyplot, write_all
from common import UserError, claim_output, command_parser, run_cli, shared_values
from eval.reading import run_labels, unique_runs

YLABELS = {"val": "validation loss", "copy_top1": "copy top-1 inside the training length"}


def read_log(run_dir):
    path = Path(run_dir) / "log.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"no training log at {path}; train.py writes it at every evaluation")
    if not (log := [entry(path, i, line) for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
                    if line.strip()]):
        raise UserError(f"{path} is empty: no evaluation logged yet; train.py appends one every eval_interval iterations")
    return log


def entry(path, lineno, line):
    """One log.jsonl line: a JSON object with an integer iter."""
    try:
        e = json.loads(line)
    except ValueError as err:
        raise UserError(f"{path}:{lineno} is not a JSON line ({err}); fix or remove that line") from None
    if not isinstance(e, dict) or not isinstance(e.get("iter"), int):
        raise UserError(f"{path}:{lineno} is not a train.py log entry (no integer 'iter'); fix or remove that line")
    return e


def curves(runs, out):
    claim_output(out, "curves")
    runs = unique_runs(runs, "run")
    logs = dict(zip(run_labels(runs, [Path(r).resolve().name for r in runs]), map(read_log, runs)))
    metrics = [m for m in YLABELS if m == "val" or any(m in e for log in logs.values() for e in log)]
    fig, axes = pyplot().subplots(1, len(metrics), figsize=(6 * len(metrics), 4), squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        for name, log in logs.items():
            if points := [(e["iter"], e[metric]) for e in log if metric in e]:
                ax.plot(*zip(*points), marker=".", label=name)
        ax.set(xlabel="iteration", ylabel=YLABELS[metric])
        ax.legend(fontsize=8)
    write_all(out, {"curves.png": png(fig)})
    print(*(f"{name}: iter {log[-1]['iter']}, " + ", ".join(f"{m} {log[-1][m]:.4f}" for m in metrics if m in log[-1])
            for name, log in logs.items()), f"-> {out}/curves.png", sep="\n")


def parse_args(argv):
    p = command_parser(__doc__, "out", out="out/curves")
    p.add_argument("runs", nargs="+", help="run folders holding log.jsonl")
    a = p.parse_args(argv)
    return dict(vars(a), **shared_values(a))


def main(argv):
    run_cli("curves.py", lambda: curves(**parse_args(argv)))


if __name__ == "__main__":
    main(sys.argv[1:])
