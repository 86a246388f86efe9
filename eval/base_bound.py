"""
The RoPE base lower bound of Men et al. (NeurIPS 2024): the smallest base whose
B_m = sum_i cos(m * base^(-2i/d)) stays >= 0 for every distance m up to a context length.

    python eval/base_bound.py --head_dim 128 --lengths 1024,16384,32768      # the smallest bases
    python eval/base_bound.py --head_dim 32 --lengths 4096 --bases 500,1e4,1e5,1e6 [--out DIR]

Prints, per length, the smallest passing base of the two-significant-digit grid (an upward scan: the
passing bases are not an interval, so a bisection could land on a failing one), and per --bases entry the
first distance where B_m < 0. With --bases it also plots B_m against m (base_bound.png) and writes the
numbers (base_bound.json) into --out (default: the current folder).
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, as in extrapolate.py

import json  # noqa: E402

from eval.extrapolate import number, parse_list  # noqa: E402
from eval.report import pyplot  # noqa: E402
from rope import base_bound_curve, first_negative, smallest_base  # noqa: E402
from runtime import arg_parser, run_cli  # noqa: E402


def parse_args(argv):
    p = arg_parser(__doc__)
    p.add_argument("--head_dim", default="128", help="dimension per attention head (n_embd / n_head)")
    p.add_argument("--lengths", default="1024,2048,4096,8192,16384,32768", help="context lengths")
    p.add_argument("--bases", default=None, help="bases to check and plot, e.g. 500,1e4,1e5,1e6")
    p.add_argument("--out", default=".", help="folder for base_bound.{json,png} (with --bases)")
    a = p.parse_args(argv)
    head_dim = number(a.head_dim, "head_dim", int, 2)
    if head_dim % 2:
        raise ValueError(f"RoPE needs an even head dimension, got --head_dim {head_dim}")
    lengths = parse_list(a.lengths, "lengths", int)
    bases = parse_list(a.bases, "bases", float) if a.bases else []
    if min(lengths) < 1 or any(not b > 1 for b in bases):
        raise ValueError(f"--lengths must be >= 1 and --bases > 1, got {a.lengths} and {a.bases}")
    return dict(head_dim=head_dim, lengths=lengths, bases=bases, out=Path(a.out))


def plot(head_dim, bases, max_len, path):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4))
    for i, base in enumerate(bases):
        curve = base_bound_curve(head_dim, base, max_len).numpy()
        ax.plot(range(max_len + 1), curve, lw=1, color=f"C{i}", label=f"base {base:g}")
        m = first_negative(head_dim, base, max_len)
        if m:
            ax.axvline(m, color=f"C{i}", ls=":", lw=1)
    ax.axhline(0, color="k", lw=0.8)
    ax.set(xscale="log", xlabel="relative distance m", ylabel="B_m", title=f"Men et al.'s B_m, head dim {head_dim}; "
           "dotted: first m with B_m < 0")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def base_bound(args):
    d, lengths = args["head_dim"], args["lengths"]
    smallest = {L: smallest_base(d, L) for L in lengths}
    for L, b in smallest.items():
        print(f"head dim {d}, context {L}: smallest base {b:.2g} (two significant digits)")
    if not args["bases"]:
        return smallest
    max_len = max(lengths)
    fails = {b: first_negative(d, b, max_len) for b in args["bases"]}
    for b, m in fails.items():
        print(f"base {b:g}: " + (f"B_m < 0 first at m = {m}" if m else f"B_m >= 0 up to m = {max_len}"))
    args["out"].mkdir(parents=True, exist_ok=True)
    report = dict(head_dim=d, smallest_base={str(L): b for L, b in smallest.items()},
                  first_negative={f"{b:g}": m for b, m in fails.items()}, max_len=max_len)
    (args["out"] / "base_bound.json").write_text(json.dumps(report, indent=1) + "\n")
    plot(d, args["bases"], max_len, args["out"] / "base_bound.png")
    print(f"-> {args['out']}/base_bound.{{json,png}}")
    return report


if __name__ == "__main__":
    run_cli("base_bound.py", lambda: base_bound(parse_args(sys.argv[1:])))
