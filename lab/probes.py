"""Does the model use the longer context? Retrieval probes and the rotation per scaling method; writes probes.{json,csv}
and probe_<name>.png once all is computed. Options and outputs: docs/reference.md; why: docs/methodology.md."""
import sys

import math
import time
from contextlib import ExitStack, contextmanager

import numpy as np
import torch
from tqdm import tqdm


from data.dataset import doc_windows, in_tokens, load_split
from data.synthetic import mqar_rows, random_vocab
from data.tokenizer import run_tokenizer
from eval.methods import (METHODS_TABLE, MASKS, METHODS, PAIRS_OPTION, check_pairs, forward_args,
                          parse_pairs, unavailable, usable)
from lab.stats import RETRIEVES
from eval.report import WEIGHTS, fmt, json_csv, line_style, png, pyplot, write_all
from eval.score import score_rows
from eval.summary import bin_edges, mean_stderr
from model import POS_EMBS
from positions import attention
from lab.bound import first_negative
from rope import frequencies
from lab.trials import KEY_DIGITS, copy_trials, passkey_row
from common import (UserError, claim_output, command_parser, parse_number, parse_list, run_cli, shared_values,
                    unless_check)
from runtime import load_run
from lab.pages import probe_metrics
from wandb_runs import log_results, ready_to_log

ANY_ENCODING = tuple(m for m, e in METHODS_TABLE.items() if e.encodings == POS_EMBS)  # on the input or on attention
PROBES = ("copy", "mqar", "passkey", "rotation", "entropy")
READS = dict(copy="distances", mqar="distances", passkey="lengths", rotation="lengths", entropy="lengths")  # in tokens
ENTROPY_WINDOWS = 4  # per length: the curves are means over thousands of queries already
CSV_FIELDS = ("probe", "method", "eval_len", "distance", "depth", "loss", "loss_stderr", "top1", "top1_stderr",
              "exact", "exact_stderr", "trials", "available", "reason")


def attention_weights(q, k, v, pos, ssmax=None, dropout=0.0):
    """`attention`'s probabilities [B, H, T, Tk] over Attend's inputs: its output for v the identity."""
    eye = torch.eye(k.size(2), dtype=v.dtype, device=v.device).expand(*k.shape[:2], -1, -1)
    return attention(q, k, eye, pos, ssmax)


def parse_args(argv):
    p = command_parser(__doc__, "run_dir", "out", "device", "seed", "wandb", "check")
    for name, default, text in (
            ("probes", "copy,passkey,rotation,entropy", f"which probes: {', '.join(PROBES)}"), ("methods", "none,crop,pi,ntk,yarn,llama3", "eval/methods.py's"),
            ("distances", "0.25,0.5,0.875,2,4,8,16", "copy distances, multiples of the training length (a fine-tune: its origin's)"),
            ("lengths", "1,2,4,8", "passkey, rotation and entropy lengths, multiples of the training length (as --distances)"),
            ("depths", "0,0.25,0.5,0.75,1", "passkey depths: the fraction of the filler before the key"),
            ("trials", "20", "trials per copy distance and passkey cell"),
            ("segment", "32", "tokens in the copied segment (mqar: segment // 2 key-value pairs)"),
            ("copy_source", "random", "the copied segment: random ids, or text (a stretch of held-out text)"),
            PAIRS_OPTION):
        p.add_argument(f"--{name}", default=default, help=f"{text} (default {default})")
    a = p.parse_args(argv)
    args = dict(shared_values(a), options=[x for x in argv if x != a.run_dir],
                probes=parse_list(a.probes, "probes", str, PROBES), methods=parse_list(a.methods, "methods", str, METHODS),
                distances=parse_list(a.distances, "distances", float), lengths=parse_list(a.lengths, "lengths", float),
                depths=parse_list(a.depths, "depths", float), trials=parse_number(a.trials, "trials", int, 2),
                segment=parse_number(a.segment, "segment", int, 2),
                pair_factors=parse_pairs(a.pair_factors), copy_source=a.copy_source,
                defaults={k for k in ("distances", "lengths") if getattr(a, k) == p.get_default(k)})
    if (a.pair_factors is None) == ("pairs" in args["methods"]):  # given where it applies, and only there
        raise UserError("--methods pairs needs --pair_factors" if a.pair_factors is None else
                        f"--pair_factors applies to the method pairs only, which --methods {a.methods} "
                        "leaves out")
    if a.copy_source not in ("random", "text"):
        raise UserError(f"--copy_source {a.copy_source!r} is not one of: random, text")
    if min(args["distances"]) <= 0 or min(args["lengths"]) <= 0:
        raise UserError(f"--distances and --lengths are positive multiples of the training length, got "
                         f"{a.distances} and {a.lengths}")
    if bad := [d for d in args["depths"] if not 0 <= d <= 1]:
        raise UserError(f"--depths {', '.join(map(str, bad))} outside [0, 1] (the fraction of the filler before the key)")
    return args


