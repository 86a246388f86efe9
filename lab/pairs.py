"""Which frequency pairs carry copying past the training length. On the runs of a copier (its seeds: runs trained at
one length on one dataset), the copy probe's top-1 with only the k fastest or only the k slowest pairs interpolated
by the length's factor, YaRN with other ramp bounds (beta_fast / beta_slow) and YaRN's temperature without its
frequencies; beside each, the first distance where Men et al.'s B_m is negative on the frequencies it uses. Writes
pairs.{json,csv,md,png} into --out; intervals: lab/stats.py's bootstrap over runs and trials. docs/experiments.md."""
import sys
from pathlib import Path

import numpy as np
from tqdm import tqdm


from data.dataset import load_split
from data.synthetic import random_vocab
from lab.trials import copy_trials
from eval.methods import forward_args, method_factor
from eval.report import png, pyplot
from eval.score import score_rows
from runtime import load_run
from lab.stats import LEVEL, RETRIEVES, holm, interval
from positions import AS_TRAINED, PositionArgs
from lab.bound import first_negative
from lab.pages import generated, interval_text, write_page
from rope import frequencies, yarn_attention_factor
from common import UserError, claim_output, command_parser, parse_number, parse_list, run_cli, shared_values
from eval.reading import unique_runs

CSV_FIELDS = ("variant", "distance", "factor", "top1", "lo", "hi", "bound_negative_at")


def parse_args(argv):
    p = command_parser(__doc__, "out", "device", "seed")
    p.add_argument("runs", nargs="+", help="run folders of one copier (e.g. its seeds), trained at one length")
    for name, default, text in (
            ("distances", "2,4,16", "copy distances, multiples of the training length"),
            ("trials", "100", "copy trials per distance (the same for every run)"),
            ("segment", "16", "tokens in the copied segment"),
            ("betas", "4/1,8/1,16/1,64/1,32/0.25,32/0.5,32/2,32/4", "YaRN's beta_fast/beta_slow pairs beside its 32/1")):
        p.add_argument(f"--{name}", default=default, help=f"{text} (default {default})")
    a = p.parse_args(argv)
    betas = [tuple(parse_number(x, "betas", float, 0) for x in b.split("/")) for b in a.betas.split(",")]
    if any(len(b) != 2 or min(b) <= 0 or b[0] <= b[1] for b in betas):
        raise UserError(f"--betas {a.betas}: each a beta_fast/beta_slow pair with beta_fast > beta_slow > 0")
    distances = parse_list(a.distances, "distances", float)
    if min(distances) <= 1:
        raise UserError(f"--distances {a.distances}: multiples of the training length above 1 (inside it no pair is scaled)")
    return dict(shared_values(a), runs=[Path(r) for r in unique_runs(a.runs, "run")], distances=distances,
                trials=parse_number(a.trials, "trials", int, 2), segment=parse_number(a.segment, "segment", int, 2), betas=betas,
                copy_source="random", command=" ".join(["python lab/pairs.py", *argv]))


def variants(n, s, L):
    """{name: rope_scaling} for n frequency pairs at factor s: k fastest / k slowest interpolated (fastest 0 is the
    model as trained, fastest n is PI), and YaRN's temperature alone on unscaled frequencies."""
    def pairs(factors, temperature=1.0):
        return dict(forward_args("pairs", 0, L, L, factors).rope_scaling, attention_factor=temperature)
    scaled = {f"fastest {k}": pairs([s] * k + [1.0] * (n - k)) for k in range(n + 1)}
    return {**scaled, **{f"slowest {k}": pairs([1.0] * (n - k) + [s] * k) for k in range(1, n)},
            "yarn temperature only": pairs([1.0] * n, yarn_attention_factor(s))}


def yarn_variants(s, L, betas):
    yarn = forward_args("yarn", 0, L, L, s).rope_scaling
    return {"yarn": yarn, "ntk-by-parts": dict(yarn, attention_factor=1.0),
            **{f"yarn beta {f:g}/{b:g}": dict(yarn, beta_fast=f, beta_slow=b) for f, b in betas}}


