"""What the scripts that print or plot share (formats, a method's colour, PNG bytes, JSON and CSV written
atomically), and eval/extrapolate.py's table and figure. No torch here."""
import csv
import io
import math
import re

import numpy as np

from common import json_safe, json_text, release_outputs, write_atomic
from eval.summary import PLOT_BINS, label

WEIGHTS = "weights_id"  # a result's key: eval.reading.weights_id of the checkpoint it read
CSV_FIELDS = ("method", "mode", "protocol", "eval_len", "factor", "stride", "loss", "ppl",
              "loss_beyond_train", "ppl_beyond_train", "stderr", "diff_none", "diff_none_stderr", "diff_crop",
              "diff_crop_stderr", "diff_none_inside", "diff_none_inside_stderr", "helped_tokens",
              "ppl_helped", "n_units", "tokens", "seconds", "available", "reason")
# One colour and marker per method in every command's figures; crop, the baseline, black and dashed; the
# methods that keep to crop (window, sinks, self-extend, rerope) far apart in hue.
STYLES = {"none": ("#1f77b4", "o"), "crop": ("k", "s"), "window": ("#8c564b", "^"), "sinks": ("#e377c2", "v"),
          "pi": ("#ff7f0e", "<"), "ntk": ("#2ca02c", ">"), "dynamic-ntk": ("#98df8a", "p"),
          "yarn": ("#d62728", "*"), "ntk-by-parts": ("#ff9896", "h"), "llama3": ("#9467bd", "X"),
          "logn": ("#7f7f7f", "d"), "ntk+logn": ("#bcbd22", "1"), "self-extend": ("#17becf", "D"),
          "rerope": ("#393b79", "P"), "crop-L": ("#555555", "8"), "leaky-rerope": ("#6b6ecf", "+"),
          "pairs": ("#8c6d31", "x")}
ALWAYS_DRAWN, BEST_N = ("none", "pi", "ntk", "yarn"), 4  # then the BEST_N others nearest crop (the zero line)


def fmt(x, digits=2):
    return "n/a" if x is None else f"{x:.{digits}f}"


def signed(x, digits=3):
    return "n/a" if x is None else f"{x:+.{digits}f}" if round(x, digits) else f"{0:.{digits}f}"  # no -0.000


def line_style(name):
    """STYLES' colour and marker; dashed: crop and a variant (dynamic-ntk (causal), yarn:beta_fast=4); grey
    and dotted: a name not in STYLES."""
    method = name.split(" (")[0].split(":")[0]
    color, marker = STYLES.get(method, ("0.5", "."))
    variant = method in STYLES and name not in (method, "dynamic-ntk (sequence)")
    ls = "--" if method == "crop" or variant else "-" if method in STYLES else ":"
    return dict(color=color, marker=marker, ls=ls)


def pyplot():
    import matplotlib
    matplotlib.use("Agg")  # files only: never a window, no display needed
    import matplotlib.pyplot as plt
    return plt


def shown(text):
    # a file name's bytes that are not UTF-8 are lone surrogates in Python: matplotlib and UTF-8 hold none
    return re.sub("[\ud800-\udfff]", "\ufffd", text)


def png(fig, tight=True, rect=None, **savefig):
    from matplotlib.text import Text
    for text in fig.findobj(Text):
        text.set_text(shown(text.get_text()))
    for axis in (axis for ax in fig.axes for axis in (ax.xaxis, ax.yaxis)):
        for f in (axis.get_major_formatter(), axis.get_minor_formatter()):  # tick labels are made when drawn
            f.format_ticks = lambda values, made=f.format_ticks: [shown(t) for t in made(values)]
    if tight:
        fig.tight_layout(rect=rect)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, **savefig)
    pyplot().close(fig)
    return buf.getvalue()


