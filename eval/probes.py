"""
Does the model use the longer context? Retrieval probes and a look inside the rotation, per scaling method.

    python eval/probes.py out/retrieval_small [--probes copy,passkey,rotation,entropy] [--methods none,crop,pi,...]
        [--distances 0.25,0.5,0.875,2,4,8,16] [--lengths 1,2,4,8] [--depths 0,0.25,0.5,0.75,1]
        [--trials N] [--segment 32] [--seed 0] [--device auto] [--out DIR] [--no-wandb]

copy:     a segment of random tokens in held-out text, repeated `distance` tokens later (distances in
          multiples of the training length); loss and top-1 accuracy on the repeat from its second token.
passkey:  a 5-digit key stated at a depth of held-out text of a given length and asked for at the end;
          teacher-forced log-probability of the key's tokens and greedy exact match (chance: 1e-5).
rotation: per RoPE frequency pair and method, full turns over the training and the evaluation length, and
          whether the method keeps (extrapolates), interpolates or blends the pair. No model forward.
entropy:  attention entropy by query position (mean over layers, heads and windows of held-out text) at
          each of --lengths, per method, next to the uniform distribution's log(t + 1).
Methods are eval/extrapolate.py's (same names, same factor rule: eval length / training length), scored
through eval/score.py's score_rows. A run that does not copy inside its training length is reported as
such: its probe results say nothing about the methods. Writes probes.json, probes.csv and probe_<name>.png.
"""
import sys
from pathlib import Path

import csv
import json
import math
import time
from contextlib import contextmanager

import numpy as np
import torch
from tqdm import tqdm

from data.dataset import doc_windows, load_split
from data.synthetic import KEY_DIGITS, copy_rows, passkey_row, random_vocab
from data.tokenizer import gpt2_tokenizer
from eval.extrapolate import bin_edges, mean_stderr
from eval.methods import ANY_ENCODING, METHODS, applicable, forward_args, original_len, truncates, unavailable
from eval.report import line_style, pyplot
from eval.score import load_run, score_rows
from model import visible
from runtime import arg_parser, init_wandb, number, parse_list, pick_device, run_cli

PROBES = ("copy", "passkey", "rotation", "entropy")
ENTROPY_WINDOWS = 4  # per length: the curves are means over thousands of queries already
RETRIEVES = 0.5  # top-1 on copies inside the training length above which a run counts as one that copies
CSV_FIELDS = ("probe", "method", "eval_len", "distance", "depth", "loss", "loss_stderr", "top1", "top1_stderr",
              "exact", "exact_stderr", "trials", "available", "reason")


# ----------------------------------------------------------------------------- arguments

def parse_args(argv):
    p = arg_parser(__doc__)
    p.add_argument("run_dir")
    p.add_argument("--probes", default=",".join(PROBES), help=f"(default {','.join(PROBES)})")
    p.add_argument("--methods", default="none,crop,pi,ntk,yarn,llama3",
                   help=f"any of {','.join(METHODS)} (default none,crop,pi,ntk,yarn,llama3)")
    p.add_argument("--distances", default="0.25,0.5,0.875,2,4,8,16", help="copy distances, multiples of the training length")
    p.add_argument("--lengths", default="1,2,4,8", help="passkey lengths (and rotation lengths), multiples of the training length")
    p.add_argument("--depths", default="0,0.25,0.5,0.75,1", help="passkey depths: fraction of the filler before the key")
    p.add_argument("--trials", default="20", help="trials per copy distance and per passkey cell (default 20)")
    p.add_argument("--segment", default="32", help="copy probe: tokens in the random segment (default 32)")
    p.add_argument("--seed", default="0")
    p.add_argument("--device", default="auto")
    p.add_argument("--out", default=None, help="output folder (default RUN_DIR)")
    p.add_argument("--no-wandb", dest="wandb", action="store_false", help="do not log to wandb (default: as the run)")
    a = p.parse_args(argv)
    args = dict(run_dir=Path(a.run_dir), out=Path(a.out or a.run_dir), device=pick_device(a.device),
                options=[x for x in argv if x != a.run_dir], wandb=a.wandb,
                probes=parse_list(a.probes, "probes", str, PROBES), methods=parse_list(a.methods, "methods", str, METHODS),
                distances=parse_list(a.distances, "distances", float), lengths=parse_list(a.lengths, "lengths", float),
                depths=parse_list(a.depths, "depths", float), trials=number(a.trials, "trials", int, 2),
                segment=number(a.segment, "segment", int, 2), seed=number(a.seed, "seed", int, 0))
    if min(args["distances"]) <= 0 or min(args["lengths"]) <= 0:
        raise ValueError(f"--distances and --lengths are positive multiples of the training length, got "
                         f"{a.distances} and {a.lengths}")
    bad = [d for d in args["depths"] if not 0 <= d <= 1]
    if bad:
        raise ValueError(f"--depths {', '.join(map(str, bad))} outside [0, 1] (the fraction of the filler before the key)")
    return args


