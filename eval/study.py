"""A study: configs x seeds trained and evaluated one at a time (resuming), aggregated into study.{json,md,png} (README.md)."""
import json
import math
import os
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np

from eval.compare import load_report
from eval.extrapolate import parse_args as eval_options
from eval.probes import parse_args as probe_options
from eval.report import fmt, label, line_style, panels, png, pyplot, write_all
from eval.stats import LEVEL, holm, interval
from runtime import ROOT, UserError, arg_parser, claim_output, init_wandb, json_text, load_checkpoint, number, run_cli
from config import load_config

METRICS = ("loss", "loss_beyond_train", "diff_none", "diff_crop", "diff_none_inside")
KEYS = ("protocol", "method", "mode", "eval_len")  # with the config, what a row aggregates over seeds
PAIRS = (("yarn", "ntk-by-parts"),)  # declared contrasts between two methods: YaRN with and without its temperature


def last_iter(run_dir):
    """(iteration of the run's checkpoint, its max_iters), or None if there is none yet."""
    if (run_dir / "ckpt.pt").is_file():
        return (ckpt := load_checkpoint(run_dir))["iter_num"], ckpt["config"]["max_iters"]


def step(what, cmd):
    print(f"study: {what}: {' '.join(cmd[1:])}", flush=True)
    if subprocess.run(cmd).returncode != 0:
        raise ValueError(f"{what} failed (command: {shlex.join(cmd[1:])}); fix it and run the study again to resume")


def run_one(config, seed, out, train_args, eval_args, probe_args=None):
    """Train (or resume) and evaluate one run unless that is done already; returns its folder."""
    run_dir = out / (name := f"{Path(config).stem}_seed{seed}")
    if (done := last_iter(run_dir)) is None or done[0] < done[1]:
        step(f"train {name}", [sys.executable, str(ROOT / "train.py"), config, f"--out_dir={run_dir}", f"--seed={seed}",
                               f"--wandb_group={out.name}", f"--wandb_run_name={name}",
                               *(a.replace("{seed}", str(seed)) for a in train_args),
                               *(["--init_from=resume"] if done else [])])  # last: it wins over a fine-tune's init_from
        done = last_iter(run_dir)
    # evaluated on the final checkpoint with the study's options, else every seed would not share the windows
    rep = (run_dir / "extrapolation.json").is_file() and load_report(run_dir)
    if not rep or (rep["checkpoint_iter"], rep.get("options")) != (done[0], eval_args) or \
            any("per_unit" not in r for r in rep["results"]):  # an older extrapolate.py kept no per-unit values
        step(f"evaluate {name}", [sys.executable, str(ROOT / "eval" / "extrapolate.py"), str(run_dir), *eval_args])
    else:
        print(f"study: {name}: trained and evaluated already")
    rep = (run_dir / "probes.json").is_file() and json.loads((run_dir / "probes.json").read_text())
    if probe_args is not None and (not rep or (rep["checkpoint_iter"], rep["options"]) != (done[0], probe_args)):
        step(f"probe {name}", [sys.executable, str(ROOT / "eval" / "probes.py"), str(run_dir), *probe_args])
    return run_dir


def spread(values, what):
    """eval.stats.interval of values [seeds, units] (a seed's None: not available), or None where no seed has them."""
    v = [u for u in values if u is not None]
    if len({len(u) for u in v}) > 1:  # the two-way bootstrap pairs unit j of every seed: they must be the same units
        raise ValueError(f"{what}: the seeds were scored on different units ({', '.join(str(len(u)) for u in v)} of them); "
                         "evaluate every seed with the same options")
    return interval(v) if v else None


def aggregate(reports):
    """{config: [per-seed extrapolation reports]} -> one row per (config, protocol, method, mode, length): per metric the
    mean over seeds x units (windows or stretches) and its two-way bootstrap interval; per_seed: each seed's mean."""
    rows, units = {}, {}
    for config, rep, r in ((c, rep, r) for c, seeds in reports.items() for rep in seeds for r in rep["results"]):
        if "per_unit" not in r:
            raise ValueError(f"the evaluation of {rep['run']} has no per-unit values (an older eval/extrapolate.py): "
                             f"run the study again, or eval/extrapolate.py on that run, to re-evaluate it")
        row = rows.setdefault(key := (config, *(r[k] for k in KEYS)), dict(config=config, **{k: r[k] for k in KEYS},
                              train_len=rep["train_len"], per_seed={m: [] for m in METRICS}))
        for m in METRICS:
            row["per_seed"][m].append(r.get(m))  # an entry that is not available has none
            units.setdefault((key, m), []).append((r["per_unit"] or {}).get(m))  # None: the entry is not available
    return [dict(row, **{m: spread(units[key, m], f"{' '.join(map(str, key))} {m}") for m in METRICS}) for key, row in rows.items()]


