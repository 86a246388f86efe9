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
import json
import math
import sys
from pathlib import Path

import torch

from eval.report import pyplot
from rope import default_inv_freq, rotating_pairs
from runtime import arg_parser, number, parse_list, run_cli


def base_bound_curve(head_dim, base, max_len, start=0, fraction=None):
    """Men et al.'s B_m = sum_i cos(m * base^(-2i/d)) for m = start .. max_len, float64; B_0 = head_dim / 2.
    fraction (p-RoPE): only the highest round(fraction * d/2) pairs rotate; each unrotated one adds cos(0) = 1."""
    # the expected score gap between a key similar to the query and a random one at distance m is
    # proportional to B_m, so B_m < 0 means attention no longer prefers the similar token at that distance
    m = torch.arange(start, max_len + 1, dtype=torch.float64)
    inv_freq = default_inv_freq(head_dim, base)
    inv_freq[rotating_pairs(head_dim, fraction):] = 0
    return torch.cos(m[:, None] * inv_freq).sum(-1)


def first_negative(head_dim, base, max_len, fraction=None):
    """The first distance m in 1 .. max_len with B_m < 0 (where the bound fails), or None if there is none.
    In doubling chunks: most bases of a scan fail early."""
    start, size = 1, 256
    while start <= max_len:
        negative = (base_bound_curve(head_dim, base, min(start + size - 1, max_len), start, fraction) < 0).nonzero()
        if len(negative):
            return start + int(negative[0])
        start, size = start + size, 2 * size
    return None


def base_passes(head_dim, base, context_len):
    # B_m >= 0 for every m in 1 .. context_len
    return first_negative(head_dim, base, context_len) is None


def two_digit_bases(lowest, highest):
    # 1.0e1, 1.1e1, ..., 9.9e1, 1.0e2, ...: two significant digits, the resolution of the paper's Table 2
    exponent = math.floor(math.log10(lowest))
    while True:
        for mantissa in range(10, 100):
            base = float(f"{mantissa}e{exponent - 1}")
            if base > highest:
                return
            if base >= lowest:
                yield base
        exponent += 1


def smallest_base(head_dim, context_len, lowest=10.0, highest=1e12):
    """The RoPE base lower bound of Men et al. (NeurIPS 2024, "Base of RoPE Bounds Context Length") for a
    context length: the first base b of the grid lowest, ..., 9.9e1, 1.0e2, 1.1e2, ... (two significant digits)
    with B_m(b) >= 0 for every m in 1 .. context_len. Passing bases do not form an interval (B_m oscillates in b),
    so this is an upward scan, not a bisection; a larger base may still fail. It is how the paper's Table 2 reads,
    though at head dim 128 it gives 3.5e5 (16k) and 6.3e5 (32k) where the table's 3.1e5 and 6.4e5 fail before
    those lengths. Raises ValueError if no base up to `highest` passes."""
    for base in two_digit_bases(lowest, highest):
        if base_passes(head_dim, base, context_len):
            return base
    raise ValueError(f"no base in [{lowest:g}, {highest:g}] keeps B_m >= 0 up to m = {context_len}")


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