def once(args, option, shortest, used):
    """--option's multiples are distinct cells in tokens (a copy is at least a segment away: copy_trials,
    mqar_probe), else one line: a cell scored twice would count twice in a study."""
    tokens = [max(shortest, round(m * args["train_len"])) for m in args[option]]
    if option in args.get("defaults", ()):  # the default list at a short L: its repeats are dropped, not refused
        args[option] = [m for i, (m, t) in enumerate(zip(args[option], tokens)) if t not in tokens[:i]]
        return
    if used and len(set(tokens)) < len(tokens):
        T = next(t for t in tokens if tokens.count(t) > 1)
        same = [f"{m:g}" for m, t in zip(args[option], tokens) if t == T]
        short = T == shortest > 1
        why = f"at least --segment {args['segment']} apart" if short else f"at L = {args['train_len']}"
        raise UserError(f"--{option} {' and '.join(same)} are both {T} tokens ({why}): each cell would be "
                        f"scored twice; give each once{', or a shorter --segment' if short else ''}")


def positions(method, n, args, run_len):
    """The method's positions.PositionArgs over n tokens (pairs: with the --pair_factors)."""
    return forward_args(method, n, args["train_len"], run_len, args["pair_factors"] if method == "pairs" else None)


def score_method(model, rows, method, args, tokens_per_batch=16384):
    """(NLL, top-1 hit) of rows [N, n+1] under a method, or (None, reason); crop: of the last L targets only."""
    cfg, n = model.config, rows.shape[1] - 1
    if reason := unavailable(cfg, method, n):
        return None, reason
    return score_rows(model, rows, tokens_per_batch, method=positions(method, n, args, cfg.block_size)), None


def entry(probe, method, eval_len, reason=None, **fields):
    return dict(probe=probe, method=method, eval_len=eval_len, available=reason is None, reason=reason, **fields)


def per_method(probe, model, rows, args, methods, measure, **fields):
    """One entry per method: fields and measure(NLL, hit)'s, or the reason the method cannot score the rows."""
    for method in methods:
        scored, reason = score_method(model, rows, method, args)
        yield entry(probe, method, rows.shape[1] - 1, reason, **fields, **({} if reason else measure(*scored)))


def per_trial(nll, hits):
    """Loss and top-1 from per-trial means, and the trials' hits: a study's bootstrap resamples them."""
    (loss, loss_err), (top1, top1_err) = mean_stderr(nll), mean_stderr(hits)
    return dict(loss=loss, loss_stderr=loss_err, top1=top1, top1_stderr=top1_err, trials=len(hits),
                hits=hits.round(4).tolist())


def copy_probe(model, tokens, docs, args, vocab):
    """Per distance and method: loss and top-1 on the repeat's tokens 1..segment-1."""
    k = args["segment"]
    for d, rows in copy_trials(tokens, docs, args["train_len"], args, vocab):
        measure = lambda nll, hit: per_trial(nll[:, -(k - 1):].mean(axis=1), hit[:, -(k - 1):].mean(axis=1))
        yield from per_method("copy", model, rows, args, tqdm(args["methods"], desc=f"copy d={d}", leave=False),
                              measure, distance=d)