def json_csv(name, report, rows, fields):
    """{name.json: report, name.csv: the rows' fields} for write_all; None or a non-finite number: empty."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=fields)
    w.writeheader()
    w.writerows({k: "" if json_safe(r.get(k)) is None else r[k] for k in fields} for r in rows)
    return {f"{name}.json": json_text(report, indent=1) + "\n", f"{name}.csv": buf.getvalue()}


def write_all(out, files):
    """Write {name: text or bytes} into out, each atomically, then release its claim (claim_output): last."""
    out.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        write_atomic(out / name, lambda f: f.write(shown(data).encode() if isinstance(data, str) else data))
    release_outputs(out)


def panels(plt, n, per_row, stacked, size, **subplots):
    """(figure, per item its `stacked` panels top to bottom) for n items, size (w, h) inches an item."""
    cols, rows = min(per_row, n), math.ceil(n / per_row)
    fig, axes = plt.subplots(stacked * rows, cols, figsize=(size[0] * cols, size[1] * rows), squeeze=False,
                             **subplots)
    places = [tuple(axes[stacked * (i // cols) + k, i % cols] for k in range(stacked))
              for i in range(rows * cols)]
    for ax in (ax for place in places[n:] for ax in place):
        ax.axis("off")
    for place in places[:n]:
        place[-1].tick_params(labelbottom=True)  # with sharex, matplotlib shows them on the last row only
    return fig, places[:n]


def same_rows(entries):
    """{label: the first label with the same numbers at every length and protocol}: one forward under two
    names (ntk and dynamic-ntk (sequence) at factor 1), told to the reader, drawn once."""
    rows, first = {}, {}
    for r in entries:
        rows.setdefault(label(r), []).append((r["protocol"], r["eval_len"], r["loss"],
                                              r["loss_beyond_train"]))
    same = {k: first.setdefault(tuple(v), k) for k, v in rows.items() if None not in (c[2] for c in v)}
    return {k: v for k, v in same.items() if k != v}


def past_means(entries, L):
    """{label: its mean loss minus crop over the lengths past L}, where it has one at each."""
    rows = {}
    for r in entries:
        if r["eval_len"] > L and r["method"] != "crop":
            rows.setdefault(label(r), []).append(r.get("diff_crop"))
    return {k: sum(v) / len(v) for k, v in rows.items() if None not in v}


def plotted(entries, chosen, L):
    """The labels drawn: those chosen (--plot), else ALWAYS_DRAWN's and the BEST_N others nearest crop."""
    scored = list(dict.fromkeys(label(r) for r in entries if r.get("crop_curve")))
    if chosen:
        return [k for k in scored if k.split(" (")[0] in chosen]
    same, means = same_rows(entries), past_means(entries, L)
    others = sorted((k for k in scored if k.split(" (")[0] not in ALWAYS_DRAWN and k not in same
                     and k in means), key=means.get)
    return [k for k in scored if k.split(" (")[0] in ALWAYS_DRAWN] + others[:BEST_N]


def extrapolation_table(report):
    """Rows protocol: method, columns the lengths, cells ppl (ppl beyond L); per protocol the units scored."""
    L, lens, rows = report["train_len"], sorted({r["eval_len"] for r in report["results"]}), {}
    same = same_rows(report["results"])
    for r in report["results"]:
        cell = fmt(r["ppl"]) + ("" if r["ppl_beyond_train"] is None else f" ({fmt(r['ppl_beyond_train'])})")
        name = label(r) + (f" = {same[label(r)]}" if label(r) in same else "")
        rows.setdefault(f"{r['protocol']}: {name}", {})[r["eval_len"]] = cell
        rows.setdefault(f"{r['protocol']}: (units scored)", {})[r["eval_len"]] = str(r["n_units"])
    rows = sorted(rows.items(), key=lambda kv: kv[0].endswith("(units scored)"))  # the counts last
    table = [["protocol: method"] + [f"{T / L:g}x={T}" for T in lens]]
    table += [[name] + [cells.get(T, "") for T in lens] for name, cells in rows]
    width = [max(map(len, column)) for column in zip(*table)]
    (lo, hi), stride = report["crop_context"], min(report.get("crop_stride", 1), L)
    crop_l = (f"; crop-L: each past {L} from its last {L - stride + 1}..{L}"
              if any(r["method"] == "crop-L" for r in report["results"]) else "")
    return "\n".join([
        f"ppl (ppl beyond train length {L}) of {report['run']}; crop: truncation, each target past {hi} "
        f"from its last {lo}..{hi} tokens{crop_l}:",
        *("  ".join(c.ljust(w) for c, w in zip(row, width)) for row in table),
        *(["a = b: the same numbers in every cell (the same forward under two names)"] if same else []),
        "each length scores its own units (windows, or sliding stretches), as many as --tokens asks: numbers "
        "compare down a column, not along a row (crop's too)"])