def copy_hits(model, rows, k, method=AS_TRAINED):
    """Per trial, the share of the repeat's tokens 1..k-1 predicted top-1."""
    return score_rows(model, rows, last=k - 1, method=method)[1].mean(axis=1)


def load_runs(paths, device):
    """The models and their common (training length, data folder); runs that differ are a one-line error."""
    loaded = [load_run(p, device) for p in paths]
    shared = {(m.config.train_len, str(d), m.config.head_dim, m.config.rope_base, m.config.pos_emb)
              for m, c, d, _ in loaded}  # "the fastest j pairs" must name the same frequencies in every run
    if len(shared) > 1 or next(iter(shared))[4] != "rope":
        raise UserError(f"the runs must be RoPE models of one training length, data, head size and base; got (length, "
                         f"data, head size, base, pos_emb) {sorted(shared)}")
    return [m for m, _, _, _ in loaded], loaded[0][1], loaded[0][2]


def copies_inside(models, tokens, docs, L, args, vocab):
    """Each run's top-1 at distance L/2 (inside its training length): a run below RETRIEVES does not copy at all."""
    (_, rows), = copy_trials(tokens, docs, L, dict(args, distances=[0.5]), vocab)
    top1 = [float(copy_hits(m, rows, args["segment"]).mean()) for m in models]
    if bad := [f"{p} ({t:.2f})" for p, t in zip(args["runs"], top1) if t < RETRIEVES]:
        raise UserError(f"{', '.join(bad)}: top-1 below {RETRIEVES} on copies inside the training length; these runs do "
                         "not copy, so which pairs carry copying cannot be asked of them")
    return top1


def n_pairs(model):
    return model.config.head_dim // 2


def measure(models, trial_sets, L, k, betas):
    """(rows, contrasts) over (distance, copy rows) trial sets: per variant its top-1 interval and B_m's first
    negative distance; paired differences, decided together with Holm: slowest j minus fastest j for every j, and
    yarn minus ntk-by-parts (YaRN's temperature on its own frequencies)."""
    n, rows, contrasts = n_pairs(models[0]), [], []
    for d, trials in trial_sets:
        T = trials.shape[1] - 1
        s = method_factor("pi", T, L)
        named = {**variants(n, s, L), **yarn_variants(s, L, betas)}
        hits = {name: np.stack([copy_hits(m, trials, k, PositionArgs(rope_scaling=scaling)) for m in models])
                for name, scaling in tqdm(named.items(), desc=f"d={d}", leave=False)}
        for name, scaling in named.items():
            c = interval(hits[name])
            rows.append(dict(variant=name, distance=d, factor=s, top1=c["mean"], lo=c["lo"], hi=c["hi"],
                             bound_negative_at=first_negative(frequencies(models[0].config, scaling, T)[0], d),
                             hits=hits[name].round(4).tolist()))
        # j pairs scaled either way (the slowest: the fast ones kept), and YaRN with and without its temperature
        for a, b in [(f"slowest {j}", f"fastest {j}") for j in range(1, n)] + [("yarn", "ntk-by-parts")]:
            c = interval(hits[a] - hits[b])
            contrasts.append(dict(distance=d, contrast=f"{a} - {b}", diff=c["mean"], lo=c["lo"], hi=c["hi"], p=c["p"]))
    for c, reject in zip(contrasts, holm([c["p"] for c in contrasts])):
        c["decision"] = ("higher" if c["diff"] > 0 else "lower") if reject else "undecided"
    return rows, contrasts


def sweep(args):
    claim_output(args["out"], "pairs")
    models, ckpt, folder = load_runs(args["runs"], args["device"])
    L, k = models[0].config.train_len, args["segment"]
    tokens, docs = load_split(folder, "val")
    vocab = random_vocab(ckpt["config"].get("retrieval_vocab", 0), models[0].config.vocab_size)
    inside = copies_inside(models, tokens, docs, L, args, vocab)
    rows, contrasts = measure(models, copy_trials(tokens, docs, L, args, vocab), L, k, args["betas"])
    report = dict(runs=[str(r) for r in args["runs"]], train_len=L, pairs=n_pairs(models[0]),
                  segment=k, trials=args["trials"], inside_top1=inside, confidence=LEVEL, command=args["command"],
                  results=rows, contrasts=contrasts)
    write_page(args["out"], "pairs", markdown(report), report, plot(report), csv=(rows, CSV_FIELDS))
    return report


