"""Fine-tuning recipes: which scaling to fine-tune with, how fast each reaches the ceiling, and how far past its
fine-tuned length it holds. A folder of <recipe>_seed<k> fine-tunes (lab/configs/code_recipe.py: one L model fine-tuned
at 4L with each recipe's scaling, the same tokens, learning rate and schedule; the seeds are the fine-tunes' data
orders), each with its kept checkpoints iter_<n>/, read on the test documents:

- along the fine-tune, every kept checkpoint at 2x and 4x: the loss past L with its full context and cropped to L
  (crop-L); the context gain is the difference, within one model; the steps each recipe takes to recover half and 90%
  of the best recipe's final gain at 4x (best: the lowest loss past L with its full context), and to reach the loss
  PI ends at (YaRN's claim);
- past the fine-tuned length, the last checkpoint at 8x and 16x, the targets past 4L: as fine-tuned, with dynamic
  YaRN (YaRN at the length's factor, in place of the recipe's scaling), with the recipe's own scaling at the length's
  factor, each minus crop (the fine-tune's own 4L tokens);
- a declared family (Holm): each recipe against plain RoPE, YaRN and NTK against PI, as fine-tuned, at every length.

Writes recipes.{json,md,png} into --out; each checkpoint's scores are kept beside it (recipes_test.json) and reused.

    python lab/recipes.py out/recipes --seeds 5 --out out/recipes/page
"""
import json
import shlex
import sys
from pathlib import Path

import numpy as np
import torch
from scipy import stats as scipy_stats


from common import (UserError, claim_output, command_parser, json_text, parse_number, run_cli, write_atomic)
from data.dataset import held_out, load_split
from eval.methods import forward_args
from eval.reading import weights_id
from eval.report import WEIGHTS, png, pyplot
from eval.score import choose_units, score_units
from lab.family import decide, declare
from lab.pages import generated, interval_text, verdict, write_page
from lab.stats import LEVEL, documents, interval
from rope import ORIGINAL
from runfolder import KEPT_PREFIX, load_checkpoint
from runtime import load_run

RECIPES = {  # name: (rope_scaling of the fine-tune at 4L, the zero-shot method that scales the same way past it)
    "plain": (None, None),
    "pi": ({"rope_type": "linear", "factor": 4.0}, "pi"),
    "ntk": ({"rope_type": "ntk", "factor": 4.0}, "ntk"),
    "yarn": ({"rope_type": "yarn", "factor": 4.0}, "yarn"),
    # the YaRN ramp the ladder chose on dev at L = 32 (docs/results/ladder.md)
    "yarn-tuned": ({"rope_type": "yarn", "factor": 4.0, "beta_fast": 2.0, "beta_slow": 0.25}, "yarn:beta_fast=2:beta_slow=0.25"),
}
INSIDE, PAST = (2, 4), (8, 16)  # multiples of L: inside the fine-tuned 4L, and past it
TOKENS, DOCS, MARGIN = 8192, "test", 0.01  # tokens a length: crop exact at every kept checkpoint is the cost
FRACTIONS = (0.5, 0.9)
PI_LOSS = "PI's final loss"  # steps to the loss past L that PI reaches at its last step (YaRN's claim)


def train_command(folder, recipe, seed, base):
    """The command that trains one recipe's fine-tune (docs/experiments.md runs them one at a time)."""
    scaling = RECIPES[recipe][0]
    return shlex.join(["python", "train.py", "lab/configs/code_recipe.py", f"--out_dir={folder}/{recipe}_seed{seed}",
                       f"--init_from={base}", f"--seed={seed}", "--wandb_log=False",
                       *([f"--rope_scaling={scaling}"] if scaling else [])])


def cells(recipe, last):
    """(method, multiple of L) scored on a checkpoint: crop-L beside the full context inside 4L; on the last, past it."""
    inside = [(m, x) for x in INSIDE for m in ("none", "crop-L")]
    own = RECIPES[recipe][1]
    return inside + ([(m, x) for x in PAST for m in dict.fromkeys(("none", "crop", "yarn", *([own] if own else [])))]
                     if last else [])