# ----------------------------------------------------------------------------- scoring

def score_method(model, rows, method, train_len, tokens_per_batch=16384):
    """(NLL, top-1 hit) [N, n] of rows [N, n+1] under a method, or (None, reason). train_len: the length the
    methods scale from. Probe targets sit at the end of each row, so crop of an absolute encoding (truncation)
    scores only the row's last L tokens."""
    cfg, n = model.config, rows.shape[1] - 1
    reason = unavailable(cfg, method, n)
    if reason:
        return None, reason
    if truncates(method, cfg.pos_emb) and n > cfg.block_size:
        return score_rows(model, rows[:, -(cfg.block_size + 1):], tokens_per_batch), None
    return score_rows(model, rows, tokens_per_batch, **forward_args(method, n, train_len, cfg.block_size)), None


def entry(probe, method, eval_len, reason=None, **fields):
    out = dict(probe=probe, method=method, eval_len=eval_len, available=reason is None, reason=reason)
    return {**out, **fields}


# ----------------------------------------------------------------------------- copy

def copy_probe(model, tokens, docs, args, vocab):
    """Per distance and method: loss and top-1 on the repeat's tokens 1..segment-1."""
    L, k = model.config.block_size, args["segment"]
    rng = np.random.default_rng(args["seed"])
    out = []
    for mult in args["distances"]:
        d = max(k, round(mult * L))
        n = d + k  # the first copy starts one token in: position 1 .. k, the second ends the window
        filler = np.stack([tokens[s:s + n + 1] for s in doc_windows(docs, n + 1, args["trials"], rng)])
        rows = copy_rows(filler, rng, k, [d] * len(filler), vocab)
        for method in tqdm(args["methods"], desc=f"copy d={d}", leave=False):
            (scored, reason) = score_method(model, rows, method, args["train_len"])
            if reason:
                out.append(entry("copy", method, n, reason, distance=d))
                continue
            nll, hit = (a[:, -(k - 1):] for a in scored)
            loss, loss_err = mean_stderr(nll.mean(axis=1))
            top1, top1_err = mean_stderr(hit.mean(axis=1))
            out.append(entry("copy", method, n, distance=d, loss=loss, loss_stderr=loss_err, top1=top1,
                             top1_stderr=top1_err, trials=len(rows)))
    return out


def retrieval_check(copies, train_len):
    """Does the run copy inside its training length (method none, distances whose window fits in it)?"""
    inside = [r["top1"] for r in copies if r["method"] == "none" and r["available"] and r["eval_len"] <= train_len]
    top1 = float(np.mean(inside)) if inside else None
    return dict(inside_top1=top1, retrieves=top1 is not None and top1 >= RETRIEVES, threshold=RETRIEVES)


# ----------------------------------------------------------------------------- passkey

