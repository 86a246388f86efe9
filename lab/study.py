"""A study: configs x seeds trained and evaluated one at a time (resuming), aggregated into study.{json,md,png} (README.md)."""
import json
import math
import os
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: runs from any folder

from eval.report import fmt, label, line_style, load_report, panels, plain_log_labels, png, pyplot, write_all
from eval.methods import METHODS
from lab.family import decide, declare, paired, past_l, same_options, shared_docs
from lab.stats import LEVEL, blocks, interval, ratio_interval
from common import ROOT, UserError, claim_output, command_parser, json_text, parse_number, run_cli, shared_values
from runtime import load_checkpoint
from wandb_runs import contrast_metrics, log_results
from config import load_config

METRICS = ("loss", "loss_beyond_train", "diff_none", "diff_crop", "diff_none_inside")
KEYS = ("protocol", "method", "mode", "eval_len")  # with the config, what a row aggregates over seeds
PAIRS = (("yarn", "ntk-by-parts"),)  # declared contrasts between two methods: YaRN with and without its temperature
PROBES = ("copy", "mqar")  # probe rates with declared contrasts (passkey: exact match, too coarse on these models)
MARGIN, RATE_MARGIN = 0.01, 0.05  # equivalence margins: nats of loss, and a probe's top-1
BLOCKS = (16, 64)  # block lengths (training lengths) in the table of interval widths by unit


def last_iter(run_dir):
    """(iteration of the run's checkpoint, its max_iters), or None if there is none yet."""
    if (run_dir / "ckpt.pt").is_file():
        return (ckpt := load_checkpoint(run_dir))["iter_num"], ckpt["config"]["max_iters"]


def step(what, cmd, wandb_log=True):
    """Run one command of the study; a study that does not log keeps its runs' commands from logging too."""
    print(f"study: {what}: {' '.join(cmd[1:])}", flush=True)
    if subprocess.run(cmd, env=None if wandb_log else dict(os.environ, WANDB_MODE="disabled")).returncode != 0:
        raise UserError(f"{what} failed (command: {shlex.join(cmd[1:])}); fix it and run the study again to resume")


def run_one(config, seed, out, train_args, eval_args, probe_args=None, wandb_log=True):
    """Train (or resume) and evaluate one run unless that is done already; returns its folder."""
    run_dir = out / (name := f"{Path(config).stem}_seed{seed}")
    if (done := last_iter(run_dir)) is None or done[0] < done[1]:
        step(f"train {name}", [sys.executable, str(ROOT / "train.py"), config, f"--out_dir={run_dir}", f"--seed={seed}",
                               f"--wandb_group={out.name}", f"--wandb_run_name={name}",
                               *(a.replace("{seed}", str(seed)) for a in train_args),
                               *(["--init_from=resume"] if done else [])], wandb_log)  # last: it wins over a fine-tune's init_from
        done = last_iter(run_dir)
    # evaluated on the final checkpoint with the study's options, else every seed would not share the windows
    rep = (run_dir / "extrapolation.json").is_file() and load_report(run_dir)
    if not rep or rep["checkpoint_iter"] != done[0] or not same_options(rep.get("options") or [], eval_args) or \
            any("per_unit" not in r for r in rep["results"]):  # an older extrapolate.py kept no per-unit values
        step(f"evaluate {name}", [sys.executable, str(ROOT / "eval" / "extrapolate.py"), str(run_dir), *eval_args], wandb_log)
    else:
        print(f"study: {name}: trained and evaluated already")
    rep = (run_dir / "probes.json").is_file() and json.loads((run_dir / "probes.json").read_text())
    if probe_args is not None and (not rep or rep["checkpoint_iter"] != done[0] or not same_options(rep["options"], probe_args)):
        step(f"probe {name}", [sys.executable, str(ROOT / "lab" / "probes.py"), str(run_dir), *probe_args], wandb_log)
    return run_dir


