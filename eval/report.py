"""Formatting, figure layout and output writing shared by the scripts that print, plot or compare, and eval/extrapolate.py's
table and figure (no torch here)."""
import csv
import io
import json
import math
from pathlib import Path

import numpy as np

from common import UserError, json_safe, json_text, release_outputs, write_atomic


def label(r):
    return r["method"] + (f" ({r['mode']})" if r["mode"] else "")


def fmt(x, digits=2):
    return "n/a" if x is None else f"{x:.{digits}f}"


def pyplot():
    """matplotlib's pyplot, drawing to files only (the Agg backend: never a window, works without a display)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def png(fig, tight=True, rect=None, **savefig):
    """The figure as PNG bytes (laid out tight within rect unless tight is False), then closed: for write_all."""
    if tight:
        fig.tight_layout(rect=rect)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, **savefig)
    pyplot().close(fig)
    return buf.getvalue()


def json_csv(name, report, rows, fields):
    """{name.json: the report, name.csv: the rows' fields, None (or a non-finite number) as an empty cell}, for write_all."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=fields)
    w.writeheader()
    w.writerows({k: "" if json_safe(r.get(k)) is None else r[k] for k in fields} for r in rows)
    return {f"{name}.json": json_text(report, indent=1) + "\n", f"{name}.csv": buf.getvalue()}


def write_all(out, files):
    """Write {name: text or bytes} into the folder out, each atomically (common.write_atomic): call it last. Then the
    folder's claim (common.claim_output) is released: the outputs are in place."""
    out.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        write_atomic(out / name, lambda f: f.write(data.encode() if isinstance(data, str) else data))
    release_outputs(out)


def panels(plt, n, per_row, stacked, size, **subplots):
    """(figure, per item its `stacked` panels top to bottom) for n items, per_row a row, size (w, h) inches per item."""
    cols, rows = min(per_row, n), math.ceil(n / per_row)
    fig, axes = plt.subplots(stacked * rows, cols, figsize=(size[0] * cols, size[1] * rows), squeeze=False, **subplots)
    places = [tuple(axes[stacked * (i // cols) + k, i % cols] for k in range(stacked)) for i in range(rows * cols)]
    for ax in (ax for place in places[n:] for ax in place):
        ax.axis("off")
    for place in places[:n]:
        place[-1].tick_params(labelbottom=True)  # with sharex, matplotlib shows them on the last row only
    return fig, places[:n]


def line_style(method, i):
    """crop black dashed; the others matplotlib's 10 colours, dash-dotted from the 11th on so no two look alike."""
    return dict(color="k", ls="--") if method == "crop" else dict(color=f"C{i % 10}", ls="-" if i < 10 else "-.")


PLOTTED, PLOTTED_N = ("none", "pi", "ntk", "yarn", "llama3", "window", "sinks", "logn"), 5  # a handful: all stay in the JSON
PLOT_BINS = 16  # per panel: bins grow with the length, so the 16x panel (few windows) is not one window's noise


def extrapolation_table(report):
    """eval/extrapolate.py's text table: rows protocol / method (mode), columns eval lengths, cells ppl (ppl beyond the training length)."""
    L, lens, rows = report["train_len"], sorted({r["eval_len"] for r in report["results"]}), {}
    for r in report["results"]:
        cell = fmt(r["ppl"]) + ("" if r["ppl_beyond_train"] is None else f" ({fmt(r['ppl_beyond_train'])})")
        rows.setdefault(f"{r['protocol']}: {label(r)}", {})[r["eval_len"]] = cell
    head = ["protocol: method"] + [f"{T / L:g}x={T}" for T in lens]
    body = [[name] + [cells.get(T, "") for T in lens] for name, cells in rows.items()]
    width = [max(len(row[i]) for row in [head] + body) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, width)) for row in [head] + body]
    lo, hi = report["crop_context"]
    return (f"ppl (ppl beyond train length {L}) of {report['run']}; crop: truncation, each target past {hi} "
            f"from its last {lo}..{hi} tokens:\n" + "\n".join(lines))


def plotted(entries, chosen):
    """The methods drawn: those chosen (--plot), else the first PLOTTED_N of PLOTTED that were scored."""
    scored = [m for m in dict.fromkeys(r["method"] for r in entries if r.get("crop_curve"))]
    return [m for m in scored if m in chosen] if chosen else [m for m in PLOTTED if m in scored][:PLOTTED_N]


def extrapolation_plot(report, chosen=None):
    """eval/extrapolate.py's extrapolation.png as bytes: per length past training, the loss minus crop's by position (paired, binned, +- one standard error)."""
    plt, L, ctx_len = pyplot(), report["train_len"], report.get("context_len", report["train_len"])
    entries = [r for r in report["results"] if r["protocol"] == "windows"]
    lens = [T for T in sorted({r["eval_len"] for r in entries}) if T > L] or sorted({r["eval_len"] for r in entries})
    names = plotted(entries, chosen)
    fig, places = panels(plt, len(lens), 2, 1, (6.5, 4))
    for (ax,), T in zip(places, lens):
        ax.axhline(0, color="k", lw=2, label="crop (the baseline): 0")
        for i, r in enumerate(r for r in entries if r["eval_len"] == T and r["method"] in names and r.get("crop_curve")):
            c, style = r["crop_curve"], line_style(r["method"], i)
            x, y, e = np.array(c["x"]) + 1, np.array(c["diff_crop"]), np.array(c["diff_crop_stderr"])
            ax.plot(x, y, lw=1.5, marker=".", label=f"{label(r)}: {fmt(r['diff_crop'], 3)}", **style)
            ax.fill_between(x, y - e, y + e, alpha=0.15, color=style["color"], lw=0)
        ax.axvline(L, color="grey", ls=":", lw=1)
        if ctx_len != L:  # a fine-tuned run: its own training length too
            ax.axvline(ctx_len, color="grey", ls="-.", lw=1)
        n = min(r["n_units"] for r in entries if r["eval_len"] == T)
        tuned = f", dash-dot: fine-tuned at {ctx_len}" if ctx_len != L else ""
        ax.set(title=f"eval length {T} ({T / L:g}x), {n} windows; dotted: train length {L}{tuned}",
               xlabel="token position in window", ylabel="loss minus crop (nats)")
        ax.legend(fontsize=7, title="mean past train length", title_fontsize=7)
    fig.suptitle(f"{report['run']} ({report['pos_emb']}, trained at {L}, iter {report['checkpoint_iter']}): loss minus crop's "
                 f"on the same tokens; below zero, a method predicts better than truncation to the last {L} tokens\n"
                 f"{PLOT_BINS} bins per length, bands one standard error over windows; every method's numbers: "
                 f"extrapolation.json / .csv", fontsize=10)
    return png(fig, rect=(0, 0, 1, 0.94))


RESULT_KEYS = ("protocol", "method", "mode", "eval_len")  # what every table reads of a result


def load_report(run_dir, protocol=None):
    """A run's extrapolation.json (compare.py, the study); an error if it is missing, broken, empty or (protocol given) has none of its entries."""
    path = Path(run_dir) / "extrapolation.json"
    if not path.is_file():
        raise FileNotFoundError(f"no {path}; evaluate the run first: python eval/extrapolate.py {run_dir}")
    try:
        report = json.loads(path.read_text())
        missing = [k for k in ("run", "train_len", "units", "results") if k not in report]
    except (ValueError, TypeError) as e:
        raise UserError(f"{path} is not valid JSON ({e}); re-run eval/extrapolate.py {run_dir}") from None
    if not missing and not isinstance(report["results"], list):
        missing = ["a list of results"]
    if not missing and (bad := [k for r in report["results"] for k in RESULT_KEYS if not isinstance(r, dict) or k not in r]):
        missing = [f"{bad[0]} in its results"]
    if missing:
        raise UserError(f"{path} is not an extrapolate.py result (missing {', '.join(missing)}); re-run eval/extrapolate.py {run_dir}")
    if not any(protocol in (None, r["protocol"]) for r in report["results"]):
        raise UserError(f"{path} has no {protocol or 'evaluation'} results; re-run eval/extrapolate.py {run_dir}")
    return report