def read_scores(path):
    """The scores kept in path: {} where there are none or the file is not ours (scored again, then replaced)."""
    try:
        done = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    ours = isinstance(done, dict) and all(isinstance(v, dict) for v in done.values())
    if not ours:
        print(f"recipes: {path} is not a scores file; scoring again")
    return done if ours else {}


def score(run_dir, wanted):
    """{"method@x": {"past_L": per-unit mean NLL past L, "past_run": past the run's own length or None, "docs": each
    unit's document}} for the wanted cells, kept in run_dir/recipes_test.json and reused while TOKENS is the same
    (crop exact: stride 1)."""
    path = run_dir / f"recipes_{DOCS}.json"
    done = read_scores(path)
    def todo(weights):  # another checkpoint in that folder now: its cells again
        return [(m, x) for m, x in wanted if done.get(f"{m}@{x}", {}).get("tokens") != TOKENS
                or done[f"{m}@{x}"].get(WEIGHTS) != weights]
    if todo(weights_id(run_dir)):
        model, _, data, weights = load_run(run_dir)  # the id of the weights loaded, whatever was there a moment ago
        tokens, docs = load_split(data, "val")
        docs = held_out(docs, DOCS)
        L, run_len = model.config.train_len, model.config.block_size
        for method, x in todo(weights):
            T = x * L
            n, starts = choose_units(docs, "windows", T, TOKENS, 2, 0)
            nll = score_units(model, tokens, starts, n, "windows", T, None, forward_args(method, T, L, run_len), 1)
            done[f"{method}@{x}"] = dict(tokens=TOKENS, **{WEIGHTS: weights},
                                         past_L=nll[:, L:].mean(1).round(6).tolist(),
                                         past_run=nll[:, run_len:].mean(1).round(6).tolist() if T > run_len else None,
                                         docs=documents(starts, docs).tolist())
        write_atomic(path, lambda f: f.write(json_text(done).encode()))
    return {k: v for k, v in done.items() if k in {f"{m}@{x}" for m, x in wanted}}


def same_weights(a, b):
    """Whether two checkpoints hold the same weights (a fine-tune's step 0 is its L model, whatever its seed)."""
    wa, wb = (torch.load(p / "ckpt.pt", map_location="cpu", weights_only=True)["model"] for p in (a, b))
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def recipe_of(run):
    """The recipe a fine-tune was trained with, read from its checkpoint's rope_scaling (a folder's name can
    be wrong); None where it is none of RECIPES."""
    scaling = load_checkpoint(run)["config"].get("rope_scaling")
    scaling = scaling and {k: v for k, v in scaling.items() if k != ORIGINAL}  # filled in by a fine-tune
    return next((r for r, (s, _) in RECIPES.items() if s == scaling), None)


def checkpoints(run):
    """{iteration: folder} of a run's kept checkpoints."""
    return {int(p.name[len(KEPT_PREFIX):]): p for p in run.glob(KEPT_PREFIX + "*") if (p / "ckpt.pt").is_file()}


def collect(folder, seeds):
    """{recipe: {step: {"method@x": {metric: [seeds, units]}}}} and each cell's unit documents; every run must be there
    (checked before anything is scored) with the same kept steps."""
    runs = {(r, k): folder / f"{r}_seed{k}" for r in RECIPES for k in range(seeds)}
    kept = {key: checkpoints(run) for key, run in runs.items()}
    for (recipe, k), run in runs.items():
        if not (run / "ckpt.pt").is_file() or not kept[recipe, k]:
            raise UserError(f"{run} has no fine-tune with kept checkpoints: train it first: "
                            f"{train_command(folder, recipe, k, '<the L model>')}")
        if (trained := recipe_of(run)) != recipe:
            raise UserError(f"{run} was fine-tuned as {trained or 'none of the recipes'} (its rope_scaling), "
                            f"not as {recipe}, which its folder's name says: move it to {trained}_seed{k}, "
                            f"or train {recipe} there")
    steps = sorted(kept["plain", 0])
    for key, v in kept.items():
        if sorted(v) != steps:
            raise UserError(f"{runs[key]} kept checkpoints at {sorted(v)}, {runs['plain', 0]} at {steps}: train every "
                            "recipe with the same keep_iters")
    table, groups = {}, {}
    for (recipe, k), run in runs.items():
        print(f"recipes: {run}", flush=True)
        for step in steps:
            where = kept[recipe, k][step]
            if k and step == steps[0] and same_weights(where, kept[recipe, 0][step]):  # step 0 of every seed: scored once
                where = kept[recipe, 0][step]
            for key, v in score(where, cells(recipe, step == steps[-1])).items():
                cell = table.setdefault(recipe, {}).setdefault(step, {}).setdefault(key, {})
                for metric in ("past_L", "past_run"):
                    cell.setdefault(metric, []).append(v[metric])
                groups[key] = v["docs"]
    return table, groups, steps


