"""
Loss by token position at and past the training length, with RoPE scaling applied at inference.

    python eval/extrapolate.py out/rope_small [--lengths 1,2,4,8,16] [--methods none,pi,ntk,dynamic-ntk,yarn]
        [--factor auto|S] [--dynamic_factor A] [--dynamic_modes sequence,causal] [--n_windows auto|N] [--seed 0]
        [--device auto|cpu|cuda] [--out DIR] [--wandb_log true|false | --no-wandb]

Writes extrapolation.json (everything, incl. the per-position curves), extrapolation.csv (one summary row
per entry) and extrapolation.png into RUN_DIR (or --out), and logs them to wandb if on.
Method: docs/methodology.md (held-out documents, the same windows for every method at a length, each
window scored from position 0).
"""
import sys
from pathlib import Path

# run as `python eval/extrapolate.py` the script's own folder is on sys.path, not the repo root
# where model.py, rope.py, runtime.py and data/ live
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import csv  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
from tqdm import tqdm  # noqa: E402

from data.dataset import doc_windows, load_split  # noqa: E402
from eval.report import fmt, label  # noqa: E402
from eval.score import load_run, score_windows  # noqa: E402
from runtime import arg_parser, init_wandb, pick_device, run_cli  # noqa: E402

METHODS = ("none", "pi", "ntk", "dynamic-ntk", "yarn")
DYNAMIC_MODES = ("sequence", "causal")
CSV_FIELDS = ("method", "mode", "eval_len", "factor", "loss", "ppl", "loss_beyond_train", "ppl_beyond_train", "stderr",
              "n_windows", "available", "reason")
# --n_windows auto: the same number of tokens at every length, that of 4 windows of the longest one
# (64 windows at 1x ... 4 at 16x); fewer than 4 windows leave no meaningful spread
WINDOWS_AT_LONGEST = 4


# ----------------------------------------------------------------------------- arguments

def parse_list(text, name, convert, allowed=None):
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise ValueError(f"--{name} is empty")
    if allowed:
        bad = [t for t in items if t not in allowed]
        if bad:
            raise ValueError(f"unknown --{name} {', '.join(bad)}; allowed: {', '.join(allowed)}")
    try:
        return list(dict.fromkeys(convert(t) for t in items))  # keep order, drop repeats
    except ValueError:
        raise ValueError(f"--{name} {text!r} is not a comma-separated list of numbers") from None


def parse_args(argv):
    p = arg_parser(__doc__)
    p.add_argument("run_dir", help="a run folder holding ckpt.pt (e.g. out/rope_small)")
    p.add_argument("--lengths", default="1,2,4,8,16", help="multiples of the training length (default 1,2,4,8,16)")
    p.add_argument("--methods", default=",".join(METHODS), help=f"RoPE scalings (default {','.join(METHODS)})")
    p.add_argument("--factor", default="auto", help="auto: eval_len / train_len at each length; or one number >= 1 for all")
    p.add_argument("--dynamic_factor", default="1", help="dynamic-ntk's extra NTK multiplier a (transformers' factor; 1 = plain)")
    p.add_argument("--dynamic_modes", default=",".join(DYNAMIC_MODES), help="sequence (one forward, transformers) and/or causal (exact)")
    p.add_argument("--n_windows", default="auto", help=f"windows per length, or auto: as many tokens at every length "
                   f"as {WINDOWS_AT_LONGEST} windows of the longest (default auto)")
    p.add_argument("--seed", default="0", help="seed of the window choice (default 0)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--out", default=None, help="output folder (default RUN_DIR)")
    p.add_argument("--wandb_log", default=None, help="true | false (default: the run's own wandb_log)")
    p.add_argument("--no-wandb", dest="wandb_log", action="store_const", const="false", help="same as --wandb_log false")
    a = p.parse_args(argv)
    args = dict(run_dir=Path(a.run_dir), out=Path(a.out or a.run_dir), device=pick_device(a.device),
                methods=parse_list(a.methods, "methods", str, METHODS),
                dynamic_modes=parse_list(a.dynamic_modes, "dynamic_modes", str, DYNAMIC_MODES),
                lengths=parse_list(a.lengths, "lengths", float))
    if any(m <= 0 for m in args["lengths"]):
        raise ValueError(f"--lengths must be positive multiples of the training length, got {a.lengths}")
    args["factor"] = None if a.factor == "auto" else number(a.factor, "factor", float, 1)
    args["dynamic_factor"] = number(a.dynamic_factor, "dynamic_factor", float, 1)
    args["n_windows"] = None if a.n_windows == "auto" else number(a.n_windows, "n_windows", int, 1)
    args["seed"] = number(a.seed, "seed", int, 0)
    if args["device"].split(":")[0] not in ("cpu", "cuda", "mps"):
        raise ValueError(f"--device {a.device!r} is not one of: auto, cpu, cuda, cuda:N")
    wandb_log = {None: None, "true": True, "false": False}.get(a.wandb_log and a.wandb_log.lower(), "bad")
    if wandb_log == "bad":
        raise ValueError(f"--wandb_log {a.wandb_log!r} is not true or false")
    args["wandb_log"] = wandb_log
    return args


