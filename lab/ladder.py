"""The regime ladder: is a zero-shot method's failure about the method or about the regime? Each rung is a folder of
code_small_seed<k> (a model trained at L) and code_yarn4x_seed<k> (its 4L fine-tune with YaRN, the ceiling). Per rung:
what the ceiling gains from context past L within one model (read with its full context minus itself cropped to L,
`crop-L`: no extra training in the difference), and every zero-shot method on the L model against `crop`, past L at
2x and 4x, `crop` exact (stride 1). Each method's settings are chosen on the dev documents (a grid, below); every
reported number and decision is on the test documents. Writes ladder.{json,md,png} into --out (the published
tables in their own protocols: lab/protocols.py).

    python lab/ladder.py out/ladder/base1e4 out/ladder/base200 out/ladder/base40 out/ladder/L32 out/ladder/L32_4M \\
        --seeds 2 --out out/ladder/page
"""
import math
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch


from eval.reading import load_report, unique_runs
from eval.report import png, pyplot
from lab.stats import LEVEL
from lab.family import decide, declare, paired, past_l, reusable, shared_docs
from lab.pages import contrast_metrics, generated, interval_text, log_page, verdict, write_page
from common import ROOT, UserError, claim_output, command_parser, parse_number, run_cli, shared_values
from wandb_runs import ready_to_log

LENGTHS = (2, 4)
MARGIN = 0.01
# dynamic-ntk is left out: in one forward over a window it is ntk at the window's factor (a test says so)
DEFAULTS = ("pi", "ntk", "yarn", "llama3", "self-extend", "rerope", "leaky-rerope")


def grid(L):
    """The settings tried on dev beside each default: neighbour windows L/4 and 3L/4 (the default is L/2), Self-Extend's
    group by the paper's formula for W = L/2 (G = (T - W) / (L - W): 3 at 2x, 7 at 4x; the default keeps every grouped
    distance inside L: 4 and 8), YaRN's betas below LLaMA's (no pair turns 32 times within L = 64)."""
    a, b = L // 4, 3 * L // 4
    return {"yarn": ("yarn:beta_fast=8", "yarn:beta_fast=4", "yarn:beta_fast=2", "yarn:beta_fast=2:beta_slow=0.25"),
            "self-extend": (f"self-extend:window={a}", f"self-extend:window={b}", "self-extend:group=3", "self-extend:group=7"),
            "rerope": (f"rerope:window={a}", f"rerope:window={b}"),
            "leaky-rerope": (f"leaky-rerope:window={a}", f"leaky-rerope:window={b}", "leaky-rerope:k=16")}


# LLaMA-2 at 4k (head dim 128, base 10,000): beta_fast = 32 and beta_slow = 1 fall at pairs 21 and 45 of 64
# (4096 / 2 pi * 10000^(-21/64) = 31.6 turns, 10000^(-45/64): 1.0)
LLAMA2_SHARES = (21 / 64, 45 / 64)


def turns(L, base, head_dim):
    """How many times each frequency pair turns within L tokens: L * base^(-2i/d) / (2 pi)."""
    return L * base ** (-np.arange(0, head_dim, 2) / head_dim) / (2 * math.pi)


def train_lengths(facts):
    """Each rung's L: a row's eval_len over it is the row's multiple (2x, 4x)."""
    return {f["rung"]: f["L"] for f in facts}


def rung_facts(rung, seed):
    """The rung's L, base, parameters and head dimension (from its L model's checkpoint) and what they make of the pairs."""
    ckpt = torch.load(rung / f"code_small_seed{seed}" / "ckpt.pt", weights_only=True, map_location="cpu")
    config = ckpt["config"]
    L, base, head_dim = config["block_size"], config["rope_base"], config["n_embd"] // config["n_head"]
    params = sum({w.data_ptr(): w.numel() for w in ckpt["model"].values()}.values())  # tied weights counted once
    t = turns(L, base, head_dim)
    fast, slow = (L / (2 * math.pi) * base ** -share for share in LLAMA2_SHARES)  # the turns at that fraction of the pairs
    return dict(rung=rung.name, L=L, base=base, params=params, head_dim=head_dim, pairs=len(t), periods=int((t >= 1).sum()),
                fastest=float(t[0]), slowest=float(t[-1]), share_yarn=f"yarn:beta_fast={fast:.3g}:beta_slow={slow:.3g}")


def evaluate(run_dir, docs, methods):
    """run_dir/ladder_<docs>/extrapolation.json for these methods (reused if of these options and weights)."""
    out = run_dir / f"ladder_{docs}"
    options = ["--lengths", ",".join(map(str, LENGTHS)), "--protocols", "windows", "--docs", docs, "--crop_stride", "1",
               "--methods", ",".join(methods), "--no-wandb", "--out", str(out)]
    if reusable(out / "extrapolation.json", run_dir, options):
        return load_report(out, weights_of=run_dir)
    print(f"ladder: evaluate {run_dir} on {docs}", flush=True)
    if subprocess.run([sys.executable, str(ROOT / "eval" / "extrapolate.py"), str(run_dir), *options]).returncode:
        raise UserError(f"evaluating {run_dir} failed (its error is above)")
    return load_report(out, weights_of=run_dir)