def arr(table, recipe, step, key, metric="past_L"):
    return np.array(table[recipe][step][key][metric], dtype=np.float64)  # [seeds, units]


def gain(table, recipe, step, x):
    """[seeds, units]: the context gain past L at x, within each checkpoint (full context minus crop-L)."""
    return arr(table, recipe, step, f"none@{x}") - arr(table, recipe, step, f"crop-L@{x}")


def first_reach(per_step, steps, target):
    """Per seed (a column of per_step [steps, seeds]): the fine-tune steps at which the value first falls to target (one
    per seed, or one for all), linear between kept checkpoints; None where it never does."""
    out = []
    for g, t in zip(per_step.T, np.broadcast_to(target, per_step.shape[1])):
        hit = np.flatnonzero(g <= t)
        if not len(hit):
            out.append(None)
        elif hit[0] == 0:
            out.append(float(steps[0]))
        else:
            i = hit[0]
            out.append(float(steps[i - 1] + (steps[i] - steps[i - 1]) * (g[i - 1] - t) / (g[i - 1] - g[i])))
    return out


def family(table, groups, last):
    """The declared contrasts: each recipe minus plain, YaRN and NTK minus PI as fine-tuned (past L at 2x and 4x, past 4L at
    8x and 16x); past 4L, each way of reading a recipe minus crop."""
    def metric(x):
        return "past_L" if x in INSIDE else "past_run"
    out = []
    for x in (*INSIDE, *PAST):
        key = f"none@{x}"
        for recipe, ref in [(r, "plain") for r in RECIPES if r != "plain"] + [("yarn", "pi"), ("ntk", "pi")]:
            d = arr(table, recipe, last, key, metric(x)) - arr(table, ref, last, key, metric(x))
            out.append(declare("recipe", recipe, "as fine-tuned", ref, x, list(d), groups[key], MARGIN))
    for x in PAST:
        for recipe in RECIPES:
            for m in (k.split("@")[0] for k in table[recipe][last] if k.endswith(f"@{x}") and not k.startswith("crop")):
                d = arr(table, recipe, last, f"{m}@{x}", "past_run") - arr(table, recipe, last, f"crop@{x}", "past_run")
                out.append(declare("crop", recipe, m, "crop", x, list(d), groups[f"crop@{x}"], MARGIN))
    return decide(out)


def row(rows, recipe, ref, x):
    return next(r for r in rows if (r["config"], r["method"], r["ref"], r["at"]) == (recipe, "as fine-tuned", ref, x))


def lower(r):
    return r["decision"].startswith("lower")