def mqar_probe(model, tokens, docs, args, vocab):
    """Per distance d and method: loss and top-1 on the values after the queries. segment // 2 pairs start the row and
    are asked (shuffled) in its last segment tokens, held-out text between: each query d - 2(p-1) .. d + 2(p-1) tokens
    after its key, d on average. crop sees the pairs only while d + segment - 1 <= the run's block_size."""
    L, p, rng = args["train_len"], args["segment"] // 2, np.random.default_rng(args["seed"] + 3)
    for mult in args["distances"]:
        d = max(2 * p, round(mult * L))
        n = d + 2 * p - 1  # targets: the row is d + 2p tokens, pairs at 0 .. 2p-1, queries at d .. d + 2p - 1
        filler = np.stack([tokens[s:s + n + 1] for s in doc_windows(docs, n + 1, args["trials"], rng)])
        rows, mask = mqar_rows(filler, rng, p, vocab, [d + 2 * np.arange(p)] * len(filler))

        def measure(nll, hit):
            values = mask[:, 1:][:, -nll.shape[1]:]  # the scored targets; crop scores only the last L
            return per_trial(nll[values].reshape(len(rows), p).mean(axis=1), hit[values].reshape(len(rows), p).mean(axis=1))
        yield from per_method("mqar", model, rows, args, tqdm(args["methods"], desc=f"mqar d={d}", leave=False),
                              measure, distance=d)


def retrieval_check(copies, train_len, text=False):
    """Does the run copy inside its training length (method none, distances whose window fits in it)? Not judged for a
    text segment (retrieves None): text is predictable without its first copy, so top-1 alone cannot tell copying."""
    inside = [r["top1"] for r in copies if r["method"] == "none" and r["available"] and r["eval_len"] <= train_len]
    top1 = float(np.mean(inside)) if inside else None
    return dict(inside_top1=top1, retrieves=None if text else top1 is not None and top1 >= RETRIEVES, threshold=RETRIEVES)


def copy_verdict(c):
    return ("copies inside its training length" if c["retrieves"] else "not checked inside its training length"
            if c["inside_top1"] is None else "not judged: a text segment is predictable without its first copy"
            if c["retrieves"] is None else "does NOT copy inside its training length: no method comparison")


def passkey_probe(model, tokens, docs, args, encode):
    """Per length x depth x method: teacher-forced log-probability of the key and greedy exact match."""
    L, rng = args["train_len"], np.random.default_rng(args["seed"] + 1)
    for mult in args["lengths"]:
        n = round(mult * L)
        starts = doc_windows(docs, n, args["trials"], rng)
        for depth in args["depths"]:
            keys = rng.integers(10 ** (KEY_DIGITS - 1), 10 ** KEY_DIGITS, size=len(starts))
            trials = [passkey_row(tokens[s:s + n], encode, int(key), depth) for s, key in zip(starts, keys)]
            rows = np.stack([r for r, _ in trials])

            def measure(nll, hit):  # the loss is minus the key's log-probability
                loss, loss_err = mean_stderr([nll[i, -m:].sum() for i, (_, m) in enumerate(trials)])
                hits = [float(hit[i, -m:].all()) for i, (_, m) in enumerate(trials)]
                acc, acc_err = mean_stderr(hits)
                return dict(loss=loss, loss_stderr=loss_err, exact=acc, exact_stderr=acc_err, trials=len(rows), hits=hits)
            yield from per_method("passkey", model, rows, args, args["methods"], measure, depth=depth)


def rotation_probe(model, args):
    """Per length, method and frequency pair: turns over the training (unscaled) and the evaluation length (scaled);
    per length and method, the first distance where Men et al.'s B_m of the frequencies used is negative."""
    if model.config.pos_emb != "rope":
        return
    L = args["train_len"]
    base = frequencies(model.config, {"rope_type": "default"}, L)[0].double()
    for mult in args["lengths"]:
        T = round(mult * L)
        for method in args["methods"]:
            freq, attention = frequencies(model.config, positions(method, T, args, L).rope_scaling, T)
            ratio = [f / b if b else None for f, b in zip(freq.double().tolist(), base.tolist())]
            yield entry("rotation", method, T, attention_factor=attention, turns_train=(L * base / (2 * math.pi)).tolist(),
                        turns_eval=(T * freq.double() / (2 * math.pi)).tolist(), ratio=ratio,
                        kind=[pair_kind(r, T / L) for r in ratio], bound_negative_at=first_negative(freq, T))


