"""Formatting and figure layout of evaluation results, shared by the scripts that print, plot or compare them
(no torch here)."""
import math


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


def save(fig, path):
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    pyplot().close(fig)


def panels(plt, n, per_row, stacked, size, **subplots):
    """A figure for n items, per_row of them a row, each item a column of `stacked` panels, size (w, h) inches
    per item: (figure, per item its panels top to bottom). The empty places of the last row are hidden."""
    cols, rows = min(per_row, n), math.ceil(n / per_row)
    fig, axes = plt.subplots(stacked * rows, cols, figsize=(size[0] * cols, size[1] * rows), squeeze=False, **subplots)
    places = [tuple(axes[stacked * (i // cols) + k, i % cols] for k in range(stacked)) for i in range(rows * cols)]
    for ax in (ax for place in places[n:] for ax in place):
        ax.axis("off")
    for place in places[:n]:
        place[-1].tick_params(labelbottom=True)  # with sharex, matplotlib shows them on the last row only
    return fig, places[:n]


def line_style(method, i):
    """crop, the baseline, black and dashed; any other method the i-th colour."""
    return dict(color="k", ls="--") if method == "crop" else dict(color=f"C{i % 10}")