def aggregate_probes(reports):
    """{config: [per-seed probes reports]} -> copy and MQAR top-1 per distance, passkey exact match per length, over
    seeds x trials (passkey: depths x trials); an entry without per-trial hits counts as one unit, its mean."""
    rows, units = {}, {}
    for config, seeds in reports.items():
        copies = sum(bool(rep["retrieval"] and rep["retrieval"]["retrieves"]) for rep in seeds)
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
    return [dict(r, value=spread(units[key], " ".join(map(str, key)))) for key, r in rows.items()]


def between(reports, a, b):
    """(config, length, interval) of method a minus method b over the targets past L (windows protocol), paired on the
    same seeds x windows: for yarn and ntk-by-parts, YaRN's temperature alone (the same frequencies)."""
    diffs = {}
    for config, seeds in reports.items():
        for rep in seeds:
            past = {(r["method"], r["eval_len"]): (r["per_unit"] or {}).get("diff_crop") for r in rep["results"]
                    if r["protocol"] == "windows" and r["eval_len"] > rep["train_len"]}
            for (m, T), v in past.items():
                if m == a and v is not None and past.get((b, T)) is not None:
                    diffs.setdefault((config, T), []).append(np.subtract(v, past[b, T]).tolist())
    return [(c, T, spread(v, f"{c} {a} - {b} at {T}")) for (c, T), v in diffs.items()]


def past_l(rep, r):
    """r's per-window loss over the targets past L (windows protocol), or None."""
    if r["protocol"] == "windows" and r["eval_len"] > rep["train_len"]:
        return (r["per_unit"] or {}).get("loss_beyond_train")


def against(reports, control):
    """(config, method, length, interval) of each other config's loss past L minus the control config's crop, paired on
    seed k and window j: a fine-tune and its control (trained on for the same tokens at L) start from the same seed."""
    crop = [{r["eval_len"]: past_l(rep, r) for r in rep["results"] if r["method"] == "crop"} for rep in reports[control]]
    diffs = {}
    for config in (c for c in reports if c != control):
        for rep, ref in zip(reports[config], crop):
            for r in rep["results"]:
                if (v := past_l(rep, r)) is not None and ref.get(r["eval_len"]) is not None:
                    diffs.setdefault((config, label(r), r["eval_len"]), []).append(np.subtract(v, ref[r["eval_len"]]).tolist())
    return [(*key, spread(v, f"{' '.join(map(str, key))} - {control} crop")) for key, v in diffs.items()]


def contrasts(rows, reports=None, control=None):
    """The declared family: each method but crop against crop past L (diff_crop, windows protocol, every length > L and
    config), each of PAIRS (a minus b past L, from the reports), and with a control config every other config's methods
    against the control's crop, decided together by Holm's procedure."""
    family = [(dict(config=r["config"], method=label(r), eval_len=r["eval_len"]), "crop", r["diff_crop"]) for r in rows
              if r["protocol"] == "windows" and r["method"] != "crop" and r["eval_len"] > r["train_len"] and r["diff_crop"]]
    family += [(dict(config=c, method=f"{a} - {b}", eval_len=T), b, d) for a, b in PAIRS for c, T, d in between(reports or {}, a, b)]
    if control:
        family += [(dict(config=c, method=f"{m} - {control} crop", eval_len=T), f"{control} crop", d)
                   for c, m, T, d in against(reports, control)]
    return [dict(key, **{k: d[k] for k in ("mean", "lo", "hi", "p")},
                 decision=f"{'lower' if d['mean'] < 0 else 'higher'} than {ref}" if decided else "undecided")
            for (key, ref, d), decided in zip(family, holm([d["p"] for _, _, d in family]))]


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


def section(title, rows, stat, seeds, unit, L, key=lambda r: (r["config"], label(r)), at=lambda r: r["eval_len"],
            transform=lambda x: x, digits=3, note=""):
    """'### title', what a cell is over, and the table of r[stat], a row per key(r), a column per at(r); None if no row has it."""
    if units := dict(sorted((at(r), r[stat]["units"]) for r in rows if r[stat])):
        n = f"{units.popitem()[1]} {unit}" if len(set(units.values())) == 1 else f"U {unit}, U = " + ", ".join(
            f"{u} at {a / L:g}x" for a, u in units.items())  # windows: fewer as they get longer
        return (f"### {title}\n\nmean [{LEVEL:.0%} bootstrap interval over {seeds} seeds x {n}]{note}\n\n"
                + table([(key(r), at(r), cell(r[stat], transform, digits)) for r in rows], sorted({at(r) for r in rows}), L))


