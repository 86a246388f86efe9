"""
A study: configs x seeds, each trained and evaluated, then aggregated across seeds.

    python eval/study.py configs/rope_small.py configs/nope_small.py [...] [--seeds 3] [--out out/study]
        [--train_args "--max_iters=500"] [--eval_args "--lengths 1,4,16"] [--probe_args "--probes copy"]
        [--wandb_log true|false]

Each run is out/<study>/<config>_seed<k> (train.py --seed=k). A run already trained to its max_iters
is not trained again, one with a partial checkpoint resumes, and one evaluated on its final checkpoint is
not evaluated again: an interrupted study picks up where it stopped. Runs train one after another, never
side by side. Writes study.json (every aggregate), study.md (tables) and study.png into --out, and logs
them to wandb in the study's group (the group of its training runs too).
Aggregates, per (config, protocol, method, length): mean and 95% t-interval across seeds of the loss (ppl
is exp of it), of the loss beyond the training length, and of the paired differences to none and to crop.
With --probe_args ("" for the defaults) each run also gets eval/probes.py, and the study aggregates copy
top-1 per distance and passkey exact match per length (mean over depths) the same way, with how many seeds
copy inside the training length.
"""
import sys
from pathlib import Path

import json
import math
import shlex
import subprocess

import numpy as np
from scipy import stats

from eval.compare import load_report
from eval.report import fmt, label, line_style, panels, pyplot
from runtime import ROOT, arg_parser, run_cli

METRICS = ("loss", "loss_beyond_train", "diff_none", "diff_crop")


# ----------------------------------------------------------------------------- running

def last_iter(run_dir):
    """(iteration of the run's checkpoint, its max_iters), or None if there is none yet."""
    import torch  # only here: aggregating and testing the statistics needs no torch
    path = run_dir / "ckpt.pt"
    if not path.is_file():
        return None
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    return ckpt["iter_num"], ckpt["config"]["max_iters"]


def step(what, cmd):
    print(f"study: {what}: {' '.join(cmd[1:])}", flush=True)
    if subprocess.run(cmd).returncode != 0:
        raise ValueError(f"{what} failed (command: {shlex.join(cmd[1:])}); fix it and run the study again to resume")


def run_one(config, seed, out, train_args, eval_args, probe_args=None):
    """Train (or resume) and evaluate one run unless that is done already; returns its folder."""
    name = f"{Path(config).stem}_seed{seed}"
    run_dir = out / name
    done = last_iter(run_dir)
    if done is None or done[0] < done[1]:
        resume = ["--init_from=resume"] if done else []
        step(f"train {name}", [sys.executable, str(ROOT / "train.py"), config, f"--out_dir={run_dir}", f"--seed={seed}",
                               f"--wandb_group={out.name}", f"--wandb_run_name={name}", *resume,
                               *(a.replace("{seed}", str(seed)) for a in train_args)])
        done = last_iter(run_dir)
    report = run_dir / "extrapolation.json"
    current = report.is_file() and load_report(run_dir)
    # evaluated on the final checkpoint with the study's options, else every seed would not share the windows
    if not current or (current["checkpoint_iter"], current.get("options")) != (done[0], eval_args):
        step(f"evaluate {name}", [sys.executable, str(ROOT / "eval" / "extrapolate.py"), str(run_dir), *eval_args])
    else:
        print(f"study: {name}: trained and evaluated already")
    probes = run_dir / "probes.json"
    current = probes.is_file() and json.loads(probes.read_text())
    if probe_args is not None and (not current or (current["checkpoint_iter"], current["options"]) != (done[0], probe_args)):
        step(f"probe {name}", [sys.executable, str(ROOT / "eval" / "probes.py"), str(run_dir), *probe_args])
    return run_dir


# ----------------------------------------------------------------------------- statistics

def interval(values):
    """Mean and 95% confidence interval (t distribution, n - 1 degrees of freedom) of per-seed values."""
    v = np.asarray([x for x in values if x is not None], dtype=float)
    if len(v) == 0:
        return None
    mean = float(v.mean())
    if len(v) == 1:
        return dict(n=1, mean=mean, lo=None, hi=None)
    half = float(stats.t.ppf(0.975, len(v) - 1) * v.std(ddof=1) / math.sqrt(len(v)))
    return dict(n=len(v), mean=mean, lo=mean - half, hi=mean + half)


def aggregate(reports):
    """{config: [per-seed extrapolation reports]} -> one row per (config, protocol, method, mode, length)."""
    rows = {}
    for config, seeds in reports.items():
        for rep in seeds:
            for r in rep["results"]:
                key = (config, r["protocol"], r["method"], r["mode"], r["eval_len"])
                row = rows.setdefault(key, dict(config=config, protocol=r["protocol"], method=r["method"], mode=r["mode"],
                                                eval_len=r["eval_len"], train_len=rep["train_len"], values={}))
                for m in METRICS:
                    row["values"].setdefault(m, []).append(r[m])
    out = []
    for row in rows.values():
        stats_ = {m: interval(v) for m, v in row["values"].items()}
        out.append(dict({k: v for k, v in row.items() if k != "values"}, **stats_, per_seed=row["values"]))
    return out


