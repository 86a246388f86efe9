"""Formatting, figure layout and output writing shared by the scripts that print, plot or compare (no torch here)."""
import csv
import io
import json
import math
from pathlib import Path


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
    from runtime import finite, json_text
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=fields)
    w.writeheader()
    w.writerows({k: "" if finite(r.get(k)) is None else r[k] for k in fields} for r in rows)
    return {f"{name}.json": json_text(report, indent=1) + "\n", f"{name}.csv": buf.getvalue()}


def write_all(out, files):
    """Write {name: text or bytes} into the folder out, each atomically (runtime.write_atomic): call it last. Then the
    folder's claim (runtime.claim_output) is released: the outputs are in place."""
    from runtime import release_outputs, write_atomic  # runtime imports torch: not on import of this module
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


RESULT_KEYS = ("protocol", "method", "mode", "eval_len")  # what every table reads of a result


def load_report(run_dir, protocol=None):
    """A run's extrapolation.json (compare.py, the study); an error if it is missing, broken, empty or (protocol given) has none of its entries."""
    from runtime import UserError  # runtime imports torch: not on import of this module
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