def pair_kind(ratio, factor):
    """extrapolated (frequency kept), interpolated (divided by the factor), blended or unrotated (p-RoPE)."""
    return ("unrotated" if ratio is None else "extrapolated" if abs(ratio - 1) < 1e-6
            else "interpolated" if abs(ratio * factor - 1) < 1e-6 else "blended")


def attention_entropy(weights):
    """Entropy (nats) of each query's attention [T], mean over batch and heads, of attention weights [B, H, T, Tk]."""
    p = weights.float()
    return -(p * p.clamp_min(1e-30).log()).sum(-1).mean(dim=(0, 1))


@contextmanager
def recording_entropy(model):
    """Per layer, a list that gets the attention entropy of each forward (hooks on positions.Attend, removed on exit)."""
    records = [[] for _ in model.transformer.h]
    with ExitStack() as hooks:
        for block, r in zip(model.transformer.h, records):
            hooks.enter_context(block.attn.attend.register_forward_hook(
                lambda module, inputs, output, r=r: r.append(attention_entropy(attention_weights(*inputs)))))
        yield records


def entropy_probe(model, tokens, docs, args):
    """Per length and method: attention entropy by query position, binned, mean over layers and heads."""
    L, T, rng = model.config.block_size, args["train_len"], np.random.default_rng(args["seed"] + 2)
    for mult in args["lengths"]:
        n = round(mult * T)
        rows = np.stack([tokens[s:s + n + 1] for s in doc_windows(docs, n + 1, ENTROPY_WINDOWS, rng)])
        edges = bin_edges(n, "linear")
        x = (edges[:-1] + edges[1:] - 1) / 2
        for method in args["methods"]:
            with recording_entropy(model) as records:  # one window per forward: the attention is [heads, n, n]
                reason = ("crop is truncation: no attention over the window"
                          if method == "crop" and n > L
                          else score_method(model, rows, method, args, n)[1])
            if reason:
                yield entry("entropy", method, n, reason)
                continue
            curve = torch.stack([torch.stack(r).mean(0) for r in records]).mean(0).double().cpu().numpy()
            yield entry("entropy", method, n, x=x.tolist(), uniform=np.log(x + 1).round(4).tolist(),
                        entropy=[round(float(curve[a:b].mean()), 4) for a, b in zip(edges[:-1], edges[1:])],
                        entropy_beyond_train=float(curve[T:].mean()) if n > T else None, trials=len(rows))