def markdown(rows, seeds, probe_rows=(), reports=None, control=None):
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
                                  key=lambda r: (f"{r['config']} ({r['seeds_that_copy']}/{seeds} copy)", r["method"]),
                                  note="; (k/n copy): seeds whose run copies inside L, without which the row compares nothing"))
    if declared := contrasts(rows, reports, control):
        cells = [((c["config"], c["method"]), c["eval_len"], f"{cell(c, digits=3)} {c['decision'].split()[0]}") for c in declared]
        versus = f", every method of the other configs minus {control}'s crop (paired on seeds x windows)" if control else ""
        tables.append(f"### Declared contrasts: loss minus crop over the targets past L, windows protocol\n\nmean [{LEVEL:.0%} "
                      f"bootstrap interval] and the decision; the family, every method but crop at every length past L in every "
                      f"config, {', '.join(f'{a} minus {b}' for a, b in PAIRS)} (YaRN's temperature alone, paired on the "
                      f"same windows){versus} (m = {len(declared)}), is decided together by Holm's procedure at "
                      f"{1 - LEVEL:.2f} family-wise.\n\n" + table(cells, sorted({c["eval_len"] for c in declared}), L))
    return "\n\n".join(t for t in tables if t) + "\n"


def plot(rows):
    """PNG bytes: per config, perplexity against length (top), loss minus crop past L (bottom); windows protocol."""
    rows = [r for r in rows if r["protocol"] == "windows"]
    configs = list(dict.fromkeys(r["config"] for r in rows))
    names = list(dict.fromkeys(label(r) for r in rows))  # one colour per method in every panel
    fig, places = panels(pyplot(), len(configs), 3, 2, (5.5, 8), sharex=True)
    for (top, bottom), config in zip(places, configs):
        for name in dict.fromkeys(label(r) for r in rows if r["config"] == config):
            pts = sorted((r["eval_len"] / r["train_len"], r) for r in rows if r["config"] == config and label(r) == name)
            for ax, metric, tf in ((top, "loss", math.exp), (bottom, "diff_crop", lambda x: x)):
                if p := [(m, r[metric]) for m, r in pts if r[metric] is not None]:
                    y, lo, hi = (np.array([tf(s[k]) for _, s in p]) for k in ("mean", "lo", "hi"))
                    ax.errorbar([m for m, _ in p], y, yerr=np.clip([y - lo, hi - y], 0, None), marker="o", ms=3, capsize=3,
                                lw=1.2, label=name, **line_style(name, names.index(name)))  # clip: bars >= 0, as matplotlib wants
        top.set(title=config, yscale="log", ylabel="perplexity (windows protocol)")
        bottom.axhline(0, color="grey", lw=0.8)
        bottom.set(xlabel="eval length / training length", ylabel="loss minus crop past L (nats)")
        bottom.set_xscale("log", base=2)
        top.legend(fontsize=7, ncol=2)
    fig.suptitle(f"mean over seeds x windows; error bars: {LEVEL:.0%} bootstrap interval\n(seeds and windows resampled); "
                 "lower row below 0: better than crop", fontsize=10)
    return png(fig)


def log_wandb(study, out, png_path, md):
    import wandb
    cols = ["config", "protocol", "method", "eval_len"] + [f"{m}_{k}" for m in METRICS for k in ("mean", "lo", "hi", "p")]
    data = [[r["config"], r["protocol"], label(r), r["eval_len"]]
            + [(r[m] or {}).get(k) for m in METRICS for k in ("mean", "lo", "hi", "p")] for r in study["rows"]]
    with init_wandb(dict(wandb_project="ropelab", wandb_run_name=out.name, configs=study["configs"], seeds=study["seeds"]),
                    "study", group=out.name) as run:
        run.log({"study/table": wandb.Table(columns=cols, data=data), "study/plot": wandb.Image(str(png_path)),
                 "study/markdown": wandb.Html(f"<pre>{md}</pre>")})