def number(text, name, convert, minimum):
    try:
        value = convert(text)
    except ValueError:
        raise ValueError(f"--{name} {text!r} is not a{'n integer' if convert is int else ' number'}") from None
    if not value >= minimum:  # also catches nan
        raise ValueError(f"--{name} must be >= {minimum}, got {text}")
    return value


# ----------------------------------------------------------------------------- the grid

def rope_scaling(method, factor, train_len):
    """The Hugging Face style dict for a CLI method name other than none (docs/methodology.md)."""
    if method == "pi":
        return {"rope_type": "linear", "factor": factor}
    if method == "ntk":
        return {"rope_type": "ntk", "factor": factor}
    if method == "dynamic-ntk":  # factor is transformers' extra multiplier a, not the length ratio
        return {"rope_type": "dynamic", "factor": factor, "original_max_position_embeddings": train_len}
    return {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": train_len}


def grid(methods, dynamic_modes, eval_lens):
    """(method, mode, eval_len) in output order; only dynamic-ntk has modes."""
    return [(m, mode, T) for m in methods for mode in (dynamic_modes if m == "dynamic-ntk" else [None]) for T in eval_lens]


def choose_windows(docs, eval_len, n_windows, seed):
    """Window starts for one length: eval_len + 1 tokens (inputs and shifted targets) inside one document."""
    try:
        return doc_windows(docs, eval_len + 1, n_windows, np.random.default_rng(seed))
    except ValueError as e:
        raise ValueError(f"length {eval_len} (windows of {eval_len + 1} tokens): {e}") from None


def summarize(nll, train_len):
    """Loss fields of one entry from its [n_windows, eval_len] per-position NLL."""
    n = len(nll)
    beyond = float(nll[:, train_len:].mean()) if nll.shape[1] > train_len else None
    window_means = nll.mean(axis=1)
    return dict(loss=float(nll.mean()), ppl=math.exp(nll.mean()), loss_beyond_train=beyond,
                ppl_beyond_train=None if beyond is None else math.exp(beyond),
                loss_by_position=[round(float(v), 6) for v in nll.mean(axis=0)],
                stderr=float(window_means.std(ddof=1) / math.sqrt(n)) if n > 1 else None)


def unavailable(model, eval_len):
    """Why the model cannot be scored at this length, or None."""
    if model.config.pos_emb == "learned" and eval_len > model.config.block_size:
        return (f"learned position table has {model.config.block_size} entries; cannot encode position "
                f"{eval_len - 1} (a learned model cannot extrapolate)")
    return None


def evaluate(model, tokens, starts, train_len, method, mode, eval_len, factor, scaling):
    entry = dict(method=method, mode=mode, eval_len=eval_len, factor=factor, rope_scaling=scaling,
                 n_windows=len(starts))
    t0 = time.time()
    reason = unavailable(model, eval_len)
    if reason:  # say so, never a made-up number
        empty = dict.fromkeys(("loss", "ppl", "loss_beyond_train", "ppl_beyond_train", "loss_by_position", "stderr"))
        return dict(entry, **empty, available=False, reason=reason, seconds=round(time.time() - t0, 3))
    nll = score_windows(model, tokens, starts, eval_len, rope_scaling=scaling, causal_dynamic=mode == "causal")
    return dict(entry, **summarize(nll, train_len), available=True, reason=None, seconds=round(time.time() - t0, 3))


def run_grid(model, tokens, docs, args, train_len):
    eval_lens = [round(m * train_len) for m in args["lengths"]]
    n_windows = {T: args["n_windows"] or WINDOWS_AT_LONGEST * max(eval_lens) // T for T in eval_lens}
    windows = {T: choose_windows(docs, T, n_windows[T], args["seed"]) for T in eval_lens}  # once per length
    trained = model.config.rope_scaling  # `none` is the model as trained; the methods replace this
    results = []
    for method, mode, T in tqdm(grid(args["methods"], args["dynamic_modes"], eval_lens), desc="extrapolate", unit="eval"):
        if method == "none":
            factor, scaling = None, trained
        else:  # auto: the factor that maps this length back onto the training length (never below 1)
            factor = args["dynamic_factor"] if method == "dynamic-ntk" else args["factor"] or max(1.0, T / train_len)
            scaling = rope_scaling(method, factor, train_len)
        results.append(evaluate(model, tokens, windows[T], train_len, method, mode, T, factor, scaling))
    return results, {str(T): [int(s) for s in w] for T, w in windows.items()}


# ----------------------------------------------------------------------------- outputs

def table(report):
    """Compact text table: rows method (mode), columns eval lengths, cells ppl (ppl beyond the training length)."""
    L = report["train_len"]
    lens = sorted({r["eval_len"] for r in report["results"]})
    rows = {}
    for r in report["results"]:
        cell = fmt(r["ppl"]) + ("" if r["ppl_beyond_train"] is None else f" ({fmt(r['ppl_beyond_train'])})")
        rows.setdefault(label(r), {})[r["eval_len"]] = cell
    head = ["method"] + [f"{T / L:g}x={T}" for T in lens]
    body = [[name] + [cells.get(T, "") for T in lens] for name, cells in rows.items()]
    width = [max(len(row[i]) for row in [head] + body) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, width)) for row in [head] + body]
    return f"ppl (ppl beyond train length {L}) of {report['run']}:\n" + "\n".join(lines)