def aggregate_probes(reports):
    """{config: [per-seed probes reports]} -> rows of copy top-1 per distance and passkey exact match per
    length (mean over depths) per (config, method), with intervals over seeds."""
    rows = {}
    for config, seeds in reports.items():
        for rep in seeds:
            per = {}
            for r in rep["results"]:
                if r["probe"] in ("copy", "passkey") and r["available"]:
                    at = r["distance"] if r["probe"] == "copy" else r["eval_len"]
                    per.setdefault((r["probe"], r["method"], at), []).append(r["top1" if r["probe"] == "copy" else "exact"])
            for (probe, method, at), v in per.items():
                row = rows.setdefault((config, probe, method, at), dict(config=config, probe=probe, method=method, at=at,
                                                                        train_len=rep["train_len"], values=[]))
                row["values"].append(float(np.mean(v)))
    copies = {c: sum(bool(rep["retrieval"] and rep["retrieval"]["retrieves"]) for rep in seeds) for c, seeds in reports.items()}
    return [dict({k: v for k, v in r.items() if k != "values"}, value=interval(r["values"]), per_seed=r["values"],
                 seeds_that_copy=copies[r["config"]]) for r in rows.values()]


# ----------------------------------------------------------------------------- outputs

def cell(s, transform=lambda x: x, digits=2):
    """'mean [lo, hi]' of an interval, through transform (exp for perplexities); 'n/a' without values."""
    if s is None:
        return "n/a"
    if s["lo"] is None:
        return fmt(transform(s["mean"]), digits)
    return f"{fmt(transform(s['mean']), digits)} [{fmt(transform(s['lo']), digits)}, {fmt(transform(s['hi']), digits)}]"


def markdown(rows, seeds):
    lens = sorted({r["eval_len"] for r in rows})
    L = rows[0]["train_len"]
    head = "| config | method |" + "".join(f" {T / L:g}x ({T}) |" for T in lens)
    rule = "| --- | --- |" + " ---: |" * len(lens)
    tables = []
    for protocol in dict.fromkeys(r["protocol"] for r in rows):
        for metric, title, transform, digits in (
                ("loss", "perplexity", math.exp, 1),
                ("loss_beyond_train", "perplexity beyond the training length", math.exp, 1),
                ("diff_crop", "loss minus crop on the same windows (nats; < 0: the longer context helps)", lambda x: x, 3),
                ("diff_none", "loss minus none on the same windows (nats)", lambda x: x, 3)):
            body = {}
            for r in rows:
                if r["protocol"] == protocol:
                    body.setdefault((r["config"], label(r)), {})[r["eval_len"]] = cell(r[metric], transform, digits)
            lines = [f"| {c} | {m} |" + "".join(f" {cells.get(T, '')} |" for T in lens) for (c, m), cells in body.items()]
            tables.append(f"### {title}, {protocol} protocol\n\nmean [95% CI] over {seeds} seeds\n\n"
                          + "\n".join([head, rule, *lines]))
    return "\n\n".join(tables) + "\n"


def probe_markdown(rows, seeds):
    tables = []
    for probe, what, unit in (("copy", "copy probe: top-1 on the repeat", "distance"),
                              ("passkey", "passkey: exact match, mean over depths", "length")):
        rs = [r for r in rows if r["probe"] == probe]
        if not rs:
            continue
        cols, L = sorted({r["at"] for r in rs}), rs[0]["train_len"]
        body = {}
        for r in rs:
            body.setdefault((r["config"], r["method"], r["seeds_that_copy"]), {})[r["at"]] = cell(r["value"])
        lines = [f"| {c} ({n}/{seeds} copy) | {m} |" + "".join(f" {cells.get(a, '')} |" for a in cols)
                 for (c, m, n), cells in body.items()]
        tables.append(f"### {what}, by {unit}\n\nmean [95% CI] over {seeds} seeds; (k/n copy): seeds whose run copies "
                      f"inside its training length, without which the row compares nothing\n\n"
                      + "\n".join([f"| config | method |" + "".join(f" {a / L:g}x ({a}) |" for a in cols),
                                   "| --- | --- |" + " ---: |" * len(cols), *lines]))
    return "\n\n".join(tables) + "\n" if tables else ""


