"""Formatting of evaluation results, shared by the scripts that print or compare them (no torch here)."""


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