def spread(values, what, groups=None, unit="window"):
    """lab.stats.interval of values [seeds, units] (a seed's None: not available), resampling groups (a document per
    unit; None: each unit on its own), or None where no seed has them; `unit` names what is resampled."""
    v = [u for u in values if u is not None]
    if len({len(u) for u in v}) > 1:  # the two-way bootstrap pairs unit j of every seed: they must be the same units
        raise UserError(f"{what}: the seeds were scored on different units ({', '.join(str(len(u)) for u in v)} of them); "
                         "evaluate every seed with the same options")
    return dict(interval(v, groups), unit="document" if groups is not None else unit) if v else None


def aggregate(reports):
    """{config: [per-seed extrapolation reports]} -> one row per (config, protocol, method, mode, length): per metric the
    mean over seeds x units (windows or stretches) and its two-way bootstrap interval over seeds and held-out documents
    (windows where the documents are unknown); per_seed: each seed's mean."""
    rows, units = {}, {}
    for config, rep, r in ((c, rep, r) for c, seeds in reports.items() for rep in seeds for r in rep["results"]):
        if "per_unit" not in r:
            raise UserError(f"the evaluation of {rep['run']} has no per-unit values (an older eval/extrapolate.py): "
                             f"run the study again, or eval/extrapolate.py on that run, to re-evaluate it")
        row = rows.setdefault(key := (config, *(r[k] for k in KEYS)), dict(config=config, **{k: r[k] for k in KEYS},
                              train_len=rep["train_len"], per_seed={m: [] for m in METRICS}))
        for m in METRICS:
            row["per_seed"][m].append(r.get(m))  # an entry that is not available has none
            units.setdefault((key, m), []).append((r["per_unit"] or {}).get(m))  # None: the entry is not available
    docs = {key: shared_docs(reports[key[0]], f"{key[1]} {key[4]}", " ".join(map(str, key))) for key in rows}
    return [dict(row, **{m: spread(units[key, m], f"{' '.join(map(str, key))} {m}", docs[key]) for m in METRICS})
            for key, row in rows.items()]


def aggregate_probes(reports):
    """{config: [per-seed probes reports]} -> copy and MQAR top-1 per distance, passkey exact match per length, over
    seeds x trials (passkey: depths x trials); an entry without per-trial hits counts as one unit, its mean."""
    rows, units = {}, {}
    for config, seeds in reports.items():
        judged = [rep["retrieval"]["retrieves"] for rep in seeds if rep["retrieval"]]
        copies = None if None in judged else sum(judged)  # None: copy_source text, where no threshold tells copying
        for rep in seeds:
            per = {}
            for r in (r for r in rep["results"] if r["probe"] in ("copy", "mqar", "passkey") and r["available"]):
                at, value = ("eval_len", "exact") if r["probe"] == "passkey" else ("distance", "top1")
                per.setdefault((config, r["probe"], r["method"], r[at]), []).extend(r.get("hits") or [r[value]])
            for key, v in per.items():
                row = rows.setdefault(key, dict(zip(("config", "probe", "method", "at"), key), train_len=rep["train_len"],
                                                value=None, per_seed=[], seeds_that_copy=copies))
                row["per_seed"].append(float(np.mean(v)))
                units.setdefault(key, []).append(v)
    return [dict(r, value=spread(units[key], " ".join(map(str, key)), unit="trial")) for key, r in rows.items()]


def loss_contrasts(reports, pairs=PAIRS, control=None, margin=MARGIN):
    """The declared loss contrasts over the targets past L (windows protocol), paired on seed k and window j: every
    method but crop minus crop (diff_crop) per config and length; each pair (a, b), a minus b (the same targets, so
    a's diff_crop minus b's); with a control config, every method of every other config minus the control's crop
    (a fine-tune and its control start from the same seed)."""
    family = []
    for config, seeds in reports.items():
        past = [past_l(rep) for rep in seeds]
        docs = {T: shared_docs(seeds, f"windows {T}", f"{config} at {T}") for _, T in past[0]}
        for name, T in past[0]:
            if name != "crop":
                family.append(declare("crop", config, name, "crop", T, paired(past, past, (name, T), None, "diff_crop"),
                                      docs[T], margin))
        for a, b in pairs:
            for T in docs:
                family.append(declare("pair", config, f"{a} - {b}", b, T, paired(past, past, (a, T), (b, T), "diff_crop"),
                                      docs[T], margin))
        if control and config != control:
            ref = [past_l(rep) for rep in reports[control]]
            for name, T in past[0]:
                family.append(declare("control", config, f"{name} - {control} crop", f"{control} crop", T,
                                      paired(past, ref, (name, T), ("crop", T), "loss_beyond_train"), docs[T], margin))
    return [c for c in family if c]


