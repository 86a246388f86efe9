"""The pieces of a declared family of contrasts that the study and the ladder share: per seed and unit, paired values
read off extrapolation reports, the units' documents, and the family decided (bootstrap and seed-level test under Holm)."""
import json
from contextlib import suppress
from functools import lru_cache
from pathlib import Path

import numpy as np

from common import ROOT, UserError
from eval.reading import stale, weights_id
from eval.report import label
from lab.stats import both, documents, interval, replicates, seed_test


def same_options(a, b):
    """Whether two option lists say the same: each --flag with the values after it, in any order of the flags."""
    def groups(options):
        flags = []
        for x in options:
            if x.startswith("--") or not flags:
                flags.append([x])
            else:
                flags[-1].append(x)
        return sorted(flags)
    return groups(a) == groups(b)


def reusable(path, run_dir, options):
    """The report at path if it was made from the weights in run_dir's ckpt.pt now, with these options; else
    None (it is made again)."""
    with suppress(OSError, ValueError):  # none there, or not a report
        rep = json.loads(Path(path).read_text())
        if isinstance(rep, dict) and isinstance(rep.get("results"), list) and weights_id(run_dir) and \
                not stale(rep, run_dir) and same_options(rep.get("options") or [], options):
            return rep
    return None


@lru_cache(maxsize=None)
def val_bounds(dataset):
    """The val split's document bounds of a report's dataset folder (in another checkout: data/ of the same name), or None."""
    for folder in (Path(dataset), ROOT / "data" / Path(dataset).name):
        if (folder / "val_docs.npy").is_file():
            return np.load(folder / "val_docs.npy")


def unit_docs(rep, key):
    """Each unit's held-out document for rep["units"][key] (key: 'windows 512'): as eval/extrapolate.py recorded it, or
    for an older report from the starts and its dataset's document bounds; None where neither can be had."""
    if key in (rep.get("unit_docs") or {}):
        return rep["unit_docs"][key]
    if key in (rep.get("units") or {}) and rep.get("dataset") and (bounds := val_bounds(rep["dataset"])) is not None:
        return documents(rep["units"][key], bounds).tolist()


def shared_docs(seeds, key, what):
    """The units' documents, the same for every seed (each seed was scored on the same windows), or None if unknown."""
    docs = [unit_docs(rep, key) for rep in seeds]
    if any(d is None for d in docs):
        return None
    if any(d != docs[0] for d in docs):
        raise UserError(f"{what}: the seeds were scored on windows of different documents; "
                        "evaluate every seed with the same options")
    return docs[0]


def past_l(rep):
    """{(method label, length): {metric: per-window values}} of a report's windows protocol past L (None: not available)."""
    return {(label(r), r["eval_len"]): r["per_unit"] or {} for r in rep["results"]
            if r["protocol"] == "windows" and r["eval_len"] > rep["train_len"]}


def declare(kind, config, method, ref, at, per_seed, groups, margin):
    """A declared contrast: per seed its per-unit values (a seed without them is left out), the units' documents."""
    v = [x for x in per_seed if x is not None]
    return dict(kind=kind, config=config, method=method, ref=ref, at=at, groups=groups, margin=margin,
                values=np.array(v, dtype=np.float64)) if v and len({len(x) for x in v}) == 1 else None


def paired(mine, theirs, a, b, metric):
    """Per seed k: mine[k][a][metric] minus theirs[k][b][metric], unit by unit (b None: mine's alone); None for a seed
    where either is missing. mine, theirs: per seed {key: {metric: per-unit values}}."""
    out = []
    for p, q in zip(mine, theirs):
        x, y = p.get(a, {}).get(metric), q.get(b, {}).get(metric) if b else 0.0
        if x is None or y is None or (b and len(x) != len(y)):  # different trial counts cannot be paired
            out.append(None)
        else:
            out.append(np.subtract(x, y))
    return out


def decide(family):
    """(rows, replicates): each contrast's interval, bootstrap p, seed-level t-test and TOST, the family
    decided by Holm on both tests: "lower/higher than ref" where both reject, else "equivalent within
    +-margin" where both one-sided pairs reject (Holm over the family too), else "no difference found". A
    contrast no seed has (declare's None) is not in the family; no family: ([], 0). Replicates: enough for
    Holm's smallest threshold."""
    if not (family := [c for c in family if c]):
        return [], 0
    n_boot = replicates(len(family))
    tested = [(interval(c["values"], c["groups"], n_boot, margin=c["margin"]), seed_test(c["values"], c["margin"]) or {})
              for c in family]
    apart = both([b["p"] for b, _ in tested], [t.get("p") for _, t in tested])
    same = both([b["p_tost"] for b, _ in tested], [t.get("p_tost") for _, t in tested])
    rows = []
    for c, (b, t), differ, equivalent in zip(family, tested, apart, same):
        rows.append(dict(kind=c["kind"], config=c["config"], method=c["method"], ref=c["ref"], at=c["at"],
                         **({"eval_len": c["at"]} if c["kind"] != "probe" else {"distance": c["at"]}),
                         unit="document" if c["groups"] is not None else "trial" if c["kind"] == "probe" else "window",
                         **{k: b[k] for k in ("mean", "lo", "hi", "p", "p_method", "seeds", "units", "clusters", "p_tost")},
                         t=t.get("t"), p_seed=t.get("p"), p_tost_seed=t.get("p_tost"), margin=c["margin"],
                         decision=f"{'lower' if b['mean'] < 0 else 'higher'} than {c['ref']}" if differ else "undecided",
                         equivalence=None if differ else f"equivalent within +-{c['margin']:g}" if equivalent
                         else "no difference found"))
    return rows, n_boot
