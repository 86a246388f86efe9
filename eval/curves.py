"""
Training curves of one or more runs, from the log.jsonl that train.py appends at every evaluation.

    python eval/curves.py out/run_a out/run_b [...] [--out curves.png]

Plots the validation loss and, for runs trained with retrieval_mix, the copy top-1 accuracy (a random
segment repeated inside the training length, in held-out text) against the iteration. No torch needed.
"""
import json
from pathlib import Path

from eval.report import pyplot, save
from runtime import arg_parser, run_cli

YLABELS = {"val": "validation loss", "copy_top1": "copy top-1 inside the training length"}


def read_log(run_dir):
    path = Path(run_dir) / "log.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"no training log at {path}; train.py writes it at every evaluation")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def curves(args):
    logs = {Path(r).name: read_log(r) for r in args.runs}
    metrics = [m for m in YLABELS if m == "val" or any(m in e for log in logs.values() for e in log)]
    fig, axes = pyplot().subplots(1, len(metrics), figsize=(6 * len(metrics), 4), squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        for name, log in logs.items():
            points = [(e["iter"], e[metric]) for e in log if metric in e]
            if points:
                ax.plot(*zip(*points), marker=".", label=name)
        ax.set(xlabel="iteration", ylabel=YLABELS[metric])
        ax.legend(fontsize=8)
    save(fig, args.out)
    for name, log in logs.items():
        print(f"{name}: iter {log[-1]['iter']}, " + ", ".join(f"{m} {log[-1][m]:.4f}" for m in metrics if m in log[-1]))
    print(f"-> {args.out}")


if __name__ == "__main__":
    p = arg_parser(__doc__)
    p.add_argument("runs", nargs="+", help="run folders holding log.jsonl")
    p.add_argument("--out", default="curves.png")
    run_cli("curves.py", lambda: curves(p.parse_args()))