def ceiling_shares(reports, control, ceiling):
    """Per method of the control and length past L: the share of the ceiling's gain it recovers, (crop - method) /
    (crop - ceiling) over the same targets, where crop and method are the control's and the ceiling is the ceiling
    config read as trained with its full context (none); seeds x documents resampled alike for both (ratio_interval)."""
    mine, top = [past_l(rep) for rep in reports[control]], [past_l(rep) for rep in reports[ceiling]]
    rows = []
    for name, T in mine[0] if mine else ():
        gain = paired(mine, top, ("crop", T), ("none", T), "loss_beyond_train")
        recovered = [None if d is None else -np.asarray(d) for d in paired(mine, mine, (name, T), None, "diff_crop")]
        if name == "crop" or any(v is None for v in gain + recovered):
            continue
        docs = shared_docs(reports[control], f"windows {T}", f"{control} at {T}")
        rows.append(dict(method=name, eval_len=T, **ratio_interval(recovered, gain, docs)))
    return rows


def shares_section(shares, control, ceiling, L):
    if not shares:
        return None
    cells = [((control, r["method"]), r["eval_len"], "n/a" if r["mean"] is None else
              f"{r['mean']:.2f} [{r['lo']:.2f}, {r['hi']:.2f}]") for r in shares]
    gains = ", ".join(f"{r['eval_len'] / L:g}x {r['gain']:+.4f}" for r in shares if r["method"] == shares[0]["method"])
    return (f"### Share of the ceiling's gain each method recovers, past L\n\n(crop - method) / (crop - ceiling) over "
            f"the same targets: crop and the method are {control}'s, the ceiling is {ceiling} read with its full context. "
            f"0: no better than crop; 1: as good as the ceiling. Mean [95% bootstrap interval, seeds x documents "
            f"resampled alike]; the ceiling's gain, crop minus ceiling (nats): {gains}. A share means something only "
            f"where that gain is decided (the control contrast above).\n\n" + table(cells, sorted({r["eval_len"] for r in shares}), L))


def probe_contrasts(probes, pairs=PAIRS, control=None, margin=RATE_MARGIN):
    """The declared probe-rate contrasts at distances past L (copy and MQAR top-1, paired on seed k and trial j): every
    method but none minus none, each pair (a, b), and with a control every method of every other config minus the
    control's none. Entries without per-trial hits (older probes.py) cannot be paired and are left out."""
    def hits(rep):  # {(probe, method, distance): {"hits": per-trial hits}}
        return {(r["probe"], r["method"], r["distance"]): {"hits": r["hits"]} for r in rep["results"]
                if r["probe"] in PROBES and r["available"] and r.get("hits") and r["distance"] > rep["train_len"]}
    family, ref = [], [hits(rep) for rep in probes.get(control, [])]
    for config, seeds in probes.items():
        per = [hits(rep) for rep in seeds]
        for probe, method, d in per[0]:
            if method != "none":
                family.append(declare("probe", config, f"{probe}: {method} - none", "none", d,
                                      paired(per, per, (probe, method, d), (probe, "none", d), "hits"), None, margin))
        for a, b in pairs:
            for probe, d in dict.fromkeys((p, d) for p, _, d in per[0]):
                family.append(declare("probe", config, f"{probe}: {a} - {b}", b, d,
                                      paired(per, per, (probe, a, d), (probe, b, d), "hits"), None, margin))
        if control and config != control:
            for probe, method, d in per[0]:
                family.append(declare("probe", config, f"{probe}: {method} - {control} none", f"{control} none", d,
                                      paired(per, ref, (probe, method, d), (probe, "none", d), "hits"), None, margin))
    return [c for c in family if c]