def passkey_probe(model, tokens, docs, args, encode):
    """Per length x depth x method: teacher-forced log-probability of the key and greedy exact match."""
    L = model.config.block_size
    rng = np.random.default_rng(args["seed"] + 1)
    out = []
    for mult in args["lengths"]:
        n = round(mult * L)
        starts = doc_windows(docs, n, args["trials"], rng)
        for depth in args["depths"]:
            keys = rng.integers(10 ** (KEY_DIGITS - 1), 10 ** KEY_DIGITS, size=len(starts))
            trials = [passkey_row(tokens[s:s + n], encode, int(key), depth) for s, key in zip(starts, keys)]
            rows = np.stack([r for r, _ in trials])
            for method in args["methods"]:
                (scored, reason) = score_method(model, rows, method, args["train_len"])
                if reason:
                    out.append(entry("passkey", method, n, reason, depth=depth))
                    continue
                nll, hit = scored
                logprob = [-nll[i, -m:].sum() for i, (_, m) in enumerate(trials)]
                exact = [hit[i, -m:].all() for i, (_, m) in enumerate(trials)]
                loss, loss_err = mean_stderr([-x for x in logprob])
                acc, acc_err = mean_stderr(exact)
                out.append(entry("passkey", method, n, depth=depth, loss=loss, loss_stderr=loss_err,
                                 exact=acc, exact_stderr=acc_err, trials=len(rows)))
    return out


# ----------------------------------------------------------------------------- rotation

def rotation_probe(model, args):
    """Per method and evaluation length, per frequency pair: turns over the training length (unscaled, what
    training saw) and over the evaluation length (scaled), and the ratio scaled / unscaled frequency
    (None for p-RoPE's pairs that do not rotate)."""
    if model.config.pos_emb != "rope":
        return []
    L = args["train_len"]
    base = model.frequencies(L, {"rope_type": "default"})[0].double()
    out = []
    for mult in args["lengths"]:
        T = round(mult * L)
        for method in args["methods"]:
            # none, crop and logn have no rope_scaling: they leave the frequencies as trained
            freq, attention = model.frequencies(T, forward_args(method, T, L, L).get("rope_scaling"))
            ratio = [f / b if b else None for f, b in zip(freq.double().tolist(), base.tolist())]
            out.append(entry("rotation", method, T, attention_factor=attention,
                             turns_train=(L * base / (2 * math.pi)).tolist(),
                             turns_eval=(T * freq.double() / (2 * math.pi)).tolist(), ratio=ratio,
                             kind=[pair_kind(r, T / L) for r in ratio]))
    return out


def pair_kind(ratio, factor):
    """extrapolated (frequency kept), interpolated (divided by the length factor), blended (between) or
    unrotated (p-RoPE)."""
    if ratio is None:
        return "unrotated"
    if abs(ratio - 1) < 1e-6:
        return "extrapolated"
    return "interpolated" if abs(ratio * factor - 1) < 1e-6 else "blended"


# ----------------------------------------------------------------------------- attention entropy

def attention_entropy(q, k, mask):
    """Entropy (nats) of each query's attention distribution [T], mean over batch and heads, from the inputs
    of model.Attend: mask None (causal), bool (may attend) or a float bias [.., T, Tk] with -inf masking."""
    T, Tk = q.size(-2), k.size(-2)
    att = (q @ k.transpose(-2, -1)).float() / math.sqrt(q.size(-1))
    mask = visible(T, Tk, None, q.device) if mask is None else mask
    att = att.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else att + mask.float()
    p = att.softmax(dim=-1)
    return -(p * p.clamp_min(1e-30).log()).sum(-1).mean(dim=(0, 1))


@contextmanager
def recording_entropy(model):
    """Per layer, a list that gets the attention entropy of each forward, through forward hooks on the layer's
    model.Attend, removed on exit."""
    records = [[] for _ in model.transformer.h]
    hooks = [block.attn.attend.register_forward_hook(lambda module, inputs, output, r=r: r.append(
        attention_entropy(*inputs[:2], inputs[3]))) for block, r in zip(model.transformer.h, records)]
    try:
        yield records
    finally:
        for h in hooks:
            h.remove()