def extrapolation_plot(report, chosen=None):
    """Per length past L, the loss minus crop's by position (paired, binned, +- one standard error)."""
    plt, L, ctx_len = pyplot(), report["train_len"], report.get("context_len", report["train_len"])
    entries = [r for r in report["results"] if r["protocol"] == "windows"]
    every = sorted({r["eval_len"] for r in entries})
    lens = [T for T in every if T > L] or every
    names, past = plotted(entries, chosen, L), [T for T in lens if T > L]
    fig, places = panels(plt, len(lens), 2, 1, (6, 4), sharey="row")
    for (ax,), T in zip(places, lens):
        ax.axvspan(0, L, color="0.93", lw=0)  # inside the training length: positions the model saw
        ax.axvline(L, color="0.3", ls="--", lw=1.5)
        ax.text(L, 1, f" L = {L}, trained", transform=ax.get_xaxis_transform(), va="top", fontsize=8,
                color="0.3")
        if ctx_len != L:  # a fine-tuned run: its own training length too
            ax.axvline(ctx_len, color="0.3", ls="-.", lw=1.5)
        ax.axhline(0, color="k", lw=2.5)
        for r in (r for r in entries if r["eval_len"] == T and label(r) in names and r.get("crop_curve")):
            c, style = r["crop_curve"], line_style(label(r))
            x, y, e = np.array(c["x"]) + 1, np.array(c["diff_crop"]), np.array(c["diff_crop_stderr"])
            ax.plot(x, y, lw=1.5, ms=4, **style)
            ax.fill_between(x, y - e, y + e, alpha=0.15, color=style["color"], lw=0)
        n = min(r["n_units"] for r in entries if r["eval_len"] == T)
        ax.set(title=f"eval length {T} ({T / L:g}x), {n} windows", xlim=(0, T),
               xlabel="token position in window", ylabel="loss minus crop (nats)")
        ax.tick_params(labelleft=True)  # sharey hides them on the right panel
    mean = {(label(r), r["eval_len"]): r.get("diff_crop") for r in entries}
    handles = [plt.Line2D([], [], lw=1.5, ms=4, **line_style(k)) for k in names]
    texts = [f"{k}: " + " / ".join(signed(mean.get((k, T))) for T in past) for k in names]
    tuned = f"; dash-dot: fine-tuned at {ctx_len}" if ctx_len != L else ""
    fig.legend([plt.Line2D([], [], color="k", lw=2.5), *handles], ["crop (the baseline): 0", *texts],
               loc="center left", bbox_to_anchor=(0.8, 0.5), fontsize=8, frameon=False, title_fontsize=8,
               title="mean past L, at " + " / ".join(f"{T / L:g}x" for T in past) + tuned)
    drawn = f"{', '.join(ALWAYS_DRAWN)} and the {BEST_N} others nearest crop on this run"
    fig.suptitle(f"{report['run']} ({report['pos_emb']}, trained at L = {L}, iter {report['checkpoint_iter']}"
                 "): loss minus crop's on the same tokens; below zero, a method predicts better than "
                 f"truncation to the last {L} tokens\ndrawn: {'those --plot chose' if chosen else drawn}; "
                 f"{PLOT_BINS} bins per length, bands one standard error over windows; every method's "
                 "numbers: extrapolation.json / .csv", fontsize=9)
    return png(fig, rect=(0, 0, 0.8, 0.95), bbox_inches="tight")  # tight: the legend beside the panels, uncut


def write_extrapolation(report, out, chosen=None):
    """extrapolation.{png,json,csv} into out, the figure first (a failure leaves the earlier outputs as they
    were), and the table printed."""
    write_all(out, {"extrapolation.png": extrapolation_plot(report, chosen),
                    **json_csv("extrapolation", report, report["results"], CSV_FIELDS)})
    print(extrapolation_table(report), f"{len(report['results'])} evaluations in {report['seconds']:.0f}s: "
          + ", ".join(f"{k} {v:.1f}s" for k, v in report["seconds_by_method"].items()),
          f"-> {out}/extrapolation.{{json,csv,png}}", sep="\n")