def distinct(family):
    """(kept, dropped): a contrast whose two sides agree on every unit of every seed (zero by construction, e.g. crop
    against none inside L) or whose values repeat an earlier contrast's (dynamic-ntk in sequence mode scores a full
    window exactly as ntk does) leaves the family, with the reason; it could only make the family larger."""
    kept, dropped, seen = [], [], {}
    for c in family:
        key = (c["values"].shape, (np.round(c["values"], 9) + 0.0).tobytes())  # + 0.0: -0.0 is 0
        if not c["values"].any():
            reason = "zero in every unit of every seed"
        elif key in seen:
            other = seen[key]
            reason = f"the same per-unit values as {other['method']}" + (
                "" if (other["config"], other["at"]) == (c["config"], c["at"]) else f" ({other['config']} at {other['at']})")
        else:
            seen[key] = c
            kept.append(c)
            continue
        dropped.append(dict(config=c["config"], method=c["method"], at=c["at"], reason=reason))
    return kept, dropped


def contrasts(reports, probes=None, control=None, pairs=PAIRS, margin=MARGIN, rate_margin=RATE_MARGIN):
    """The page's declared family (loss_contrasts and probe_contrasts), its duplicates and zeros removed, decided
    together (decide): {family, family_size, replicates, holm_alpha, margin, rate_margin, rows, dropped}."""
    family, dropped = distinct(loss_contrasts(reports, pairs, control, margin) +
                               probe_contrasts(probes or {}, pairs, control, rate_margin))
    rows, n_boot = decide(family) if family else ([], 0)
    pairs = [(a, b) for a, b in pairs if any(c["method"].endswith(f"{a} - {b}") for c in family)]  # those the runs have
    what = ["every method but crop minus crop past L, at every length past L in every config",
            *(f"{a} minus {b} past L" for a, b in pairs)]
    if control:
        what.append(f"every method of the other configs minus {control}'s crop past L")
    if any(c["kind"] == "probe" for c in family):
        what.append(f"{' and '.join(PROBES)} top-1 at distances past L: every method minus none"
                    + "".join(f", {a} minus {b}" for a, b in pairs) + (f", every method minus {control}'s none" if control else ""))
    return dict(family="; ".join(what), family_size=len(rows), replicates=n_boot, holm_alpha=round(1 - LEVEL, 6),
                margin=margin, rate_margin=rate_margin, rows=rows, dropped=dropped)


def unit_widths(reports, sizes=BLOCKS):
    """{length: {unit: (clusters, median width)}}: the 95% intervals of diff_crop past L (windows protocol, every method
    and config), resampling windows, blocks of b training lengths within a document, or documents; lengths whose
    documents are unknown are left out. How the choice of unit moves the intervals."""
    widths = {}
    for config, seeds in reports.items():
        past = [past_l(rep) for rep in seeds]
        for name, T in past[0]:
            values = [p.get((name, T), {}).get("diff_crop") for p in past]
            docs = shared_docs(seeds, f"windows {T}", f"{config} at {T}")
            if name == "crop" or docs is None or any(v is None for v in values):
                continue
            starts, L = seeds[0]["units"][f"windows {T}"], seeds[0]["train_len"]
            units = {"window": None, **{f"{b}L block": blocks(starts, docs, b * L) for b in sizes}, "document": docs}
            for unit, groups in units.items():
                r = interval(values, groups)
                widths.setdefault(T, {}).setdefault(unit, []).append((r["clusters"], r["hi"] - r["lo"]))
    return {T: {u: (max(c for c, _ in w), float(np.median([x for _, x in w]))) for u, w in by.items()}
            for T, by in sorted(widths.items())}


def cell(s, transform=lambda x: x, digits=2):
    """'mean [lo, hi]' of an interval, through transform (exp for perplexities: percentile intervals follow it); 'n/a': none."""
    return "n/a" if s is None else "{} [{}, {}]".format(*(fmt(transform(s[k]), digits) for k in ("mean", "lo", "hi")))


def table(cells, cols, L):
    """A markdown table from ((config, method), column, text) triples: a column per length or distance in cols."""
    body = {}
    for key, at, text in cells:
        body.setdefault(key, {})[at] = text
    return "\n".join(["| config | method |" + "".join(f" {a / L:g}x ({a}) |" for a in cols), "| --- | --- |" + " ---: |" * len(cols),
                      *(f"| {c} | {m} |" + "".join(f" {row.get(a, '')} |" for a in cols) for (c, m), row in body.items())])


