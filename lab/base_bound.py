"""The RoPE base lower bound of Men et al. (NeurIPS 2024, "Base of RoPE Bounds Context Length"): the smallest base whose
B_m = sum_i cos(m * base^(-2i/d)) stays >= 0 for every distance m up to a context length; with --bases it also writes
base_bound.{json,png} (B_m against m) into --out (default: the current folder), and with --copy, one study folder per
base, base_bound_copy.png: each base's copy top-1 by distance beside its B_m."""
import itertools
import json
import math
import sys
from pathlib import Path


from eval.report import png, pyplot, write_all
from lab.bound import base_bound_curve, first_negative, trained_freq
from common import UserError, claim_output, command_parser, json_text, parse_number, parse_list, run_cli, shared_values


def smallest_base(head_dim, context_len, lowest=10.0, highest=1e12):
    """The first base of the two-significant-digit grid (Table 2's resolution) from lowest with B_m >= 0 for m in
    1 .. context_len: an upward scan, as the passing bases are no interval (docs/methodology.md, the base bound)."""
    grid = (float(f"{m}e{e}") for e in itertools.count(math.floor(math.log10(lowest)) - 1) for m in range(10, 100))
    for base in itertools.takewhile(lambda b: b <= highest, grid):
        if base >= lowest and first_negative(trained_freq(head_dim, base), context_len) is None:
            return base
    raise UserError(f"no base in [{lowest:g}, {highest:g}] keeps B_m >= 0 up to m = {context_len}")


def parse_args(argv):
    p = command_parser(__doc__, "out", out=".")
    p.add_argument("--head_dim", default="128", help="dimension per attention head (n_embd / n_head)")
    p.add_argument("--lengths", default="1024,2048,4096,8192,16384,32768", help="context lengths")
    p.add_argument("--bases", default=None, help="bases to check and plot, e.g. 500,1e4,1e5,1e6")
    p.add_argument("--copy", nargs="+", default=[], metavar="STUDY", help="a study folder per base (its copy probe)")
    a = p.parse_args(argv)
    if (head_dim := parse_number(a.head_dim, "head_dim", int, 2)) % 2:
        raise UserError(f"RoPE needs an even head dimension, got --head_dim {head_dim}")
    lengths, bases = parse_list(a.lengths, "lengths", int), parse_list(a.bases, "bases", float) if a.bases else []
    if min(lengths) < 1 or any(not b > 1 for b in bases):
        raise UserError(f"--lengths must be >= 1 and --bases > 1, got {a.lengths} and {a.bases}")
    if a.copy and len(a.copy) != len(bases):
        raise UserError(f"--copy needs one study folder per base: {len(bases)} bases, got {len(a.copy)} folders")
    return dict(shared_values(a), head_dim=head_dim, lengths=lengths, bases=bases, copy=[Path(c) for c in a.copy])


def draw_bound(ax, head_dim, base, max_len, first, color, label, scale=1.0):
    """B_m (times scale) against m, dotted where it first goes negative (first: first_negative's answer)."""
    ax.plot(range(max_len + 1), base_bound_curve(head_dim, base, max_len).numpy() * scale, lw=1, color=color, label=label)
    if first:
        ax.axvline(first, color=color, ls=":", lw=1)


def plot(head_dim, bases, max_len, fails):
    fig, ax = pyplot().subplots(figsize=(8, 4))
    for i, base in enumerate(bases):
        draw_bound(ax, head_dim, base, max_len, fails[base], f"C{i}", f"base {base:g}")
    ax.axhline(0, color="k", lw=0.8)
    ax.set(xscale="log", xlabel="relative distance m", ylabel="B_m", title=f"Men et al.'s B_m, head dim {head_dim}; "
           "dotted: first m with B_m < 0")
    ax.legend(fontsize=8)
    return png(fig)


def copy_top1(study):
    """[(distance, mean, lo, hi)] of the copy probe's top-1 with no method, from a study folder's study.json."""
    path = study / "study.json"
    if not path.is_file():
        raise UserError(f"--copy {study}: no study.json there (run lab/study.py with --probe_args including copy)")
    rows = [r for r in json.loads(path.read_text())["probe_rows"] if r["probe"] == "copy" and r["method"] == "none"]
    if not rows:
        raise UserError(f"--copy {study}: its study has no copy probe rows for the method none")
    return sorted((r["at"], *(r["value"][k] for k in ("mean", "lo", "hi"))) for r in rows)


def plot_copy(head_dim, bases, max_len, fails, copies):
    """A panel per base: B_m / (d/2) (the mean cosine, on copy top-1's scale) and the copy top-1 with its interval."""
    fig, axes = pyplot().subplots(1, len(bases), figsize=(3.4 * len(bases), 3.4), sharey=True, squeeze=False)
    for ax, base, rows in zip(axes[0], bases, copies):
        draw_bound(ax, head_dim, base, max_len, fails[base], "C0", "B_m / (d/2)", scale=2 / head_dim)
        at, mean, lo, hi = map(list, zip(*rows))
        ax.errorbar(at, mean, yerr=[[a - b for a, b in zip(mean, lo)], [b - a for a, b in zip(mean, hi)]], fmt="o",
                    color="C3", capsize=3, label="copy top-1")
        ax.axhline(0, color="k", lw=0.6)
        ax.set(title=f"base {base:g}", xlabel="distance m")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"copy top-1 (95% interval) against Men et al.'s B_m, head dim {head_dim}; dotted: first m with B_m < 0",
                 fontsize=9)
    return png(fig)


def base_bound(args):
    d, max_len = args["head_dim"], max(args["lengths"])
    smallest = {L: smallest_base(d, L) for L in args["lengths"]}
    print(*(f"head dim {d}, context {L}: smallest base {b:.2g} (two significant digits)" for L, b in smallest.items()), sep="\n")
    if not args["bases"]:
        return smallest
    claim_output(args["out"], "base_bound")
    fails = {b: first_negative(trained_freq(d, b), max_len) for b in args["bases"]}
    print(*(f"base {b:g}: " + (f"B_m < 0 first at m = {m}" if m else f"B_m >= 0 up to m = {max_len}")
            for b, m in fails.items()), sep="\n")
    copies = [copy_top1(study) for study in args["copy"]]
    report = dict(head_dim=d, smallest_base={str(L): b for L, b in smallest.items()},
                  first_negative={f"{b:g}": m for b, m in fails.items()}, max_len=max_len,
                  **({"copy_top1": {f"{b:g}": rows for b, rows in zip(args["bases"], copies)}} if copies else {}))
    files = {"base_bound.png": plot(d, args["bases"], max_len, fails), "base_bound.json": json_text(report, indent=1) + "\n"}
    if copies:
        files["base_bound_copy.png"] = plot_copy(d, args["bases"], max_len, fails, copies)
    write_all(args["out"], files)
    print(f"-> {args['out']}/{', '.join(files)}")
    return report


if __name__ == "__main__":
    run_cli("base_bound.py", lambda: base_bound(parse_args(sys.argv[1:])))