def entropy_probe(model, tokens, docs, args):
    """Per length and method: attention entropy by query position, binned, mean over layers and heads,
    recorded by forward hooks on every layer's attention."""
    L = model.config.block_size
    rng = np.random.default_rng(args["seed"] + 2)
    out = []
    for mult in args["lengths"]:
        n = round(mult * L)
        rows = np.stack([tokens[s:s + n + 1] for s in doc_windows(docs, n + 1, ENTROPY_WINDOWS, rng)])
        edges = bin_edges(n, "linear")
        for method in args["methods"]:
            if truncates(method, model.config.pos_emb) and n > L:
                out.append(entry("entropy", method, n, "crop of an absolute encoding is truncation: no attention over the window"))
                continue
            with recording_entropy(model) as records:  # one window per forward: the attention is [heads, n, n]
                _, reason = score_method(model, rows, method, args["train_len"], n)
            if reason:
                out.append(entry("entropy", method, n, reason))
                continue
            curve = torch.stack([torch.stack(r).mean(0) for r in records]).mean(0).double().cpu().numpy()
            x = (edges[:-1] + edges[1:] - 1) / 2
            out.append(entry("entropy", method, n, x=x.tolist(), uniform=np.log(x + 1).round(4).tolist(),
                             entropy=[round(float(curve[a:b].mean()), 4) for a, b in zip(edges[:-1], edges[1:])],
                             entropy_beyond_train=float(curve[L:].mean()) if n > L else None, trials=len(rows)))
    return out


# ----------------------------------------------------------------------------- outputs

def write_csv(results, path):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in results:
            if r["probe"] in ("copy", "passkey"):  # per-pair and per-position lists live in the JSON
                w.writerow({k: "" if r.get(k) is None else r[k] for k in CSV_FIELDS})


def plot_copy(report, path):
    plt = pyplot()
    L = report["train_len"]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    for i, method in enumerate(report["methods"]):
        rs = [r for r in report["results"] if r["probe"] == "copy" and r["method"] == method and r["available"]]
        if not rs:
            continue
        style = line_style(method, i)
        x = [r["distance"] / L for r in rs]
        for ax, key in zip(axes, ("top1", "loss")):
            ax.errorbar(x, [r[key] for r in rs], yerr=[r[f"{key}_stderr"] or 0 for r in rs], marker="o", ms=3,
                        capsize=2, label=method, **style)
    for ax, what in zip(axes, ("top-1 accuracy on the repeat", "loss on the repeat (nats)")):
        ax.axvline(1, color="grey", ls=":", lw=1)
        ax.set(xscale="log", xlabel="distance between the copies / training length", ylabel=what)
    axes[0].axhline(1 / report["random_vocab"], color="grey", lw=0.8, label="chance")
    axes[0].legend(fontsize=8)
    check = report["retrieval"]
    verdict = ("copies inside its training length" if check["retrieves"] else
               "does NOT copy inside its training length: no method comparison")
    fig.suptitle(f"copy probe, {report['run']} (trained at {L}): {verdict} (top-1 {check['inside_top1']:.2f}); "
                 f"bars: one standard error over trials", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_passkey(report, path):
    plt = pyplot()
    rs = [r for r in report["results"] if r["probe"] == "passkey"]
    methods, lens = report["methods"], sorted({r["eval_len"] for r in rs})
    depths = sorted({r["depth"] for r in rs})
    fig, axes = plt.subplots(1, len(methods), figsize=(2.6 * len(methods) + 1, 3.2), squeeze=False)
    for ax, method in zip(axes[0], methods):
        grid = np.full((len(lens), len(depths)), np.nan)
        for r in rs:
            if r["method"] == method and r["available"]:
                grid[lens.index(r["eval_len"]), depths.index(r["depth"])] = r["exact"]
        im = ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", origin="lower", aspect="auto")
        for (i, j), v in np.ndenumerate(grid):
            ax.text(j, i, "n/a" if np.isnan(v) else f"{v:.2f}", ha="center", va="center", fontsize=7,
                    color="w" if np.isnan(v) or v < 0.5 else "k")
        ax.set(title=method, xticks=range(len(depths)), xticklabels=[f"{d:g}" for d in depths],
               yticks=range(len(lens)), yticklabels=[str(T) for T in lens], xlabel="depth")
    axes[0, 0].set_ylabel("length (tokens)")
    fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8, label="exact match")
    fig.suptitle(f"passkey, {report['run']} (trained at {report['train_len']}): greedy exact match of the "
                 f"{KEY_DIGITS}-digit key, {report['trials']} trials per cell; chance 1e-{KEY_DIGITS}", fontsize=10)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)