def past_crop(reports, method):
    """Per seed, the method's mean loss minus crop's over the targets past L, averaged over LENGTHS (dev's score)."""
    past = [past_l(rep) for rep in reports]
    return float(np.mean([np.mean(p[(method, T)]["diff_crop"]) for p in past for T in {T for _, T in p}]))


def choose(rungs, seeds, facts):
    """Per rung, each method's setting with the lowest loss past L on dev (its default where nothing beats it)."""
    chosen, tried = {}, {}
    for rung, f in zip(rungs, facts):
        extra = grid(f["L"])
        settings = {m: (m, *extra.get(m, ()), *((f["share_yarn"],) if m == "yarn" else ())) for m in DEFAULTS}
        reports = [evaluate(rung / f"code_small_seed{k}", "dev", ["crop", *(s for g in settings.values() for s in g)])
                   for k in range(seeds)]
        tried[rung.name] = {s: past_crop(reports, s) for g in settings.values() for s in g}
        chosen[rung.name] = {m: min(g, key=tried[rung.name].get) for m, g in settings.items()}
    return chosen, tried


def contrasts(rungs, seeds, chosen):
    """The declared family on test: per rung and length, the ceiling's gain (none minus crop-L, the same fine-tune)
    and every method (defaults and dev-chosen settings) on the L model minus its crop."""
    family = []
    for rung in rungs:
        methods = list(dict.fromkeys([*DEFAULTS, *chosen[rung.name].values()]))
        base = [evaluate(rung / f"code_small_seed{k}", "test", ["none", "crop", *methods]) for k in range(seeds)]
        top = [past_l(evaluate(rung / f"code_yarn4x_seed{k}", "test", ["none", "crop-L"])) for k in range(seeds)]
        past = [past_l(r) for r in base]
        for T in sorted({T for _, T in past[0]}):
            docs = shared_docs(base, f"windows {T}", f"{rung.name} at {T}")
            gain = paired(top, top, ("none", T), ("crop-L", T), "loss_beyond_train")
            family.append(declare("ceiling", rung.name, "ceiling: full context - crop-L", "crop-L", T, gain, docs, MARGIN))
            for m in ["none", *methods]:
                family.append(declare("crop", rung.name, m, "crop", T, paired(past, past, (m, T), None, "diff_crop"), docs, MARGIN))
    return decide(family)