def sample(rows, stat, unit, L, at):
    """What the cells of a table are over: 'U windows from D documents', by length where those differ."""
    per = dict(sorted((at(r), (r[stat]["units"], r[stat].get("clusters") if r[stat].get("unit") == "document" else None))
                      for r in rows if r[stat]))
    if not per:
        return None
    (u, d), *_ = per.values()
    if len(set(per.values())) == 1:
        return f"{u} {unit}" + (f" from {d} document{'s' * (d != 1)}" if d else "")
    us, ds = ({a: x[i] for a, x in per.items()} for i in (0, 1))
    def by(n):
        return ", ".join(f"{x} at {a / L:g}x" for a, x in n.items())
    return f"U {unit}, U = {by(us)}" + ("" if None in ds.values() else
                                        f", from D documents, D = {d} at every length" if len(set(ds.values())) == 1
                                        else f", from D documents, D = {by(ds)}")


def section(title, rows, stat, seeds, unit, L, key=lambda r: (r["config"], label(r)), at=lambda r: r["eval_len"],
            transform=lambda x: x, digits=3, note=""):
    """'### title', what a cell is over, and the table of r[stat], a row per key(r), a column per at(r); None if no row has it."""
    if n := sample(rows, stat, unit, L, at):
        what = "; the documents are not recorded: each unit resampled on its own" \
            if unit in ("windows", "stretches") and "documents" not in n else ""
        return (f"### {title}\n\nmean [{LEVEL:.0%} bootstrap interval over {seeds} seeds x {n}]{what}{note}\n\n"
                + table([(key(r), at(r), cell(r[stat], transform, digits)) for r in rows], sorted({at(r) for r in rows}), L))


def verdict(c):
    """A contrast's cell: 'mean [lo, hi] decision, n seeds'."""
    word = c["decision"].split()[0] if c["decision"] != "undecided" else \
        "equivalent" if c["equivalence"].startswith("equivalent") else "no difference found"
    return f"{cell(c, digits=3)} {word}, {c['seeds']} seeds"


def declared_section(declared, L):
    """The family's description, its size, how it is decided, its tables (loss contrasts by length, probe contrasts by
    distance) and what left it."""
    rows, m = declared["rows"], declared["family_size"]
    text = [f"### Declared contrasts: the family of this page\n\nThe family: {declared['family']} (m = {m}), decided "
            f"together by Holm's procedure at {declared['holm_alpha']:.2f} family-wise. A contrast is decided (lower or "
            f"higher) only where Holm rejects both the two-way bootstrap over seeds and documents (p from "
            f"{declared['replicates']:,} replicates, fine enough for the smallest threshold {declared['holm_alpha']:.2f} / {m}) "
            f"and the paired t-test on the seed means; with fewer than 2 seeds nothing is decided. Not decided: "
            f"\"equivalent\" where both two one-sided tests (Holm) put it within +-{declared['margin']:g} nats "
            f"(probe rates: +-{declared['rate_margin']:g}), else \"no difference found\". Each cell: mean "
            f"[{LEVEL:.0%} bootstrap interval], the decision and the seeds it rests on. Each page is its own family."]
    for kinds, what, at in ((("crop", "pair", "control"), "loss minus the reference over the targets past L (nats), "
                             "windows protocol", "eval_len"), (("probe",), "probe top-1 differences, by distance", "distance")):
        if mine := [c for c in rows if c["kind"] in kinds]:
            text.append(f"{what}:\n\n" + table([((c["config"], c["method"]), c[at], verdict(c)) for c in mine],
                                                 sorted({c[at] for c in mine}), L))
    if declared["dropped"]:  # one line per method and reason: which configs, at which lengths or distances
        by = {}
        for d in declared["dropped"]:
            configs, ats = by.setdefault((d["method"], d["reason"]), ({}, {}))
            configs[d["config"]], ats[d["at"]] = None, None
        text.append("Left out of the family: " + "; ".join(f"{m} in {', '.join(cs)} at {', '.join(map(str, sorted(ats)))}: {r}"
                                                          for (m, r), (cs, ats) in by.items()) + ".")
    return "\n\n".join(text)