def plot_copy(report, probe="copy"):
    L, (fig, axes) = report["train_len"], pyplot().subplots(1, 2, figsize=(13, 4.5))
    for method in report["methods"]:
        if rs := [r for r in report["results"] if r["probe"] == probe and r["method"] == method and r["available"]]:
            for ax, key in zip(axes, ("top1", "loss")):
                ax.errorbar([r["distance"] / L for r in rs], [r[key] for r in rs], ms=4, capsize=2,
                            yerr=[r[f"{key}_stderr"] or 0 for r in rs], label=method, **line_style(method))
    on, between = ("the values", "pairs and queries") if probe == "mqar" else ("the repeat", "the copies")
    for ax, what in zip(axes, (f"top-1 accuracy on {on}", f"loss on {on} (nats)")):
        ax.axvline(1, color="grey", ls=":", lw=1)
        ax.set(xscale="log", xlabel=f"distance between {between} / training length", ylabel=what)
    v = report["random_vocab"]  # chance: uniform over the ids the values (mqar) or the random segment are drawn from
    if probe == "mqar" or report.get("copy_source", "random") == "random":  # a text segment has no such chance level
        axes[0].axhline(1 / (v - v // 2 if probe == "mqar" else v), color="grey", lw=0.8, label="chance")
    axes[0].legend(fontsize=8)
    if probe == "mqar":
        fig.suptitle(f"MQAR probe, {report['run']} (trained at {L}): {report['segment'] // 2} key-value pairs, asked "
                     f"after held-out text; bars: one standard error over trials", fontsize=10)
        return png(fig)
    c = report["retrieval"]
    fig.suptitle(f"copy probe, {report['run']} (trained at {L}): {copy_verdict(c)} (top-1 {fmt(c['inside_top1'])}); "
                 f"bars: one standard error over trials", fontsize=10)
    return png(fig)


def plot_passkey(report):
    rs = [r for r in report["results"] if r["probe"] == "passkey"]
    methods, lens, depths = report["methods"], sorted({r["eval_len"] for r in rs}), sorted({r["depth"] for r in rs})
    fig, axes = pyplot().subplots(1, len(methods), figsize=(2.6 * len(methods) + 1, 3.2), squeeze=False)
    for ax, method in zip(axes[0], methods):
        grid = np.full((len(lens), len(depths)), np.nan)
        for r in (r for r in rs if r["method"] == method and r["available"]):
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
    return png(fig, tight=False, bbox_inches="tight")


def plot_by_length(report, probe):
    """rotation or entropy: one panel per evaluation length, of its available entries."""
    rs, rotation = [r for r in report["results"] if r["probe"] == probe and r["available"]], probe == "rotation"
    lens = sorted({r["eval_len"] for r in rs})
    fig, axes = pyplot().subplots(1, len(lens), figsize=(4.5 * len(lens), 4), squeeze=False)
    for ax, T in zip(axes[0], lens):
        here = [r for r in rs if r["eval_len"] == T]
        for r in here:
            if not rotation:
                ax.plot(r["x"], r["entropy"], lw=1.2, ms=3, label=r["method"], **line_style(r["method"]))
            elif r["method"] not in ANY_ENCODING + MASKS or r["method"] == "none":  # the others: the same frequencies as none
                ax.plot(r["turns_eval"], lw=1, ms=3, label=r["method"], **line_style(r["method"]))
        if rotation:
            ax.plot(here[0]["turns_train"], color="k", ls="--", lw=1.2, label="over the training length")
            ax.axhline(1, color="grey", ls=":", lw=1)
            ax.set(yscale="log", xlabel="frequency pair i (high to low frequency)", ylabel="full turns over the length")
        else:
            ax.plot(here[0]["x"], here[0]["uniform"], color="grey", ls=":", lw=1, label="uniform")
            ax.axvline(report["train_len"], color="grey", ls=":", lw=1)
            ax.set(xlabel="query position", ylabel="attention entropy (nats)")
        ax.set(title=f"eval length {T}")
    axes[0, 0].legend(fontsize=7)
    fig.suptitle(f"rotation, {report['run']}: turns per pair; below the dashed line (turns over the training length) a pair "
                 "never rotates further than training saw" if rotation else f"attention entropy, {report['run']}: mean over "
                 f"layers, heads and {ENTROPY_WINDOWS} windows", fontsize=9 if rotation else 10)
    return png(fig)


def log_wandb(report, ckpt, run_dir, pngs):
    """Into the model's wandb run (wandb_runs.py): the rates as summary metrics, the table and figures."""
    import wandb
    rows = [[r.get(k) for k in CSV_FIELDS] for r in report["results"] if r["probe"] in ("copy", "mqar", "passkey")]
    log_results(run_dir, ckpt["config"], probe_metrics(report), media={
        "probes/table": wandb.Table(columns=list(CSV_FIELDS), data=rows), **{f"probes/{p.stem}": wandb.Image(str(p)) for p in pngs}})


def probes(args):
    model, ckpt, data_dir, weights = load_run(args["run_dir"], args["device"])
    claim_output(args["out"], "probes")  # before the computation: a folder that cannot be written fails now
    logs = ckpt["config"].get("wandb_log", False) if args["wandb_log"] is None else args["wandb_log"]
    if logs:  # a bad wandb setting or run file: one line now, not after the outputs are written
        ready_to_log(args["run_dir"])
    L, vocab, pos_emb = model.config.block_size, model.config.vocab_size, model.config.pos_emb
    rvocab = random_vocab(ckpt["config"].get("retrieval_vocab", 0), vocab)
    tokens, docs = load_split(data_dir, "val")
    args = dict(args, methods=usable(args["methods"], pos_emb), train_len=model.config.train_len)
    for option in dict.fromkeys(READS[p] for p in args["probes"]):  # the probes asked for only: each in tokens inside
        in_tokens(args[option], option, args["train_len"], docs)    # a held-out document, else one line in multiples
    once(args, "lengths", 1, bool({"passkey", "rotation", "entropy"} & set(args["probes"])))
    once(args, "distances", args["segment"], "copy" in args["probes"])
    once(args, "distances", args["segment"] // 2 * 2, "mqar" in args["probes"])
    if "pairs" in args["methods"]:
        check_pairs(args["pair_factors"], model.config)  # methods scale from it, as in extrapolate.py
    probe = dict(copy=lambda: copy_probe(model, tokens, docs, args, rvocab),
                 mqar=lambda: mqar_probe(model, tokens, docs, args, rvocab),
                 passkey=lambda: passkey_probe(model, tokens, docs, args,
                                               run_tokenizer(ckpt).encode_ordinary),
                 rotation=lambda: rotation_probe(model, args), entropy=lambda: entropy_probe(model, tokens, docs, args))
    results, seconds = [], {}
    for name in args["probes"]:
        t0 = time.time()
        results += probe[name]()
        seconds[name] = round(time.time() - t0, 1)
    if not any(r["available"] for r in results):  # asked for nothing that can be measured: say why, write nothing
        r = results[0] if results else None  # none at all: only rotation was asked, of a model without RoPE
        raise UserError(f"nothing to probe: {r['method']} at {r['eval_len']} tokens: {r['reason']}" if r else
                         f"nothing to probe: the rotation probe needs RoPE, not pos_emb={pos_emb}; use --probes copy,passkey,entropy")
    copies = [r for r in results if r["probe"] == "copy"]
    report = dict(run=ckpt["config"].get("wandb_run_name") or args["run_dir"].name, train_len=args["train_len"],
                  context_len=L, pos_emb=pos_emb,
                  checkpoint_iter=ckpt["iter_num"], **{WEIGHTS: weights}, options=args["options"],
                  methods=args["methods"], trials=args["trials"],
                  segment=args["segment"], copy_source=args["copy_source"], random_vocab=rvocab,
                  retrieval=retrieval_check(copies, args["train_len"], args["copy_source"] == "text") if copies else None,
                  seconds=round(sum(seconds.values()), 1), seconds_by_probe=seconds, results=results)
    out, draw = args["out"], dict(copy=plot_copy, mqar=lambda r: plot_copy(r, "mqar"), passkey=plot_passkey)
    # every figure drawn before any file is written
    figures = {f"probe_{p}.png": draw[p](report) if p in draw else plot_by_length(report, p)
               for p in PROBES if any(r["probe"] == p and (r["available"] or p in draw) for r in results)}
    rows = [r for r in results if r["probe"] in ("copy", "mqar", "passkey")]
    write_all(out, {**figures, **json_csv("probes", report, rows, CSV_FIELDS)})
    print(f"{summary(report)}\n{len(results)} probe entries in {report['seconds']:.0f}s ("
          + ", ".join(f"{k} {v:.0f}s" for k, v in seconds.items()) + f") -> {out}/probes.{{json,csv}}, " + ", ".join(figures))
    if logs:
        log_wandb(report, ckpt, args["run_dir"], [out / name for name in figures])
    return report


def summary(report):
    c = report["retrieval"]
    lines = [f"copy inside the training length (none): top-1 {fmt(c['inside_top1'], 3)} -> {copy_verdict(c)}"] if c else []
    for probe, key, col, by in (("copy", "top1", "distance", "distance"), ("mqar", "top1", "distance", "distance"),
                                ("passkey", "exact", "eval_len", "length (mean over depths)")):
        if rs := [r for r in report["results"] if r["probe"] == probe]:
            cols = sorted({r[col] for r in rs})
            lines.append(f"{probe} {key} by {by}: " + " ".join(f"{c:>7}" for c in cols))
            for m in report["methods"]:
                cells = [[r[key] for r in rs if r["method"] == m and r["available"] and r[col] == c] for c in cols]
                lines.append(f"  {m:<12}" + " ".join(f"{np.mean(v):7.3f}" if v else "    n/a" for v in cells))
    return "\n".join(lines)


def main(argv):
    return run_cli("probes.py", lambda: unless_check(probes, parse_args(argv)))


if __name__ == "__main__":
    main(sys.argv[1:])