def markdown(report):
    dists = sorted({r["distance"] for r in report["results"]})
    cell = {(r["variant"], r["distance"]): r for r in report["results"]}
    head = [f"{d} ({d // report['train_len']}x)" for d in dists]
    lines = [f"{generated(report['command'])}\n",
             f"Runs ({len(report['runs'])}): {', '.join(report['runs'])}, trained at {report['train_len']} ({report['pairs']} frequency pairs), "
             f"{report['trials']} copy trials of {report['segment']} tokens per distance; top-1 on copies inside the "
             f"training length: {', '.join(f'{t:.2f}' for t in report['inside_top1'])}. Cells: top-1 on the repeat, "
             f"mean [{report['confidence']:.0%} interval over runs and trials]; B_m < 0: the first distance where "
             "Men et al.'s B_m is negative on the frequencies used (- : not up to the copy distance).\n",
             "| variant | " + " | ".join(head) + " | " + " | ".join(f"B_m < 0, {h}" for h in head) + " |",
             "| --- |" + " ---: |" * 2 * len(dists)]
    for v in dict.fromkeys(r["variant"] for r in report["results"]):
        rs = [cell[v, d] for d in dists]
        lines.append(f"| {v} | " + " | ".join(interval_text(dict(r, mean=r["top1"]), ".2f") for r in rs)
                     + " | " + " | ".join(str(r["bound_negative_at"] or "-") for r in rs) + " |")
    lines += ["", f"Paired differences of top-1 (same runs and trials): the slowest j minus the fastest j interpolated "
              f"(> 0: keeping the fast pairs is better) and YaRN minus ntk-by-parts (> 0: its temperature helps), decided "
              f"with Holm over all {len(report['contrasts'])}:\n", "| contrast | " + " | ".join(head) + " |",
              "| --- |" + " ---: |" * len(dists)]
    for name in dict.fromkeys(c["contrast"] for c in report["contrasts"]):
        cs = {c["distance"]: c for c in report["contrasts"] if c["contrast"] == name}
        lines.append(f"| {name} | " + " | ".join(f"{interval_text(dict(cs[d], mean=cs[d]['diff']), '+.2f')} "
                                              f"{cs[d]['decision']}" for d in dists) + " |")
    return "\n".join(lines) + "\n"


def plot(report):
    dists, n = sorted({r["distance"] for r in report["results"]}), report["pairs"]
    fig, axes = pyplot().subplots(1, len(dists), figsize=(4.6 * len(dists), 4), squeeze=False, sharey=True)
    for ax, d in zip(axes[0], dists):
        at = {r["variant"]: r for r in report["results"] if r["distance"] == d}
        for what, color in (("fastest", "C3"), ("slowest", "C0")):  # j = 0 (as trained) and j = n (PI) are shared
            rs = [at[f"fastest {j}"] if j in (0, n) else at[f"{what} {j}"] for j in range(n + 1)]
            ax.plot(range(n + 1), [r["top1"] for r in rs], color=color, marker=".", label=f"the {what} j interpolated")
            ax.fill_between(range(n + 1), [r["lo"] for r in rs], [r["hi"] for r in rs], color=color, alpha=0.2)
        for i, v in enumerate(("yarn", "ntk-by-parts", "yarn temperature only")):
            ax.axhline(at[v]["top1"], color=f"C{i + 4}", ls="--", lw=1, label=v)
        ax.set(title=f"distance {d} ({d // report['train_len']}x)", xlabel="pairs interpolated j (of the other end kept)")
    axes[0, 0].set_ylabel("copy top-1")
    axes[0, 0].legend(fontsize=7)
    fig.suptitle(f"which pairs carry copying, runs: {len(report['runs'])}; j = 0 is the model as trained, j = {n} is PI; "
                 f"bands: {report['confidence']:.0%} interval over runs and trials", fontsize=10)
    return png(fig)


def main(argv):
    return run_cli("pairs.py", lambda: sweep(parse_args(argv)))


if __name__ == "__main__":
    main(sys.argv[1:])