def widths_section(widths, L):
    """The table of interval widths by unit of resampling (unit_widths)."""
    if not widths:
        return None
    units = list(next(iter(widths.values())))
    head = "| length |" + "".join(f" {u} |" for u in units) + "\n| --- |" + " ---: |" * len(units)
    body = [f"| {T / L:g}x ({T}) |" + "".join(f" {by[u][1]:.4f} ({by[u][0]}) |" if u in by else " |" for u in units)
            for T, by in widths.items()]
    return ("### How the unit of resampling moves the intervals\n\nmedian width of the 95% intervals of loss minus crop past L "
            "(every method and config, windows protocol) when seeds and the unit are resampled, and (in brackets) how "
            "many units there are: windows on their own, blocks of b training lengths within a document, or whole "
            "documents (the unit of every other interval on this page)\n\n" + "\n".join([head, *body]))


def markdown(rows, seeds, probe_rows=(), declared=None, widths=None, shares=None):
    L, tables = rows[0]["train_len"], []
    for protocol in dict.fromkeys(r["protocol"] for r in rows):
        rs, unit = [r for r in rows if r["protocol"] == protocol], "windows" if protocol == "windows" else "stretches"
        for metric, title in (("loss", "perplexity over all targets"),
                              ("loss_beyond_train", "perplexity over the targets past the training length"),
                              ("diff_crop", "loss minus crop over the targets past L (nats; < 0: the longer context helps)"),
                              ("diff_none", "loss minus none over the targets past L (nats)"),
                              ("diff_none_inside", "loss minus none over the targets inside L (nats; the method's cost "
                                                   "where nothing is extrapolated)")):
            tables.append(section(f"{title}, {protocol} protocol", rs, metric, seeds, unit, L,
                                  **(dict(transform=math.exp, digits=1) if metric.startswith("loss") else {})))
    for probe, what, unit in (("copy", "copy probe: top-1 on the repeat, by distance", "trials"),
                              ("mqar", "MQAR probe: top-1 on the values after the queries, by distance", "trials"),
                              ("passkey", "passkey: exact match, by length", "trials (depths x trials)")):
        if rs := [r for r in probe_rows if r["probe"] == probe]:
            tables.append(section(what, rs, "value", seeds, unit, rs[0]["train_len"], digits=2, at=lambda r: r["at"],
                                  key=lambda r: (f"{r['config']} (" + ("text: not judged" if r["seeds_that_copy"] is None
                                                                       else f"{r['seeds_that_copy']}/{seeds} copy") + ")", r["method"]),
                                  note="; (k/n copy): seeds whose run copies inside L, without which the row compares nothing; (text: not "
                                       "judged): held-out text is predictable without its first copy, the baseline is crop past L"))
    if declared and declared["rows"]:
        tables.append(declared_section(declared, L))
    if shares:
        tables.append(shares_section(*shares, L))
    tables.append(widths_section(widths, L))
    return "\n\n".join(t for t in tables if t) + "\n"


def plot(rows):
    """PNG bytes: per config, perplexity against length (top), loss minus crop past L (bottom); windows protocol."""
    rows = [r for r in rows if r["protocol"] == "windows"]
    configs = list(dict.fromkeys(r["config"] for r in rows))
    fig, places = panels(pyplot(), len(configs), 3, 2, (5.5, 8), sharex=True)
    for (top, bottom), config in zip(places, configs):
        for name in dict.fromkeys(label(r) for r in rows if r["config"] == config):
            pts = sorted((r["eval_len"] / r["train_len"], r) for r in rows if r["config"] == config and label(r) == name)
            for ax, metric, tf in ((top, "loss", math.exp), (bottom, "diff_crop", lambda x: x)):
                if p := [(m, r[metric]) for m, r in pts if r[metric] is not None]:
                    y, lo, hi = (np.array([tf(s[k]) for _, s in p]) for k in ("mean", "lo", "hi"))
                    ax.errorbar([m for m, _ in p], y, yerr=np.clip([y - lo, hi - y], 0, None), ms=4, capsize=3,
                                lw=1.2, label=name, **line_style(name))  # clip: bars >= 0, as matplotlib wants
        top.set(title=config, yscale="log", ylabel="perplexity (windows protocol)")
        plain_log_labels(top.yaxis)
        bottom.axhline(0, color="grey", lw=0.8)
        bottom.set(xlabel="eval length / training length", ylabel="loss minus crop past L (nats)")
        bottom.set_xscale("log", base=2)
        top.legend(fontsize=7, ncol=2)
    fig.suptitle(f"mean over seeds x windows; error bars: {LEVEL:.0%} bootstrap interval\n(seeds and documents resampled); "
                 "lower row below 0: better than crop", fontsize=10)
    return png(fig)