def plot_rotation(report, path):
    plt = pyplot()
    rs = [r for r in report["results"] if r["probe"] == "rotation"]
    lens = sorted({r["eval_len"] for r in rs})
    fig, axes = plt.subplots(1, len(lens), figsize=(4.5 * len(lens), 4), squeeze=False)
    for ax, T in zip(axes[0], lens):
        for i, r in enumerate(r for r in rs if r["eval_len"] == T):
            if r["method"] in ANY_ENCODING and r["method"] != "none":
                continue  # same frequencies as none
            ax.plot(r["turns_eval"], marker=".", lw=1, label=r["method"], color=f"C{i % 10}")
        ax.plot(rs[0]["turns_train"], color="k", ls="--", lw=1.2, label="over the training length")
        ax.axhline(1, color="grey", ls=":", lw=1)
        ax.set(yscale="log", title=f"eval length {T}", xlabel="frequency pair i (high to low frequency)",
               ylabel="full turns over the length")
    axes[0, 0].legend(fontsize=7)
    fig.suptitle(f"rotation, {report['run']}: turns per pair; below the dashed line (turns over the training "
                 f"length) a pair never rotates further than training saw", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_entropy(report, path):
    plt = pyplot()
    rs = [r for r in report["results"] if r["probe"] == "entropy" and r["available"]]
    lens = sorted({r["eval_len"] for r in rs})
    fig, axes = plt.subplots(1, len(lens), figsize=(4.5 * len(lens), 4), squeeze=False)
    for ax, T in zip(axes[0], lens):
        for r in (r for r in rs if r["eval_len"] == T):
            style = line_style(r["method"], report["methods"].index(r["method"]))
            ax.plot(r["x"], r["entropy"], lw=1.2, label=r["method"], **style)
        first = next(r for r in rs if r["eval_len"] == T)
        ax.plot(first["x"], first["uniform"], color="grey", ls=":", lw=1, label="uniform")
        ax.axvline(report["train_len"], color="grey", ls=":", lw=1)
        ax.set(title=f"eval length {T}", xlabel="query position", ylabel="attention entropy (nats)")
    axes[0, 0].legend(fontsize=7)
    fig.suptitle(f"attention entropy, {report['run']}: mean over layers, heads and {ENTROPY_WINDOWS} windows", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def log_wandb(report, ckpt, pngs):
    import wandb
    run = init_wandb(ckpt["config"], "probes", group=ckpt["config"].get("wandb_group") or report["run"])
    rows = [[r.get(k) for k in CSV_FIELDS] for r in report["results"] if r["probe"] in ("copy", "passkey")]
    run.log({"probes/summary": wandb.Table(columns=list(CSV_FIELDS), data=rows),
             "probes/retrieves": (report["retrieval"] or {}).get("retrieves"),
             **{f"probes/{p.stem}": wandb.Image(str(p)) for p in pngs}})
    run.finish()


# ----------------------------------------------------------------------------- main

def probes(args):
    model, ckpt, data_dir = load_run(args["run_dir"], args["device"])
    L, vocab = model.config.block_size, model.config.vocab_size
    if {"passkey", "copy", "entropy"} & set(args["probes"]):
        tokens, docs = load_split(data_dir, "val")
    methods = applicable(args["methods"], model.config.pos_emb)
    args = dict(args, methods=methods, train_len=original_len(ckpt))  # methods scale from it, as in extrapolate.py
    rvocab = random_vocab(ckpt["config"].get("retrieval_vocab", 0), vocab)
    probe = dict(copy=lambda: copy_probe(model, tokens, docs, args, rvocab),
               passkey=lambda: passkey_probe(model, tokens, docs, args, gpt2_tokenizer(vocab).encode_ordinary),
               rotation=lambda: rotation_probe(model, args), entropy=lambda: entropy_probe(model, tokens, docs, args))
    results, seconds = [], {}
    for name in args["probes"]:
        t0 = time.time()
        results += probe[name]()
        seconds[name] = round(time.time() - t0, 1)
    copies = [r for r in results if r["probe"] == "copy"]
    report = dict(run=ckpt["config"].get("wandb_run_name") or args["run_dir"].name, train_len=L,
                  pos_emb=model.config.pos_emb, checkpoint_iter=ckpt["iter_num"], options=args["options"],
                  methods=methods, trials=args["trials"], segment=args["segment"], random_vocab=rvocab,
                  retrieval=retrieval_check(copies, L) if copies else None, seconds=round(sum(seconds.values()), 1),
                  seconds_by_probe=seconds, results=results)
    out = args["out"]
    out.mkdir(parents=True, exist_ok=True)
    (out / "probes.json").write_text(json.dumps(report, indent=1) + "\n")
    write_csv(results, out / "probes.csv")
    pngs = []
    for name, draw in (("copy", plot_copy), ("passkey", plot_passkey), ("rotation", plot_rotation),
                       ("entropy", plot_entropy)):
        if name in args["probes"] and any(r["probe"] == name for r in results):
            draw(report, out / f"probe_{name}.png")
            pngs.append(out / f"probe_{name}.png")
    print(summary(report))
    print(f"{len(results)} probe entries in {report['seconds']:.0f}s ("
          + ", ".join(f"{k} {v:.0f}s" for k, v in seconds.items()) + f") -> {out}/probes.{{json,csv}}, "
          + ", ".join(p.name for p in pngs))
    if args["wandb"] and ckpt["config"].get("wandb_log", False):
        log_wandb(report, ckpt, pngs)
    return report


def summary(report):
    lines = []
    if report["retrieval"]:
        c = report["retrieval"]
        lines.append(f"copy inside the training length (none): top-1 {c['inside_top1']:.3f} -> "
                     + ("the run copies" if c["retrieves"] else "the run does NOT copy: the probes compare nothing"))
    for probe, key in (("copy", "top1"), ("passkey", "exact")):
        rs = [r for r in report["results"] if r["probe"] == probe]
        if not rs:
            continue
        cols = sorted({r["distance"] if probe == "copy" else r["eval_len"] for r in rs})
        lines.append(f"{probe} {key} by {'distance' if probe == 'copy' else 'length (mean over depths)'}: "
                     + " ".join(f"{c:>7}" for c in cols))
        for m in report["methods"]:
            cells = []
            for c in cols:
                vals = [r[key] for r in rs if r["method"] == m and r["available"]
                        and (r["distance"] if probe == "copy" else r["eval_len"]) == c]
                cells.append(f"{np.mean(vals):7.3f}" if vals else "    n/a")
            lines.append(f"  {m:<12}" + " ".join(cells))
    return "\n".join(lines)


def main(argv):
    return run_cli("probes.py", lambda: probes(parse_args(argv)))


if __name__ == "__main__":
    main(sys.argv[1:])
