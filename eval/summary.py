"""What a grid of per-target NLL says: per-unit means and paired differences, their means with standard
errors over units, curves binned by position."""
import math

import numpy as np

# per panel: bins grow with the length, so the 16x panel (few windows) is not one window's noise
PLOT_BINS = 16


def label(r):
    return r["method"] + (f" ({r['mode']})" if r["mode"] else "")


def mean_stderr(per_unit):
    a = np.asarray(per_unit, dtype=np.float64)
    return float(a.mean()), float(a.std(ddof=1) / math.sqrt(len(a))) if len(a) > 1 else None


def per_unit(nll, pos, train_len, none, crop):
    """Per unit: the loss (all, past train_len), paired differences to none and crop (None: no targets)."""
    past, inside = pos >= train_len, pos < train_len
    def mean(a, where):
        return None if a is None or not where.any() else a[:, where].mean(axis=1)
    return dict(loss=nll.mean(axis=1), loss_beyond_train=mean(nll, past),
                diff_none=mean(None if none is None else nll - none, past),
                diff_crop=mean(None if crop is None else nll - crop, past),
                diff_none_inside=mean(None if none is None else nll - none, inside))


def summarize(units):
    """An entry's fields from its per_unit values (None: not scored)."""
    if units is None:
        return dict.fromkeys(("loss", "ppl", "loss_beyond_train", "ppl_beyond_train", "stderr", "per_unit"))
    out = {}
    for k, v in units.items():
        out[k], err = (None, None) if v is None else mean_stderr(v)
        out["stderr" if k == "loss" else f"{k}_stderr"] = err
    beyond = out["loss_beyond_train"]
    return dict(out, ppl=math.exp(out["loss"]), ppl_beyond_train=None if beyond is None else math.exp(beyond),
                per_unit={k: None if v is None else v.round(6).tolist() for k, v in units.items()})


def curves(nll, ref, edges, key="loss", err_key="stderr"):
    """nll binned by position with its standard error over units, and its paired difference to ref."""
    def binned(a, key, err_key):
        per_unit = np.stack([a[:, lo:hi].mean(axis=1) for lo, hi in zip(edges[:-1], edges[1:])], axis=1)
        err = per_unit.std(axis=0, ddof=1) / math.sqrt(len(a)) if len(a) > 1 else np.zeros(per_unit.shape[1])
        return {key: per_unit.mean(axis=0).round(6).tolist(), err_key: err.round(6).tolist()}
    return dict(x=((edges[:-1] + edges[1:] - 1) / 2).tolist(), **binned(nll, key, err_key),
                **({} if ref is None else binned(nll - ref, "diff_none", "diff_none_stderr")))


def helped_tokens(scored, protocol, eval_len, threshold):
    """Targets some evaluated method predicts > threshold nats better than crop does: where the long context
    helped. Not LongPPL's key tokens, which a separate evaluator model selects (docs/methodology.md)."""
    crop = scored.get((protocol, eval_len, "crop", None))
    others = [v for (p, T, m, _), v in scored.items()
              if (p, T) == (protocol, eval_len) and m != "crop" and v is not None]
    return None if crop is None or not others else np.any([crop - v > threshold for v in others], axis=0)


def bin_edges(eval_len, bins):
    """~50 linear bins (2% of the length each), or ~40 log-spaced ones."""
    if bins == "log":
        if eval_len == 1:
            return np.array([0, 1])
        return np.unique(np.round(np.geomspace(1, eval_len, 41)).astype(int)) - 1
    size = max(1, eval_len // 50)
    return np.arange(0, eval_len // size * size + 1, size)


def summarize_grid(results, scored, positions, train_len, bins, threshold):
    """Each result's numbers and (windows protocol) its curves, in place. scored: {(protocol, length, method,
    mode): NLL [units, n] or None}; positions: {(protocol, length): each target's position in its window}."""
    helped = {k[:2]: helped_tokens(scored, *k[:2], threshold) for k in scored}
    for r in results:
        key = r["protocol"], r["eval_len"]
        nll, mask = scored[(*key, r["method"], r["mode"])], helped[key]
        refs = [None if r["method"] == ref else scored.get((*key, ref, None)) for ref in ("none", "crop")]
        r.update(summarize(None if nll is None else per_unit(nll, positions[key], train_len, *refs)))
        r["helped_tokens"] = None if mask is None else int(mask.sum())
        helps = mask is not None and nll is not None and mask.any()
        r["ppl_helped"] = math.exp(nll[mask].mean()) if helps else None
        if r["protocol"] == "windows" and nll is not None:
            r["loss_by_position"] = nll.mean(axis=0).round(6).tolist()
            r["curve"] = curves(nll, scored.get((*key, "none", None)), bin_edges(r["eval_len"], bins))
            if (crop := scored.get((*key, "crop", None))) is not None and r["method"] != "crop":
                edges = np.linspace(0, r["eval_len"], PLOT_BINS + 1).round().astype(int)
                r["crop_curve"] = curves(nll - crop, None, np.unique(edges), "diff_crop", "diff_crop_stderr")