def log_wandb(study, out, png_path, md):
    """The study's own wandb run, in the group of its runs: the declared contrasts as summary metrics, the table and figure."""
    import wandb
    cols = ["config", "protocol", "method", "eval_len"] + [f"{m}_{k}" for m in METRICS for k in ("mean", "lo", "hi", "p")]
    data = [[r["config"], r["protocol"], label(r), r["eval_len"]]
            + [(r[m] or {}).get(k) for m in METRICS for k in ("mean", "lo", "hi", "p")] for r in study["rows"]]
    train_lens = {r["config"]: r["train_len"] for r in study["rows"]}
    log_results(out, dict(wandb_group=out.name, configs=study["configs"], seeds=study["seeds"]),  # its runs' group
                contrast_metrics(study.get("contrasts") or {"rows": []}, train_lens), job_type="study",
                media={"study/table": wandb.Table(columns=cols, data=data), "study/plot": wandb.Image(str(png_path)),
                       "study/markdown": wandb.Html(f"<pre>{md}</pre>")})


def from_root(path):
    """path relative to the repo root where it lies inside it, else absolute; a link inside the root (out/ on another
    disk) stays as written."""
    for p in (Path(os.path.abspath(path)), Path(path).resolve()):  # abspath: ".." folded, links kept
        if p.is_relative_to(ROOT):
            return str(p.relative_to(ROOT))
    return str(Path(path).resolve())


def parse_contrasts(text):
    """--contrasts 'a-b,c-d' as [(a, b), ...]: each entry cut at the one '-' that leaves a method name on both sides
    (method names hold '-' themselves: dynamic-ntk-ntk is dynamic-ntk minus ntk)."""
    pairs = []
    for entry in filter(None, text.split(",")):
        cuts = [(entry[:i], entry[i + 1:]) for i, ch in enumerate(entry) if ch == "-"
                and entry[:i] in METHODS and entry[i + 1:] in METHODS]
        if len(cuts) != 1 or cuts[0][0] == cuts[0][1]:
            raise UserError(f"--contrasts {entry!r} is not a-b for two different methods of {', '.join(METHODS)}")
        pairs.append(cuts[0])
    return pairs


def attached(argv, names):
    """argv with `--train_args VALUE` as `--train_args=VALUE`: a value that is itself an option ("--max_iters=10")
    argparse would take for one of the study's own."""
    flags, rest, joined = {f"--{n}" for n in names}, iter(argv), []
    for arg in rest:
        joined.append(f"{arg}={value}" if arg in flags and (value := next(rest, None)) is not None else arg)
    return joined


def same_names(configs):
    """The configs that share a file name with another (or are given twice): their runs and rows would be one."""
    stems = [Path(c).stem for c in configs]
    return [c for c, s in zip(configs, stems) if stems.count(s) > 1]