# Published shapes of fine-tuned scalings: (shape, source, published, whether the testbed's rows and steps tests show it)
PUBLISHED = (
    ("YaRN reaches the target length in fewer steps than PI", "Peng et al. 2023 (YaRN), abstract: 2.5x fewer steps (400 "
     "against 1,000)", "400 vs 1,000 steps", "YaRN minus PI in steps to PI's final loss past L < 0, p < 0.05",
     lambda rows, tests: tests[PI_LOSS]["mean_difference"] < 0 and tests[PI_LOSS]["p"] < 0.05),
    ("Inside the fine-tuned length YaRN matches PI, NTK is worse", "jquesnelle/yarn data/proofpile-long-small-8k.csv, "
     "Llama-2 7B 4k -> 8k, ppl at 8k: PI 3.344, YaRN 3.356, NTK 3.587", "YaRN - PI +0.004, NTK - PI +0.070 nats",
     "4x: YaRN - PI equivalent, NTK - PI higher",
     lambda rows, tests: row(rows, "yarn", "pi", 4)["equivalence"] == f"equivalent within +-{MARGIN:g}"
     and row(rows, "ntk", "pi", 4)["decision"].startswith("higher")),
    ("Past the fine-tuned length YaRN degrades far less than PI", "the same file, at 10k (1.25x past): PI 8.071, "
     "YaRN 6.049, NTK 6.235", "YaRN - PI -0.288 nats", "8x (2x past): YaRN - PI lower",
     lambda rows, tests: lower(row(rows, "yarn", "pi", 8))),
    ("NTK fine-tuned climbs inside its range, PI and YaRN keep falling", "jquesnelle/yarn data/proofpile-long-small-"
     "llama1-32k.csv, LLaMA 7B 2k -> 32k: NTK lowest 3.166 at 17k, 8.494 at 32k; PI 3.568, YaRN 2.769 at 32k",
     "NTK - PI +0.867 nats at 32k", "NTK - PI higher at 4x, and higher at 4x than at 2x",
     lambda rows, tests: row(rows, "ntk", "pi", 4)["decision"].startswith("higher")
     and row(rows, "ntk", "pi", 4)["mean"] > row(rows, "ntk", "pi", 2)["mean"]),
    ("A YaRN fine-tune beats plain RoPE fine-tuned at the same length", "karpathy/nanochat PR #376: 2048 -> 8192, "
     "0.7992 against 0.8024 bpb", "-0.4%", "4x: YaRN - plain lower", lambda rows, tests: lower(row(rows, "yarn", "plain", 4))),
)


def summaries(table, groups, steps, n_boot):
    """The curves along the fine-tune (mean and interval per recipe, step, length) and the steps to each fraction."""
    curves = {r: {s: {x: dict(gain=interval(gain(table, r, s, x), groups[f"none@{x}"], n_boot),
                              loss=interval(arr(table, r, s, f"none@{x}"), groups[f"none@{x}"], n_boot))
                      for x in INSIDE} for s in steps} for r in RECIPES}
    # the best recipe reads the targets past L best with its full context; not the largest gain, which a recipe that
    # harms its own short context (PI compresses positions inside L too) inflates
    best = min(RECIPES, key=lambda r: curves[r][steps[-1]][4]["loss"]["mean"])
    target = curves[best][steps[-1]][4]["gain"]["mean"]
    gains = {r: np.array([gain(table, r, s, 4).mean(1) for s in steps]) for r in RECIPES}  # [steps, seeds]
    losses = {r: np.array([arr(table, r, s, "none@4").mean(1) for s in steps]) for r in RECIPES}
    # no recipe gains from context past L: there is no fraction of a gain to reach
    reach = {f"{f:.0%} of the gain": {r: first_reach(gains[r], steps, f * target) for r in RECIPES}
             for f in FRACTIONS if target < 0}
    # YaRN's claim, in its own measure: the loss at the length PI reaches in its whole fine-tune, seed by seed
    reach[PI_LOSS] = {r: first_reach(losses[r], steps, losses["pi"][-1]) for r in RECIPES}
    return curves, best, target, reach


def steps_test(reach, a, b):
    """a against b in steps to one measure of reach: the paired t-test over seeds (a seed that never gets there counts as
    the last step either reached, which favours it: said on the page)."""
    x, y = (np.array([v if v is not None else np.nan for v in reach[r]]) for r in (a, b))
    last = np.nanmax(np.concatenate([x, y, [0.0]]))
    x, y = np.nan_to_num(x, nan=last), np.nan_to_num(y, nan=last)
    p = float(scipy_stats.ttest_rel(x, y).pvalue) if len(x) > 1 and np.any(x != y) else 1.0
    return dict(mean_difference=float((x - y).mean()), p=p)