def write_csv(report, path):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        w.writeheader()
        for r in report["results"]:
            w.writerow({k: "" if r[k] is None else r[k] for k in CSV_FIELDS})


def bin_size(eval_len):
    # bins of ~2% of the length: the raw per-position curve is too noisy to read
    return max(1, eval_len // 50)


def binned(curve, eval_len):
    """(bin centres, mean loss per bin) over whole bins of bin_size(eval_len) positions."""
    size = bin_size(eval_len)
    n = len(curve) // size * size
    y = np.asarray(curve[:n]).reshape(-1, size).mean(axis=1)
    return np.arange(len(y)) * size + (size - 1) / 2, y


def plot(report, path):
    import matplotlib
    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt
    L = report["train_len"]
    lens = sorted({r["eval_len"] for r in report["results"]})
    lens = [T for T in lens if T > L] or lens
    cols = min(2, len(lens))
    rows = math.ceil(len(lens) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(7 * cols, 5.5 * rows), squeeze=False)
    for ax in axes.flat[len(lens):]:
        ax.axis("off")
    for ax, T in zip(axes.flat, lens):
        for r in (r for r in report["results"] if r["eval_len"] == T):
            if not r["available"]:
                ax.plot([], [], " ", label=f"{label(r)}: n/a ({r['reason'].split(';')[0]})")
                continue
            x, y = binned(r["loss_by_position"], T)
            beyond = r["ppl_beyond_train"]
            ax.plot(x, y, lw=1.2, label=f"{label(r)}: ppl {fmt(r['ppl'])}" + (f", beyond {fmt(beyond)}" if beyond else ""))
        ax.axvline(L, color="k", ls="--", lw=1)
        ax.text(L, 1.0, " train length", transform=ax.get_xaxis_transform(), va="top", fontsize=8)
        n = min(r["n_windows"] for r in report["results"] if r["eval_len"] == T)
        ax.set(title=f"eval length {T} ({T / L:g}x), {n} windows", xlabel="token position in window",
               ylabel=f"NLL (mean over windows and bins of {bin_size(T)} positions)")
        ax.legend(fontsize=7, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.13))  # below: keep the curves visible
    fig.suptitle(f"{report['run']} ({report['pos_emb']}, trained at {L}, iter {report['checkpoint_iter']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def log_wandb(report, ckpt, png):
    import wandb
    run = init_wandb(ckpt["config"], "extrapolate", group=ckpt["config"].get("wandb_group") or report["run"])
    rows = [[r[k] for k in CSV_FIELDS] for r in report["results"]]
    run.log({"extrapolation/summary": wandb.Table(columns=list(CSV_FIELDS), data=rows)})
    for T in sorted({r["eval_len"] for r in report["results"]}):
        curves = [r for r in report["results"] if r["eval_len"] == T and r["available"]]
        if curves:
            x = binned(curves[0]["loss_by_position"], T)[0]
            run.log({f"extrapolation/loss_by_position_{T}": wandb.plot.line_series(
                xs=x.tolist(), ys=[binned(r["loss_by_position"], T)[1].tolist() for r in curves],
                keys=[label(r) for r in curves], title=f"NLL by position, eval length {T} (bins of {bin_size(T)})",
                xname="position")})
    run.log({"extrapolation/plot": wandb.Image(str(png))})
    run.finish()


# ----------------------------------------------------------------------------- main

def extrapolate(args):
    model, ckpt, data_dir = load_run(args["run_dir"], args["device"])
    train_len, pos_emb = model.config.block_size, model.config.pos_emb
    if pos_emb != "rope":  # scalings rotate q/k: nothing to scale in a learned, sinusoidal or NoPE model
        other = [m for m in args["methods"] if m != "none"]
        if other:
            print(f"pos_emb={pos_emb}: RoPE methods ({', '.join(other)}) do not apply; evaluating with none only")
        args = dict(args, methods=["none"])
    if model.config.rope_scaling:
        print(f"the run was trained with rope_scaling={model.config.rope_scaling}: `none` evaluates it as trained, "
              f"the other methods replace it")
    if "dynamic-ntk" in args["methods"]:
        print(f"dynamic-ntk: factor a = {args['dynamic_factor']:g} (transformers' extra NTK multiplier, not the "
              f"length ratio; 1 = plain dynamic NTK); modes: {', '.join(args['dynamic_modes'])}")
    tokens, docs = load_split(data_dir, "val")
    t0 = time.time()
    results, windows = run_grid(model, tokens, docs, args, train_len)
    report = dict(train_len=train_len, pos_emb=pos_emb,
                  run=ckpt["config"].get("wandb_run_name") or Path(args["run_dir"]).name,
                  checkpoint_iter=ckpt["iter_num"], n_windows_requested=args["n_windows"] or "auto", seed=args["seed"],
                  dataset=str(data_dir), seconds=round(time.time() - t0, 1), windows=windows, results=results)
    out = args["out"]
    out.mkdir(parents=True, exist_ok=True)
    (out / "extrapolation.json").write_text(json.dumps(report, indent=1) + "\n")
    write_csv(report, out / "extrapolation.csv")
    plot(report, out / "extrapolation.png")
    print(table(report))
    print(f"{len(results)} evaluations in {report['seconds']:.0f}s -> {out}/extrapolation.{{json,csv,png}}")
    wandb_log = args["wandb_log"] if args["wandb_log"] is not None else ckpt["config"].get("wandb_log", False)
    if wandb_log:
        log_wandb(report, ckpt, out / "extrapolation.png")
    return report


def main(argv):
    return run_cli("extrapolate.py", lambda: extrapolate(parse_args(argv)))


if __name__ == "__main__":
    main(sys.argv[1:])