def markdown(facts, tried, chosen, rows, seeds, n_boot, command):
    L = train_lengths(facts)
    lines = [f"# The regime ladder: {seeds} seeds a rung\n", f"{generated(command)}\n",
             *[f"Seeds 2 to {seeds - 1} were trained after the 2-seed screen was read ([ladder.md](ladder.md)): the number "
               "of seeds changed after looking.\n"] * (seeds > 2),
             "## The rungs\n", "Pairs completing a period within L (LLaMA-2 at 4k: 46 of 64; the fastest turns 652 times, the "
             "slowest 0.075); YaRN's betas at LLaMA-2's share of pairs: the betas that fall at the same fraction of the pairs "
             "as 32 and 1 do on LLaMA-2 at 4k.\n", "| rung | L | base | parameters | head dim | pairs with a period in L | "
             "fastest turns | slowest turns | YaRN at LLaMA-2's share |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    lines += [f"| {f['rung']} | {f['L']} | {f['base']:g} | {f['params'] / 1e6:.1f}M | {f['head_dim']} | {f['periods']} of {f['pairs']} | "
              f"{f['fastest']:.1f} | {f['slowest']:.3g} | `{f['share_yarn']}` |" for f in facts]
    lines += ["\n## Settings chosen on the dev documents\n", "Loss minus crop past L (nats), mean over seeds, 2x and 4x "
              "averaged, on the dev documents (the even-numbered held-out files); the chosen setting in bold.\n"]
    for rung, scores in tried.items():
        picked = set(chosen[rung].values())
        lines.append(f"- **{rung}**: " + ", ".join(f"{'**' if s in picked else ''}`{s}` {v:+.3f}{'**' if s in picked else ''}"
                                                  for s, v in scores.items()))
    lines += ["\n## On the test documents\n", f"Mean [{LEVEL:.0%} bootstrap interval over {seeds} seeds x documents] past L "
              f"(nats; < 0: better than crop). The ceiling row: the fine-tune read with its full context minus itself cropped to "
              f"L (< 0: context past L pays, within one model). Decisions: the family of {len(rows)} contrasts under Holm, on the "
              f"bootstrap and the seed-level t-test together ({n_boot} replicates); "
              + (f"with {seeds} seeds the t-test has {seeds - 1} degrees of freedom" if seeds > 1 else "one seed has no t-test")
              + (", so this is a screen: read the intervals.\n" if seeds < 5 else ".\n"),
              "| rung | row | 2x | 4x | decided (2x / 4x) |", "| --- | --- | ---: | ---: | --- |"]
    for rung in dict.fromkeys(r["config"] for r in rows):
        for name in dict.fromkeys(r["method"] for r in rows if r["config"] == rung):
            cells = {r["eval_len"] // L[rung]: r for r in rows if (r["config"], r["method"]) == (rung, name)}
            text = [interval_text(c) if (c := cells.get(x)) else "" for x in LENGTHS]
            said = [verdict(c) if (c := cells.get(x)) else "" for x in LENGTHS]
            lines.append(f"| {rung} | `{name}` | {' | '.join(text)} | {' / '.join(said)} |")
    return "\n".join(lines) + "\n"


def plot(rows, facts):
    plt = pyplot()
    rungs, L = [f["rung"] for f in facts], train_lengths(facts)
    fig, axes = plt.subplots(1, len(LENGTHS), figsize=(6 * len(LENGTHS), 4.5), sharey=True, squeeze=False)
    for ax, x in zip(axes[0], LENGTHS):
        names = dict.fromkeys(r["method"] for r in rows if r["method"] not in ("none",))
        for n, name in enumerate(names):
            pts = [(rungs.index(r["config"]), r["mean"], r["lo"], r["hi"]) for r in rows
                   if r["method"] == name and r["eval_len"] == x * L[r["config"]]]
            if not pts:
                continue
            i, m, lo, hi = map(np.array, zip(*sorted(pts)))
            style = dict(color="k", lw=2.5) if name.startswith("ceiling") else dict(ls="--" if ":" in name else "-",
                                                                                     color=plt.cm.tab20(n % 20))
            ax.errorbar(i, m, yerr=[m - lo, hi - m], marker="o", capsize=3, label=name, **style)
        ax.axhline(0, color="grey", lw=2)
        ax.set_yscale("symlog", linthresh=0.05)  # PI's +0.8 beside the ceiling's -0.01: linear within +-0.05
        ax.set(xticks=range(len(rungs)), xticklabels=[f"{f['rung']}\n{f['periods']}/{f['pairs']}" for f in facts],
               xlabel="rung (pairs with a period in L)", title=f"{x}x: loss minus crop past L", ylabel="nats (< 0: beats crop; symlog)")
    axes[0][-1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1, 0.5))
    fig.tight_layout()
    return png(fig)


def log_wandb(out, facts, rows, md):
    """The ladder's own wandb run (its group: the page's folder): every contrast as summary metrics,
    contrast/<rung>/<row>_minus_<ref>/<n>x/{mean,lo,hi,p,decision}, which a runs table compares across ladders; the
    page and its figure as media."""
    log_page(out, "ladder", dict(rungs=[f["rung"] for f in facts]),
             contrast_metrics(rows, train_lengths(facts)), out / "ladder.png", md)


def main(argv):
    p = command_parser(__doc__, "out", "wandb", out="out/ladder/page", wandb_log="true")
    p.add_argument("rungs", nargs="+", help="rung folders, each with code_small_seed<k> and code_yarn4x_seed<k>")
    p.add_argument("--seeds", default="2", help="seeds per rung (default 2)")
    a = p.parse_args(argv)
    rungs = [Path(r) for r in unique_runs(a.rungs, "rung")]  # a rung twice: twice in the Holm family
    seeds, wandb_log = parse_number(a.seeds, "seeds", int, 1), shared_values(a)["wandb_log"]
    for rung in rungs:
        for k in range(seeds):
            for run in (f"code_small_seed{k}", f"code_yarn4x_seed{k}"):
                if not (rung / run / "ckpt.pt").is_file():
                    raise UserError(f"{rung / run} has no ckpt.pt: train it first (docs/experiments.md, the regime ladder)")
    out = claim_output(a.out, "ladder")
    if wandb_log:  # the ladder's own wandb run: a bad setting or run file is one line before any evaluation
        ready_to_log(out)
    facts = [rung_facts(r, 0) for r in rungs]
    chosen, tried = choose(rungs, seeds, facts)
    rows, n_boot = contrasts(rungs, seeds, chosen)
    command = shlex.join(["python", "lab/ladder.py", *a.rungs, f"--seeds={seeds}", f"--out={a.out}"])
    md = markdown(facts, tried, chosen, rows, seeds, n_boot, command)
    write_page(out, "ladder", md, dict(rungs=facts, dev=tried, chosen=chosen, rows=rows), plot(rows, facts))
    if wandb_log:
        log_wandb(out, facts, rows, md)


if __name__ == "__main__":
    run_cli("ladder.py", lambda: main(sys.argv[1:]))