def steps_mean(values, last):
    """'mean [lo, hi]' of per-seed steps (None: never, counted as the last kept step), a t interval over seeds."""
    v = np.array([last if x is None else x for x in values], dtype=np.float64)
    if len(v) < 2 or v.std() == 0:
        return f"{v.mean():.0f}"
    lo, hi = scipy_stats.t.interval(LEVEL, len(v) - 1, loc=v.mean(), scale=scipy_stats.sem(v))
    return interval_text(dict(mean=v.mean(), lo=lo, hi=hi), ".0f")


def markdown(rows, curves, best, target, reach, tests, steps, seeds, n_boot, command, base):
    def steps_text(v):
        return ", ".join("never" if s is None else f"{s:.0f}" for s in v)
    lines = [f"# Fine-tuning recipes at 4L: {seeds} seeds\n", f"{generated(command)} "
             f"Every fine-tune starts from one L model ({base}) and trains at 4L with the same tokens, learning rate and "
             f"schedule (lab/configs/code_recipe.py); a seed is a fine-tune's data order. Test documents (the odd-numbered "
             f"held-out files); {TOKENS:,} tokens a length; crop exact (stride 1). Intervals: {LEVEL:.0%} bootstrap over "
             f"seeds x documents ({n_boot} replicates).\n",
             "## Along the fine-tune\n", "At 4x (the fine-tuned length): the loss past L with its full context, and the "
             "context gain within the checkpoint (full context minus itself cropped to L; < 0: context past L pays). Step 0 "
             "is the L model with the recipe's scaling, before any fine-tuning.\n",
             "| step | " + " | ".join(f"{r} loss | {r} gain" for r in RECIPES) + " |", "| ---: |" + " ---: | ---: |" * len(RECIPES)]
    for s in steps:
        at_4x = (curves[r][s][4] for r in RECIPES)
        cells = [f"{c['loss']['mean']:.3f} | {interval_text(c['gain'])}" for c in at_4x]
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    lines += ["\n## Steps to the ceiling\n", f"The best recipe at 4x (the lowest loss past L with its full context at the "
              f"last step; not the largest gain, which a recipe that harms its own short context inflates): `{best}`, whose "
              f"gain is {target:+.3f} nats. Steps at which each seed first reaches half and 90% of that gain (within "
              f"itself), and PI's final loss past L at 4x (PI's, seed by seed: YaRN's claim in its own measure); linear "
              f"between kept checkpoints; never: not within {steps[-1]} steps; mean [{LEVEL:.0%} t interval over seeds], "
              f"never counted as {steps[-1]}.\n",
              "| recipe | " + " | ".join(f"{m}: per seed | mean" for m in reach) + " |", "| --- |" + " --- | ---: |" * len(reach)]
    lines += [f"| `{r}` | " + " | ".join(f"{steps_text(v[r])} | {steps_mean(v[r], steps[-1])}" for v in reach.values()) + " |"
              for r in RECIPES]
    lines += ["", "YaRN against PI, paired over seeds (t-test; a seed that never gets there counts as the last step either "
              "reached): " + "; ".join(f"to {m}: YaRN minus PI {t['mean_difference']:+.0f} steps, p = {t['p']:.3g}"
                                        for m, t in tests.items()) + ".\n"]
    lines += ["## Published shapes\n", "Each a published result on a fine-tuned model; the testbed's rows below decide "
              "whether its shape holds here. The protocols differ: there perplexity over whole long documents at the "
              "length, here the loss past L (past 4L at 8x and 16x) on windows of the length.\n",
              "| published shape | source | published | holds here when | holds |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| {shape} | {source} | {number} | {rule} | {'yes' if test(rows, tests) else 'no'} |"
              for shape, source, number, rule, test in PUBLISHED]
    lines += ["\n## The declared contrasts\n", f"The last checkpoint, as fine-tuned: past L at 2x and 4x, past 4L at 8x and 16x "
              f"(past the fine-tuned length); and past 4L each way of reading it minus crop (its own 4L tokens): dynamic YaRN "
              f"(`yarn`, in place of its scaling), its own scaling at the length's factor. Holm over the {len(rows)} "
              f"contrasts on the bootstrap and the seed-level t-test together; margin +-{MARGIN}.\n",
              "| recipe | read as | minus | x | mean [interval] (nats) | decided |", "| --- | --- | --- | ---: | ---: | --- |"]
    lines += [f"| `{r['config']}` | `{r['method']}` | `{r['ref']}` | {r['at']} | {interval_text(r)} | "
              f"{verdict(r)} |" for r in rows]
    return "\n".join(lines) + "\n"


