"""Reading eval/extrapolate.py's reports back, for the commands that compare runs (eval/compare.py; the lab's
study, ladder and their families): each checked against the weights its run holds now; the runs given, each
once and labelled; and the log axis their figures share. Off the quick start's path: extrapolate.py writes
reports, it never reads one back."""
import json
import math
from pathlib import Path

from common import UserError, digest_id, run_home
from eval.report import WEIGHTS

RESULT_KEYS = ("protocol", "method", "mode", "eval_len")  # what every table reads of a result
NUMBERS = ("loss", "ppl", "loss_beyond_train", "ppl_beyond_train", "stderr", "diff_none", "diff_crop",
           "diff_none_inside")


def weights_id(path):
    """A checkpoint's identity (path: a ckpt.pt or its run folder; None if none): its bytes', not its path's,
    so a result recording the id it read is told from one of other weights in the same folder."""
    path = Path(path) / "ckpt.pt" if Path(path).is_dir() else Path(path)
    if not path.is_file():
        return None
    with open(path, "rb") as f:
        return digest_id(f)


def stale(report, run_dir):
    """Why report does not describe the weights in run_dir's ckpt.pt now, else None (also where there is no
    checkpoint to compare with: a report kept apart from its run)."""
    if (now := weights_id(run_dir)) is None or report.get(WEIGHTS) == now:
        return None
    if not report.get(WEIGHTS):
        return "it does not name the weights it was made from"
    return (f"it was made from other weights (iter {report.get('checkpoint_iter', '?')}) than "
            f"{run_home(run_dir)}/ckpt.pt holds now")


def is_number(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def load_report(run_dir, protocol=None, weights_of=None):
    """A run's extrapolation.json (compare.py, the study); an error if it is missing, broken, empty, (protocol
    given) has none of its entries, or was made from other weights than weights_of's (default run_dir's)
    ckpt.pt holds now."""
    path, weights_of = Path(run_dir) / "extrapolation.json", weights_of or run_dir
    again = f"re-run eval/extrapolate.py {weights_of}" + ("" if weights_of == run_dir else
                                                          f" --out {run_dir}")
    if not path.is_file():
        raise FileNotFoundError(f"no {path}; evaluate the run first: python eval/extrapolate.py {run_dir}")
    try:
        report = json.loads(path.read_text())
        missing = [k for k in ("run", "train_len", "units", "results") if k not in report]
    except (ValueError, TypeError) as e:
        raise UserError(f"{path} is not valid JSON ({e}); {again}") from None
    if not missing and not isinstance(report["results"], list):
        missing = ["a list of results"]
    if not missing and (bad := [k for r in report["results"] for k in RESULT_KEYS
                                if not isinstance(r, dict) or k not in r]):
        missing = [f"{bad[0]} in its results"]
    if missing:
        raise UserError(f"{path} is not an extrapolate.py result (missing {', '.join(missing)}); {again}")
    lengths = [("train_len", report["train_len"])] + [("eval_len", r["eval_len"]) for r in report["results"]]
    bad = [f"{k}={v!r}" for k, v in lengths if not (type(v) is int and v > 0)] + [
        f"{k}={r[k]!r}" for r in report["results"] for k in NUMBERS
        if r.get(k) is not None and not is_number(r[k])]
    if bad:
        raise UserError(f"{path} holds {bad[0]}: lengths are whole numbers of tokens > 0 and metrics finite "
                        f"numbers (edited by hand?); {again}")
    if not any(protocol in (None, r["protocol"]) for r in report["results"]):
        raise UserError(f"{path} has no {protocol or 'evaluation'} results; {again}")
    if why := stale(report, weights_of):
        raise UserError(f"{path}: {why}; {again}")
    return report


def plain_log_labels(axis):
    """A log axis labelled 30, 50, 100, not 3x10^1 (matplotlib's default), minor ticks labelled where there is
    room."""
    from matplotlib import ticker
    axis.set_major_formatter(ticker.LogFormatter())
    axis.set_minor_formatter(ticker.LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5)))


def unique_runs(paths, what):
    """paths, refused if one is given twice (the same run, however written): its data would count twice."""
    seen = {}
    for p in paths:
        if (key := run_home(p).resolve()) in seen:
            raise UserError(f"{what} {p} is given twice ({seen[key]} and {p}); give each once")
        seen[key] = p
    return paths


def run_labels(paths, names):
    """names, where two runs share one (out/a/rope_small, out/b/rope_small) their paths instead: a row or line
    per run."""
    shared = {n for n in names if names.count(n) > 1}
    return [str(p) if n in shared else n for p, n in zip(paths, names)]