def from_root(path):
    """path relative to the repo root where it lies inside it, else absolute; a link inside the root (out/ on another
    disk) stays as written."""
    for p in (Path(os.path.abspath(path)), Path(path).resolve()):  # abspath: ".." folded, links kept
        if p.is_relative_to(ROOT):
            return str(p.relative_to(ROOT))
    return str(Path(path).resolve())


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
    p = arg_parser(__doc__)
    p.add_argument("configs", nargs="+", help="config files (configs/*.py)")
    for name, default, text in (
            ("seeds", "3", "seeds per config"), ("out", "out/study", "the study's folder"),
            ("train_args", "", "options for every train.py run ({seed}: the seed)"),
            ("eval_args", "", "options for every eval/extrapolate.py run"),
            ("probe_args", None, "options for eval/probes.py ('' for its defaults; not given: no probes)"),
            ("control", None, "one of the configs: every other config's methods against its crop past L (a matched control)"),
            ("wandb_log", "true", "true | false")):
        p.add_argument(f"--{name}", default=default, help=f"{text} (default {default!r})")
    a = p.parse_args(argv)
    if a.wandb_log.lower() not in ("true", "false"):
        raise ValueError(f"--wandb_log {a.wandb_log!r} is not true or false")
    args = dict(configs=a.configs, seeds=number(a.seeds, "seeds", int, 1), out=Path(a.out), train_args=shlex.split(a.train_args),
                eval_args=shlex.split(a.eval_args), wandb_log=a.wandb_log.lower() == "true",
                probe_args=None if a.probe_args is None else shlex.split(a.probe_args),
                control=a.control and Path(a.control).stem)
    if clash := same_names(a.configs):
        raise UserError(f"configs {', '.join(clash)} share the name {Path(clash[0]).stem!r}, which names their runs "
                        "(<out>/<name>_seed<k>) and their rows: give each config once, under distinct file names")
    if owned := [t for t in args["train_args"] if t.split("=")[0] == "--out_dir"]:
        raise UserError(f"--train_args {' '.join(owned)}: the study owns its runs' folders (<out>/<config>_seed<k>); "
                        "use --out for the study's folder instead")
    if a.control and a.control not in a.configs:
        raise ValueError(f"--control {a.control!r} is not one of the study's configs ({', '.join(a.configs)})")
    for config in a.configs:  # train.py's own checks, as each run will get them
        load_config([config, *(t.replace("{seed}", "0") for t in args["train_args"])])
    for name, check in (("eval_args", eval_options), ("probe_args", probe_options)):
        try:
            if args[name] is not None:
                check(["RUN_DIR", *args[name]])  # a placeholder run: only the options are checked
        except ValueError as e:
            raise ValueError(f"--{name}: {e}") from None
    given = dict(vars(a), configs=None, out=from_root(a.out))  # the options that differ from their defaults
    args["command"] = shlex.join(["python", "eval/study.py", *map(from_root, a.configs),
                                  *(f"--{k}={v}" for k, v in given.items() if v != p.get_default(k))])
    return args


def study(args):
    out, reports, probes = claim_output(args["out"], "study"), {}, {}
    for seed in range(args["seeds"]):  # seed-major: a study stopped early still has whole seeds of every config
        for config in args["configs"]:
            run_dir = run_one(config, seed, out, args["train_args"], args["eval_args"], args["probe_args"])
            reports.setdefault(Path(config).stem, []).append(load_report(run_dir))
            if args["probe_args"] is not None:
                probes.setdefault(Path(config).stem, []).append(json.loads((run_dir / "probes.json").read_text()))
    rows, probe_rows = aggregate(reports), aggregate_probes(probes)
    declared = contrasts(rows, reports, args["control"])
    result = dict(configs=list(reports), seeds=args["seeds"], confidence=LEVEL, rows=rows, probe_rows=probe_rows,
                  contrasts=dict(family_size=len(declared), holm_alpha=round(1 - LEVEL, 6), rows=declared))
    md = (f"# Study of {', '.join(reports)}: {args['seeds']} seeds\n\nGenerated by `{args['command']}`; "
          "regenerate it with that command.\n\n" + markdown(rows, args["seeds"], probe_rows, reports, args["control"]))
    write_all(out, {"study.png": plot(rows), "study.json": json_text(result, indent=1) + "\n", "study.md": md})
    print(md + f"-> {out}/study.{{json,md,png}}")
    if args["wandb_log"]:
        log_wandb(result, out, out / "study.png", md)
    return result


def main(argv):
    return run_cli("study.py", lambda: study(parse_args(argv)))


if __name__ == "__main__":
    main(sys.argv[1:])