def plot(curves, rows, steps):
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.5))
    xs = np.array(steps, dtype=float)
    for n, r in enumerate(RECIPES):
        color = plt.cm.tab10(n)
        axes[0].plot(xs, [curves[r][s][4]["loss"]["mean"] for s in steps], marker="o", color=color, label=r)
        c = [curves[r][s][4]["gain"] for s in steps]
        axes[1].plot(xs, [v["mean"] for v in c], marker="o", color=color, label=r)
        axes[1].fill_between(xs, [v["lo"] for v in c], [v["hi"] for v in c], color=color, alpha=0.15)
        own = RECIPES[r][1]
        for method, style in (("none", "-"), (own if own != "yarn" else None, "--"), ("yarn" if own == "yarn" else None, "--")):
            past = [row for row in rows if row["kind"] == "crop" and row["config"] == r and row["method"] == method]
            if past:
                axes[2].errorbar([p["at"] for p in past], [p["mean"] for p in past], marker="o", color=color, capsize=3,
                                 ls=style, label=f"{r}: {'as fine-tuned' if method == 'none' else 'its scaling at the length'}",
                                 yerr=[[p["mean"] - p["lo"] for p in past], [p["hi"] - p["mean"] for p in past]])
    for ax in axes[:2]:
        ax.set_xscale("symlog", linthresh=10)
        ax.set_xlabel("fine-tune steps")
    axes[0].set(title="4x: loss past L, full context (mean)", ylabel="nats")
    axes[1].set(title="4x: context gain (full context - crop-L)", ylabel="nats (< 0: context pays; symlog)")
    axes[1].set_yscale("symlog", linthresh=0.02)  # step 0's +0.4 beside the last steps' -0.02
    axes[0].legend(fontsize=8)
    for ax in axes[1:]:
        ax.axhline(0, color="grey")
    axes[2].set(title="past 4L minus crop (its own 4L tokens)", xlabel="multiple of L", ylabel="nats (< 0: beats crop)",
                xticks=list(PAST), xticklabels=[f"{x}x" for x in PAST], xlim=(PAST[0] - 2, PAST[-1] + 2))
    axes[2].legend(fontsize=7)
    fig.tight_layout()
    return png(fig)


def main(argv):
    p = command_parser(__doc__, "out", out="out/recipes/page")
    p.add_argument("folder", help="a folder of <recipe>_seed<k> fine-tunes (lab/configs/code_recipe.py)")
    p.add_argument("--seeds", default="5", help="seeds per recipe (default 5)")
    a = p.parse_args(argv)
    folder, seeds = Path(a.folder), parse_number(a.seeds, "seeds", int, 1)
    out = claim_output(a.out, "recipes")  # before the scoring: a folder that cannot be written fails now
    table, groups, steps = collect(folder, seeds)
    rows, n_boot = family(table, groups, steps[-1])
    curves, best, target, reach = summaries(table, groups, steps, n_boot)
    tests = {m: steps_test(v, "yarn", "pi") for m, v in reach.items()}
    base = load_checkpoint(folder / "plain_seed0")["origin"]["init_from"]
    command = shlex.join(["python", "lab/recipes.py", a.folder, f"--seeds={seeds}", f"--out={a.out}"])
    md = markdown(rows, curves, best, target, reach, tests, steps, seeds, n_boot, command, base)
    write_page(out, "recipes", md, dict(steps=steps, best=best, target=target, reach=reach, steps_tests=tests,
                                        rows=rows, curves=curves), plot(curves, rows, steps))


if __name__ == "__main__":
    run_cli("recipes.py", lambda: main(sys.argv[1:]))