def plot(rows, path):
    """Per config: perplexity against length with 95% intervals (top), loss minus crop (bottom); windows protocol."""
    plt = pyplot()
    rows = [r for r in rows if r["protocol"] == "windows"]
    configs = list(dict.fromkeys(r["config"] for r in rows))
    names = list(dict.fromkeys(label(r) for r in rows))  # one colour per method in every panel
    fig, places = panels(plt, len(configs), 3, 2, (5.5, 8), sharex=True)
    for (top, bottom), config in zip(places, configs):
        for name in dict.fromkeys(label(r) for r in rows if r["config"] == config):
            pts = sorted((r["eval_len"] / r["train_len"], r) for r in rows if r["config"] == config and label(r) == name)
            style = line_style(name, names.index(name))
            for ax, metric, tf in ((top, "loss", math.exp), (bottom, "diff_crop", lambda x: x)):
                p = [(m, r[metric]) for m, r in pts if r[metric] is not None]
                if not p:
                    continue
                x = [m for m, _ in p]
                y = [tf(s["mean"]) for _, s in p]
                err = [[tf(s["mean"]) - tf(s["lo"] if s["lo"] is not None else s["mean"]) for _, s in p],
                       [tf(s["hi"] if s["hi"] is not None else s["mean"]) - tf(s["mean"]) for _, s in p]]
                ax.errorbar(x, y, yerr=err, marker="o", ms=3, capsize=3, lw=1.2, label=name, **style)
        top.set(title=config, yscale="log", ylabel="perplexity (windows protocol)")
        bottom.axhline(0, color="grey", lw=0.8)
        bottom.set(xlabel="eval length / training length", ylabel="loss minus crop (nats)")
        bottom.set_xscale("log", base=2)
        top.legend(fontsize=7, ncol=2)
    fig.suptitle("mean over seeds, error bars: 95% t-interval; below 0 in the lower row: better than cropping")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def log_wandb(study, out, png, md):
    import wandb

    from runtime import init_wandb
    config = dict(wandb_project="ropelab", wandb_run_name=out.name, configs=study["configs"], seeds=study["seeds"])
    run = init_wandb(config, "study", group=out.name)
    cols = ["config", "protocol", "method", "eval_len"] + [f"{m}_{k}" for m in METRICS for k in ("mean", "lo", "hi")]
    data = [[r["config"], r["protocol"], label(r), r["eval_len"]]
            + [(r[m] or {}).get(k) for m in METRICS for k in ("mean", "lo", "hi")] for r in study["rows"]]
    run.log({"study/table": wandb.Table(columns=cols, data=data), "study/plot": wandb.Image(str(png)),
             "study/markdown": wandb.Html(f"<pre>{md}</pre>")})
    run.finish()


# ----------------------------------------------------------------------------- main

def parse_args(argv):
    p = arg_parser(__doc__)
    p.add_argument("configs", nargs="+", help="config files (configs/*.py)")
    p.add_argument("--seeds", default="3", help="training seeds 0 .. N-1 per config (default 3)")
    p.add_argument("--out", default="out/study", help="the study folder (default out/study); its name is the wandb group")
    p.add_argument("--train_args", default="", help="extra train.py overrides, e.g. \"--max_iters=500\"; {seed} is "
                   "replaced by the seed (fine-tunes: \"--init_from=out/study/rope_small_seed{seed}\")")
    p.add_argument("--eval_args", default="", help="extra eval/extrapolate.py options, e.g. \"--lengths 1,4,16\"")
    p.add_argument("--probe_args", default=None, help="run eval/probes.py on every run with these options "
                   "(\"\" for its defaults); default: no probes")
    p.add_argument("--wandb_log", default="true", help="log the study itself to wandb: true | false (default true)")
    a = p.parse_args(argv)
    missing = [c for c in a.configs if not Path(c).is_file()]
    if missing:
        raise FileNotFoundError(f"config file {', '.join(missing)} not found (see configs/)")
    try:
        seeds = int(a.seeds)
    except ValueError:
        raise ValueError(f"--seeds {a.seeds!r} is not an integer") from None
    if seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {seeds}")
    if a.wandb_log.lower() not in ("true", "false"):
        raise ValueError(f"--wandb_log {a.wandb_log!r} is not true or false")
    return dict(configs=a.configs, seeds=seeds, out=Path(a.out), train_args=shlex.split(a.train_args),
                eval_args=shlex.split(a.eval_args), wandb_log=a.wandb_log.lower() == "true",
                probe_args=None if a.probe_args is None else shlex.split(a.probe_args))


def study(args):
    out = args["out"]
    out.mkdir(parents=True, exist_ok=True)
    reports, probes = {}, {}
    for seed in range(args["seeds"]):  # seed-major: a study stopped early still has whole seeds of every config
        for config in args["configs"]:
            run_dir = run_one(config, seed, out, args["train_args"], args["eval_args"], args["probe_args"])
            reports.setdefault(Path(config).stem, []).append(load_report(run_dir))
            if args["probe_args"] is not None:
                probes.setdefault(Path(config).stem, []).append(json.loads((run_dir / "probes.json").read_text()))
    rows, probe_rows = aggregate(reports), aggregate_probes(probes)
    result = dict(configs=list(reports), seeds=args["seeds"], confidence=0.95, rows=rows, probe_rows=probe_rows)
    (out / "study.json").write_text(json.dumps(result, indent=1) + "\n")
    md = markdown(rows, args["seeds"]) + ("\n" + probe_markdown(probe_rows, args["seeds"]) if probe_rows else "")
    (out / "study.md").write_text(md)
    plot(rows, out / "study.png")
    print(md + f"-> {out}/study.{{json,md,png}}")
    if args["wandb_log"]:
        log_wandb(result, out, out / "study.png", md)
    return result


def main(argv):
    return run_cli("study.py", lambda: study(parse_args(argv)))


if __name__ == "__main__":
    main(sys.argv[1:])