def parse_args(argv):
    argv = attached(argv, ("train_args", "eval_args", "probe_args"))
    p = command_parser(__doc__, "out", "wandb", out="out/study", wandb_log="true")
    p.add_argument("configs", nargs="+", help="config files (configs/*.py, lab/configs/*.py)")
    for name, default, text in (
            ("seeds", "3", "seeds per config"),
            ("train_args", "", "options for every train.py run ({seed}: the seed)"),
            ("eval_args", "", "options for every eval/extrapolate.py run (it checks them, on the first run)"),
            ("probe_args", None, "options for lab/probes.py ('' for its defaults; not given: no probes)"),
            ("control", None, "one of the configs: every other config's methods against its crop past L (a matched control)"),
            ("ceiling", None, "another config, the ceiling: the share of its gain over the control's crop each control method recovers"),
            ("contrasts", "", "more declared method contrasts, a-b[,c-d]: method a minus method b (e.g. llama3-yarn)"),
            ("margin", str(MARGIN), "equivalence margin of a loss contrast (nats)"),
            ("rate_margin", str(RATE_MARGIN), "equivalence margin of a probe-rate contrast (top-1)")):
        p.add_argument(f"--{name}", default=default, help=f"{text} (default {default!r})")
    a = p.parse_args(argv)
    args = dict(shared_values(a), configs=a.configs, seeds=parse_number(a.seeds, "seeds", int, 1),
                train_args=shlex.split(a.train_args), eval_args=shlex.split(a.eval_args),
                probe_args=None if a.probe_args is None else shlex.split(a.probe_args),
                control=a.control and Path(a.control).stem, ceiling=a.ceiling and Path(a.ceiling).stem, contrasts=parse_contrasts(a.contrasts),
                margin=parse_number(a.margin, "margin", float, 0), rate_margin=parse_number(a.rate_margin, "rate_margin", float, 0))
    if clash := same_names(a.configs):
        raise UserError(f"configs {', '.join(clash)} share the name {Path(clash[0]).stem!r}, which names their runs "
                        "(<out>/<name>_seed<k>) and their rows: give each config once, under distinct file names")
    if owned := [t for t in args["train_args"] if t.split("=")[0] == "--out_dir"]:
        raise UserError(f"--train_args {' '.join(owned)}: the study owns its runs' folders (<out>/<config>_seed<k>); "
                        "use --out for the study's folder instead")
    if a.ceiling and (a.ceiling not in a.configs or not a.control or a.ceiling == a.control):
        raise UserError(f"--ceiling {a.ceiling!r} needs --control and must be another of the study's configs ({', '.join(a.configs)})")
    if a.control and a.control not in a.configs:
        raise UserError(f"--control {a.control!r} is not one of the study's configs ({', '.join(a.configs)})")
    for config in a.configs:  # train.py's own checks, as each run will get them
        load_config([config, *(t.replace("{seed}", "0") for t in args["train_args"])])
    given = dict(vars(a), configs=None, out=from_root(a.out))  # the options that differ from their defaults
    args["command"] = shlex.join(["python", "lab/study.py", *map(from_root, a.configs),
                                  *(f"--{k}={v}" for k, v in given.items() if v != p.get_default(k))])
    return args


def study(args):
    out, reports, probes = claim_output(args["out"], "study"), {}, {}
    for seed in range(args["seeds"]):  # seed-major: a study stopped early still has whole seeds of every config
        for config in args["configs"]:
            run_dir = run_one(config, seed, out, args["train_args"], args["eval_args"], args["probe_args"], args["wandb_log"])
            reports.setdefault(Path(config).stem, []).append(load_report(run_dir))
            if args["probe_args"] is not None:
                probes.setdefault(Path(config).stem, []).append(json.loads((run_dir / "probes.json").read_text()))
    rows, probe_rows = aggregate(reports), aggregate_probes(probes)
    declared = contrasts(reports, probes, args["control"], list(dict.fromkeys([*PAIRS, *args["contrasts"]])),
                         args["margin"], args["rate_margin"])
    shares = args["ceiling"] and ceiling_shares(reports, args["control"], args["ceiling"])
    result = dict(configs=list(reports), seeds=args["seeds"], confidence=LEVEL, rows=rows, probe_rows=probe_rows,
                  contrasts=declared, ceiling_shares=shares or None)
    md = (f"# Study of {', '.join(reports)}: {args['seeds']} seeds\n\nGenerated by `{args['command']}`; "
          "regenerate it with that command.\n\n" + markdown(rows, args["seeds"], probe_rows, declared, unit_widths(reports),
                                                                      shares and (shares, args["control"], args["ceiling"])))
    write_all(out, {"study.png": plot(rows), "study.json": json_text(result, indent=1) + "\n", "study.md": md})
    print(md + f"-> {out}/study.{{json,md,png}}")
    if args["wandb_log"]:
        log_wandb(result, out, out / "study.png", md)
    return result


def main(argv):
    return run_cli("study.py", lambda: study(parse_args(argv)))


if __name__ == "__main__":
    main(sys.argv[1:])
