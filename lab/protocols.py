"""Each published table in its own protocol, with exact crop beside it. Per rung (a folder of code_small_seed<k>, the
model trained at L, and code_yarn4x_seed<k>, its 4L YaRN fine-tune) and seed, on the --docs held-out documents:

- bojone/rerope (eval_loss.py): the final L targets of each unit scored with L, 2L and 4L tokens of input, every factor
  fixed; and a swapped-prefix arm, the tokens before the final L taken from another document.
- YaRN (jquesnelle/yarn eval/perplexity.py --truncate): each document cut to kL tokens and scored in one window from
  position 0; perplexity exp(mean of per-window mean NLLs). On the fine-tune (the published rows are fine-tunes) and on
  the L model's zero-shot scalings.
- Press et al. 2022: non-overlapping windows of kL over the same text, every target scored.
- Su 2023: next-token accuracy at L, and at 8L on held-out text and on the same text repeated.

Exact crop (each target from exactly its last L tokens) is scored on the same targets, and bojone's contrasts are
decomposed: the baseline's handicap (the whole-window reading at L minus crop), the method minus crop, its change from
2L to 4L, its distortion (minus crop on the swapped arm) and what it reads past L (the difference of the two arms).
Writes shapes.{md,json,png} into --out (docs/methodology.md, "Published protocols, and what exact crop adds to them").

    python lab/protocols.py out/ladder/L32 --seeds 2 --docs dev --out out/protocols/dev
    python lab/protocols.py out/ladder/L32 --seeds 2 --out out/protocols/test
"""
import dataclasses
import json
import math
import shlex
import sys
from pathlib import Path

import numpy as np

from common import (UserError, claim_output, command_parser, json_text, parse_list, parse_number, run_cli,
                    shared_values, write_atomic)
from data.dataset import doc_windows, held_out, load_split
from eval.methods import forward_args
from eval.report import png, pyplot
from eval.score import score_cropped, score_rows
from runtime import load_run
from lab.pages import generated, log_page, write_page
from wandb_runs import key

NTK_MIXED = (12.0, 0.75)  # bojone's ntk_patch.py: k and b
PROTOCOLS = ("bojone", "yarn", "press", "su", "grid")


def ntk_mixed_factors(rotary_dim, k, b):
    """NTK-RoPE-mixed (Su 2023, bojone/rerope ntk_patch.py): pair j = 1 .. d/2 divided by exp(a j^b), a = ln k / (d/2)^b,
    so the fastest pair is nearly kept and the slowest divided by k; one factor per pair, fastest first."""
    a = math.log(k) / (rotary_dim / 2) ** b
    return [math.exp(a * j ** b) for j in range(1, rotary_dim // 2 + 1)]


def method(spec, L, run_len, length, rotary_dim, factor):
    """The positions.Method of a row: a method of eval/methods.py by its name and settings, '+logn' adding Su's log-n
    (queries past L scaled by log(n) / log L, as rerope_patch.py and ntk_patch.py do), 'ntk-mixed' bojone's fixed form."""
    name, logn = spec.removesuffix("+logn"), spec.endswith("+logn")
    if name == "ntk-mixed":
        how = forward_args("pairs", length, L, run_len, ntk_mixed_factors(rotary_dim, *NTK_MIXED))
    else:
        how = forward_args(name, length, L, run_len, factor)
    return dataclasses.replace(how, logn_len=L) if logn else how


def bojone_methods(L, rotary_dim=None):
    """bojone's rows as published (ReRoPE with log-n at window L/4 as its README's 1024 of 4k, L/8 as its shipped code's
    512; NTK-RoPE-logn-mixed), and the testbed's plain forms beside them. NTK-aware's base * s^(d / (d - 2)) needs at
    least two rotating pairs (rotary_dim None: any)."""
    rows = ["none", "ntk-mixed+logn", f"rerope:window={L // 4}+logn", f"rerope:window={L // 8}+logn",
            f"rerope:window={L // 4}", "rerope", "ntk", "yarn"]
    return [r for r in rows if r != "ntk" or rotary_dim is None or rotary_dim >= 4]


def read_rows(results):
    """The bojone rows a rung's results hold, in bojone_methods' order."""
    return [r for r in bojone_methods(results[0]["L"]) if f"{r}@1L" in results[0]["bojone"]["same"]]


def su_methods(L):
    """Su's rows: the baseline, NTK-RoPE-logn-mixed and ReRoPE at w = 256 of 512 (L/2), with and without log-n."""
    return ["none", "ntk-mixed+logn", f"rerope:window={L // 2}", f"rerope:window={L // 2}+logn"]


def other_document(unit_docs):
    """For each unit the index of the next unit (cyclically) from another document: the swapped prefix's source."""
    n = len(unit_docs)
    return [next((j % n for j in range(i + 1, i + n) if unit_docs[j % n] != unit_docs[i]), None) for i in range(n)]


def mean_rows(model, rows, last, how):
    """Per-row mean NLL and accuracy of the last `last` targets."""
    nll, hit = score_rows(model, rows, last=last, method=how)
    return nll.mean(axis=1), hit.mean(axis=1)


def bojone(model, units, L, rotary_dim, swap):
    """{arm: {row: per-unit mean NLL of the final L targets}}: crop, and each method at L, 2L and 4L of input."""
    same = units[:, -(4 * L + 1):]
    arms = {"same": same, "swapped": np.concatenate([same[swap, :3 * L + 1], same[:, 3 * L + 1:]], axis=1)}
    out = {}
    for arm, rows in arms.items():
        out[arm] = {"crop": score_cropped(model, rows, L, L)[0].mean(axis=1)}
        for spec in bojone_methods(L, rotary_dim):
            for c in (L, 2 * L, 4 * L):
                how = method(spec, L, model.config.block_size, c, rotary_dim, 4.0)
                out[arm][f"{spec}@{c // L}L"] = mean_rows(model, rows[:, -(c + 1):], L, how)[0]
    return out


def grid(L):
    """ReRoPE's and leaky ReRoPE's windows from L/8 to L - 2, the largest the trained distances allow (so a choice at
    the grid's edge is the edge of what exists), each with and without log-n."""
    windows = sorted({max(1, L // 8), L // 4, L // 2, 3 * L // 4, L - 2})
    return [f"{m}:window={w}{logn}" for m in ("rerope", "leaky-rerope") for w in windows for logn in ("", "+logn")]


def window_grid(model, units, L, rotary_dim):
    """{row@kL: per-unit mean NLL of the final L targets} of every grid setting at 2L and 4L of input, and crop."""
    rows = units[:, -(4 * L + 1):]
    out = {"crop": score_cropped(model, rows, L, L)[0].mean(axis=1)}
    for spec in grid(L):
        for c in (2 * L, 4 * L):
            how = method(spec, L, model.config.block_size, c, rotary_dim, None)
            out[f"{spec}@{c // L}L"] = mean_rows(model, rows[:, -(c + 1):], L, how)[0]
    return out


def press_su(model, units, L, rotary_dim):
    """Press: {k: per-unit mean NLL} of the unit's 8L targets in non-overlapping windows of kL, and crop on the same
    targets. Su: per-unit accuracy at L (windows of L), at 8L on the unit and on its first 4L tokens repeated."""
    n = units.shape[1] - 1
    press, su = {"crop": score_cropped(model, units, n, L)[0].mean(axis=1)}, {}
    for k in (1, 2, 4, 8):
        w = k * L
        windows = np.stack([units[:, s:s + w + 1] for s in range(0, n, w)], axis=1).reshape(-1, w + 1)
        nll, hit = score_rows(model, windows, method=method("none", L, model.config.block_size, w, rotary_dim, None))
        press[f"none@{k}L"] = nll.reshape(len(units), -1).mean(axis=1)
        if k == 1:
            su["none@1L"] = hit.reshape(len(units), -1).mean(axis=1)
    repeated = np.concatenate([units[:, :4 * L], units[:, :4 * L + 1]], axis=1)
    for text, rows in (("text", units), ("repeated", repeated)):
        su[f"crop@8L/{text}"] = score_cropped(model, rows, n, L)[1].mean(axis=1)
        for spec in su_methods(L):
            su[f"{spec}@8L/{text}"] = mean_rows(model, rows, n, method(spec, L, model.config.block_size, n, rotary_dim,
                                                                       8.0))[1]
    return press, su


def yarn_protocol(model, tokens, docs, L, rotary_dim, lengths, methods, crops):
    """{row: per-document mean NLL}: each document's first kL + 1 tokens scored in one window from position 0 (the
    methods at factor k), and exact crop to each of `crops` (tokens) on the same targets."""
    out = {}
    for k in lengths:
        rows = np.stack([tokens[s:s + round(k * L) + 1] for s in docs[:, 0]]).astype(np.int64)
        n = rows.shape[1] - 1
        for spec in methods:
            how = method(spec, L, model.config.block_size, n, rotary_dim, max(1.0, k))
            out[f"{spec}@{k:g}L"] = mean_rows(model, rows, n, how)[0]
        for name, c in crops.items():
            out[f"{name}@{k:g}L"] = score_cropped(model, rows, n, c)[0].mean(axis=1)
    return out


def members(path, seeds):
    """[(L model, its 4L fine-tune or None)] per seed: a rung folder's code_small_seed<k> and code_yarn4x_seed<k>, or
    one run folder alone (a converted pretrained model's too)."""
    if (path / "code_small_seed0").is_dir():
        pairs = [(path / f"code_small_seed{k}", path / f"code_yarn4x_seed{k}") for k in range(seeds)]
    else:
        pairs = [(path, None)]
    for run in (r for pair in pairs for r in pair if r is not None):  # hashed once, later, by evaluate_seed
        if not (run / "ckpt.pt").is_file():
            raise UserError(f"{run} holds no checkpoint: train it first (docs/experiments.md, the regime ladder), "
                            "or convert a model folder (python pretrained.py MODEL_DIR --out RUN_DIR)")
    return pairs


def evaluate_seed(small, tuned, docs_name, units_n, chosen, device):
    """The chosen protocols' per-unit readings for one L model (and YaRN's on its fine-tune, if any), reused from
    small/protocols_<docs>.json while the weights and options are the same."""
    model, _, data_dir, small_id = load_run(small, device)
    tuned_model, _, _, tuned_id = load_run(tuned, device) if tuned else (None, None, None, None)
    L = model.config.train_len
    # NTK-mixed's pairs are the rotating ones: a partial rotary factor (Pythia's 0.25) leaves the rest unrotated
    partial = (model.config.rope_scaling or {}).get("partial_rotary_factor", 1.0)
    rotary_dim = int(model.config.n_embd // model.config.n_head * partial)
    units_n = units_n or max(16, 2048 // L)  # auto: the same 16k targets at every L, at least 16 units
    ids = dict(small=small_id, tuned=tuned_id, docs=docs_name, units=units_n,
               **({} if chosen == list(PROTOCOLS) else {"protocols": chosen}))  # a subset is part of the key
    cache = small / f"protocols_{docs_name}.json"
    if cache.is_file() and (done := json.loads(cache.read_text())).get("ids") == ids:
        return done
    print(f"protocols: {small} on {docs_name}", flush=True)
    tokens, docs = load_split(data_dir, "val")
    docs = held_out(docs, docs_name)
    reach = 8 * L if {"press", "su"} & set(chosen) else 4 * L  # the unit: as long as the longest reading needs
    starts = doc_windows(docs, reach + 1, units_n, np.random.default_rng(0))
    units = np.stack([tokens[s:s + reach + 1] for s in starts]).astype(np.int64)
    unit_docs = np.searchsorted(docs[:, 0], starts, side="right") - 1
    result = dict(ids=ids, L=L, units=len(units))
    if "bojone" in chosen:
        if None in (swap := other_document(unit_docs.tolist())):
            raise UserError(f"{small}: every unit comes from one document; the swapped prefix needs two (more --units)")
        result["bojone"] = bojone(model, units, L, rotary_dim, swap)
    if "grid" in chosen:
        result["grid"] = window_grid(model, units, L, rotary_dim)
    if {"press", "su"} & set(chosen):
        result["press"], result["su"] = press_su(model, units, L, rotary_dim)
    if "yarn" in chosen:
        long_docs = docs[docs[:, 1] - docs[:, 0] > 5 * L]
        long_docs = long_docs[np.sort(np.random.default_rng(0).permutation(len(long_docs))[:units_n])]
        result["documents"] = len(long_docs)
        result["yarn_zero_shot"] = yarn_protocol(model, tokens, long_docs, L, rotary_dim, (1, 2, 4),
                                                 ("none", "pi", "ntk", "yarn"), {"crop": L})
        if tuned is not None:
            result["yarn_tuned"] = yarn_protocol(tuned_model, tokens, long_docs, L, rotary_dim, (1, 2, 4, 5), ("none",),
                                                 {"crop": tuned_model.config.block_size, "crop-L": L})
    result = json_ready(result)
    write_atomic(cache, lambda f: f.write((json_text(result) + "\n").encode()))
    return result


def json_ready(x):
    if isinstance(x, dict):
        return {k: json_ready(v) for k, v in x.items()}
    return np.round(np.asarray(x, dtype=float), 6).tolist() if isinstance(x, np.ndarray) else x


def seed_means(results, *path):
    """{row: [mean per seed]} of one protocol's per-unit readings (path: the keys down to the rows)."""
    tables = list(results)
    for step in path:
        tables = [t[step] for t in tables]
    return {row: [float(np.mean(t[row])) for t in tables] for row in tables[0]}


def cell(values, digits=3, scale=1.0):
    """A screen's cell: the mean over seeds, and each seed's value in brackets."""
    v = [x * scale for x in values]
    return f"{np.mean(v):.{digits}f}" + (f" ({', '.join(f'{x:.{digits}f}' for x in v)})" if len(v) > 1 else "")


def signed(values, digits=3):
    v = list(values)
    return f"{np.mean(v):+.{digits}f}" + (f" ({', '.join(f'{x:+.{digits}f}' for x in v)})" if len(v) > 1 else "")


# Published numbers, each with its source. bojone/rerope README.md, "Results" (Llama-2 13B trained at 4,096, eval_loss.py:
# each sample's final 4,096 tokens scored with 4k, 8k, 16k of input); None: not published.
BOJONE = {"none": ("RoPE (Llama-2 as trained)", (1.4967, 8.8615, None)),
          "ntk-mixed+logn": ("NTK-RoPE-logn-mixed, k = 12, b = 0.75, not dynamic", (1.6081, 1.5417, 1.5163)),
          "rerope:window={w4}+logn": ("ReRoPE-w1024 (w = L/4) with log-n", (1.4996, 1.4267, 1.4001))}
# jquesnelle/yarn data/proofpile-long-small-8k.csv: Llama-2 7B fine-tuned from 4k to 8k (s = 2), eval/perplexity.py
# --truncate, at 2k, 4k, 8k and 10k: a quarter, half, all and 1.25x of the fine-tuned length F.
YARN = {"YaRN (Yarn-Llama-2-7b-8k)": (3.9184, 3.5098, 3.3564, 6.0485),
        "NTK (NTK-Llama-2-7b-8k)": (4.2026, 3.7507, 3.5866, 6.2354),
        "PI (LLongMA-2-7b)": (3.9219, 3.5095, 3.3441, 8.0711)}
# Press et al. 2022, Table 2 (247M on WikiText-103, L = 512, non-overlapping windows): rotary at L and at about 2L.
PRESS = ("rotary", 20.07, 21.37)
# Su 2023 (kexue.fm/archives/9708, as reported there: 100M trained at 512, read at 4,096): accuracy (%) at L, then at 8L
# on ordinary / repeated text.
SU_AT_L = 49.41
SU = {"none": ("baseline", 23.16, 24.17), "ntk-mixed+logn": ("NTK-RoPE-logn-mixed", 45.41, 68.91),
      "rerope:window={w2}": ("ReRoPE w = 256 (L/2)", 48.48, 77.90),
      "rerope:window={w2}+logn": ("ReRoPE w = 256 with log-n", 48.85, 82.40)}
SU_WINDOW = ("window attention, trained", 48.15, 80.84)


def bojone_section(rung, results, L):
    same, swapped = seed_means(results, "bojone", "same"), seed_means(results, "bojone", "swapped")
    crop, crop_swap = same["crop"], swapped["crop"]
    diff = lambda a, b: [x - y for x, y in zip(a, b)]  # per seed
    handicap = diff(same["none@1L"], crop)
    lines = [f"### bojone/rerope's protocol, rung {rung}\n",
             f"Exact crop on the final L targets: {cell(crop)}; the whole-window reading at L (RoPE as trained, its targets "
             f"with 0 to L - 1 tokens of context) minus crop, the baseline's handicap: **{signed(handicap)}** (bojone's "
             "RoPE-4k row is this whole-window reading: no published row is crop).\n",
             "| row | published 4k / 8k / 16k | testbed L / 2L / 4L | minus crop at 2L / 4L | 2L -> 4L | distortion (swapped, 4L) "
             "| reads past L (4L) |", "| --- | --- | --- | --- | ---: | ---: | ---: |"]
    for spec in read_rows(results):
        published = next((v for k, v in BOJONE.items() if k.format(w4=L // 4) == spec), None)
        pub = " / ".join("-" if x is None else f"{x:.4f}" for x in published[1]) if published else ""
        at = [same[f"{spec}@{k}L"] for k in (1, 2, 4)]
        delta = [diff(a, crop) for a in at[1:]]
        distortion = diff(swapped[f"{spec}@4L"], crop_swap)
        reads = diff(delta[1], distortion)
        name = f"`{spec}`" + (f" ({published[0]})" if published else "")
        lines.append(f"| {name} | {pub} | {' / '.join(f'{np.mean(a):.3f}' for a in at)} | "
                     f"{signed(delta[0])} / {signed(delta[1])} | {signed(diff(at[2], at[1]))} | {signed(distortion)} | "
                     f"{signed(reads)} |")
    return lines


def holds_bojone(results, L):
    """bojone's published shapes, read on the testbed's means: each ReRoPE row's "longer input, lower loss" (2L below
    the whole-window RoPE reading at L, 4L below 2L), NTK-mixed falling from L to 2L to 4L, RoPE as trained above its
    L reading at 2L; and what no published row tested, below exact crop."""
    same = {k: np.mean(v) for k, v in seed_means(results, "bojone", "same").items()}
    out = {}
    for r in (s for s in read_rows(results) if s.startswith("rerope")):
        out[f"`{r}`: 2L below RoPE's whole window at L"] = same[f"{r}@2L"] < same["none@1L"]
        out[f"`{r}`: 4L below 2L"] = same[f"{r}@4L"] < same[f"{r}@2L"]
        out[f"`{r}`: below exact crop at 2L or 4L (not in the published table)"] = min(same[f"{r}@2L"], same[f"{r}@4L"]) < same["crop"]
    out["NTK-logn-mixed: falls from L to 2L to 4L"] = same["ntk-mixed+logn@4L"] < same["ntk-mixed+logn@2L"] < same["ntk-mixed+logn@1L"]
    out["RoPE as trained: above its L reading at 2L"] = same["none@2L"] > same["none@1L"]
    return out


def yarn_section(rung, results):
    zero = seed_means(results, "yarn_zero_shot")
    ppl = lambda v: [math.exp(x) for x in v]
    lines = [f"### YaRN's protocol (documents truncated, one window from 0), rung {rung}\n",
             "Perplexity; F, the fine-tuned length (published 8k, testbed 4L); the testbed's documents are those of at "
             "least 5L + 1 tokens, each cut at its start.\n",
             "| row | F/4 | F/2 | F | 1.25F |", "| --- | ---: | ---: | ---: | ---: |"]
    lines += [f"| {name} (published) | " + " | ".join(f"{x:.3f}" for x in v) + " |" for name, v in YARN.items()]
    if "yarn_tuned" in results[0]:
        tuned = seed_means(results, "yarn_tuned")
        for row, label in (("none", "the ceiling (YaRN s = 4 fine-tune at 4L)"), ("crop", "its exact crop to 4L"),
                           ("crop-L", "its exact crop to L")):
            lines.append(f"| {label} | " + " | ".join(cell(ppl(tuned[f"{row}@{k}L"])) for k in (1, 2, 4, 5)) + " |")
    lines += ["", "Zero-shot on the L model in the same protocol (factor k at kL), perplexity:\n",
              "| row | L | 2L | 4L |", "| --- | ---: | ---: | ---: |"]
    for row in ("none", "pi", "ntk", "yarn", "crop"):
        lines.append(f"| `{row}` | " + " | ".join(cell(ppl(zero[f"{row}@{k}L"])) for k in (1, 2, 4)) + " |")
    return lines


def press_su_section(rung, results):
    press, su = seed_means(results, "press"), seed_means(results, "su")
    ppl = lambda v: [math.exp(x) for x in v]
    lines = [f"### Press et al.'s protocol (non-overlapping windows of kL, every target), rung {rung}\n",
             f"Published (Table 2, {PRESS[0]}): {PRESS[1]} at L, {PRESS[2]} at about 2L (x{PRESS[2] / PRESS[1]:.3f}). "
             "Testbed, perplexity over the same 8L targets of each unit:\n",
             "| reading | L | 2L | 4L | 8L | exact crop |", "| --- | ---: | ---: | ---: | ---: | ---: |",
             "| RoPE as trained | " + " | ".join(cell(ppl(press[f"none@{k}L"]), 2) for k in (1, 2, 4, 8))
             + f" | {cell(ppl(press['crop']), 2)} |", "",
             f"### Su's protocol (next-token accuracy, %), rung {rung}\n",
             f"At L: published {SU_AT_L}, testbed {cell(su['none@1L'], 2, 100)}. At 8L:\n",
             "| row | published text / repeated | testbed text | testbed repeated |", "| --- | --- | ---: | ---: |"]
    L = results[0]["L"]
    for spec, (name, text, rep) in SU.items():
        spec = spec.format(w2=L // 2)
        lines.append(f"| `{spec}` ({name}) | {text:.2f} / {rep:.2f} | {cell(su[f'{spec}@8L/text'], 2, 100)} | "
                     f"{cell(su[f'{spec}@8L/repeated'], 2, 100)} |")
    lines.append(f"| {SU_WINDOW[0]} | {SU_WINDOW[1]:.2f} / {SU_WINDOW[2]:.2f} | not trained here | |")
    lines.append(f"| exact crop | (not published) | {cell(su['crop@8L/text'], 2, 100)} | {cell(su['crop@8L/repeated'], 2, 100)} |")
    return lines


def grid_section(rung, results, docs):
    g = seed_means(results, "grid")
    L = results[0]["L"]
    scores = {spec: [np.mean([a - c for a, c in zip(g[f"{spec}@{k}L"], g["crop"])]) for k in (2, 4)] for spec in grid(L)}
    best = {m: min((s for s in scores if s.split(":")[0] == m), key=lambda s: sum(scores[s])) for m in ("rerope", "leaky-rerope")}
    lines = [f"### ReRoPE's windows to L - 2, with and without log-n, rung {rung} ({docs} documents)\n",
             "bojone's protocol (the final L targets), each setting minus exact crop at 2L / 4L of input (mean over "
             "seeds); lowest of each method over both in bold" + (" (the settings chosen on dev)" if docs == "dev" else "")
             + ".\n", "| setting | 2L | 4L |", "| --- | ---: | ---: |"]
    for spec, (a, b) in scores.items():
        bold = "**" if spec in best.values() else ""
        lines.append(f"| {bold}`{spec}`{bold} | {a:+.3f} | {b:+.3f} |")
    return lines


def plot(rungs, per_rung):
    """Per rung: each bojone row's reading at L, 2L and 4L of input, exact crop dashed, the swapped arm dotted."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(rungs), figsize=(6.5 * len(rungs), 4.5), squeeze=False)
    for ax, rung in zip(axes[0], rungs):
        results = per_rung[rung]
        same, swapped = seed_means(results, "bojone", "same"), seed_means(results, "bojone", "swapped")
        for n, spec in enumerate(s for s in read_rows(results) if s != "none"):
            color = plt.cm.tab10(n % 10)
            ax.plot([1, 2, 4], [np.mean(same[f"{spec}@{k}L"]) for k in (1, 2, 4)], "o-", color=color, label=spec)
            ax.plot([1, 2, 4], [np.mean(swapped[f"{spec}@{k}L"]) for k in (1, 2, 4)], ":", color=color)
        ax.axhline(np.mean(same["crop"]), color="k", ls="--", label="exact crop")
        ax.axhline(np.mean(swapped["crop"]), color="k", ls=":", label="exact crop, swapped prefix")
        ax.axhline(np.mean(same["none@1L"]), color="grey", ls="-.", label="RoPE as trained at L (whole window)")
        ax.set(xscale="log", xticks=[1, 2, 4], xticklabels=["L", "2L", "4L"], xlabel="input (multiples of L)",
               ylabel="NLL of the final L targets", title=f"{rung}: bojone's protocol (dotted: swapped prefix)")
        ax.minorticks_off()
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    return png(fig)


def metrics(per_rung):
    """Summary metrics a runs table compares across pages, mean over seeds: per rung bojone's decomposition
    (protocols/<rung>/bojone/<row>/{minus_crop_2L,minus_crop_4L,distortion_4L,reads_past_L_4L}, the handicap), Su's
    accuracies and Press's and YaRN's readings."""
    out = {}
    m = lambda d, k: float(np.mean(d[k]))
    for rung, results in per_rung.items():
        for name in ("su", "press", "yarn_tuned", "yarn_zero_shot"):
            if name in results[0]:
                out.update({key("protocols", rung, name, row): m(seed_means(results, name), row)
                            for row in seed_means(results, name)})
        if "bojone" not in results[0]:
            continue
        same, swapped = seed_means(results, "bojone", "same"), seed_means(results, "bojone", "swapped")
        out[key("protocols", rung, "bojone", "handicap")] = m(same, "none@1L") - m(same, "crop")
        for spec in read_rows(results):
            for k in (2, 4):
                out[key("protocols", rung, "bojone", spec, f"minus_crop_{k}L")] = m(same, f"{spec}@{k}L") - m(same, "crop")
            distortion = m(swapped, f"{spec}@4L") - m(swapped, "crop")
            out[key("protocols", rung, "bojone", spec, "distortion_4L")] = distortion
            out[key("protocols", rung, "bojone", spec, "reads_past_L_4L")] = m(same, f"{spec}@4L") - m(same, "crop") - distortion
    return out


def main(argv):
    p = command_parser(__doc__, "out", "device", "wandb", out="out/protocols", wandb_log="true")
    p.add_argument("rungs", nargs="+", help="rung folders, each with code_small_seed<k> and code_yarn4x_seed<k>; or "
                                             "run folders, each read alone")
    p.add_argument("--seeds", default="2", help="seeds per rung (default 2)")
    p.add_argument("--units", default="auto", help="units of 8L + 1 tokens (and documents for YaRN's) per seed: a number "
                                                   "or auto, 2,048 / L and at least 16 (default auto)")
    p.add_argument("--docs", default="test", help="held-out documents: dev, test, or all (a model nothing was "
                                                  "chosen for on dev) (default test)")
    p.add_argument("--protocols", default=",".join(PROTOCOLS), help=f"which: {', '.join(PROTOCOLS)} (default all)")
    a = p.parse_args(argv)
    if a.docs not in ("dev", "test", "all"):
        raise UserError(f"unknown --docs {a.docs!r}; allowed: dev, test, all")
    chosen = [x for x in PROTOCOLS if x in parse_list(a.protocols, "protocols", str, PROTOCOLS)]
    seeds = parse_number(a.seeds, "seeds", int, 1)
    units = None if a.units == "auto" else parse_number(a.units, "units", int, 2)
    wandb_log, device = shared_values(a)["wandb_log"], shared_values(a)["device"]
    runs = {Path(r).name: members(Path(r), seeds) for r in a.rungs}
    if len(runs) < len(a.rungs):
        raise UserError(f"two rungs share a folder name in {' '.join(a.rungs)}: the page names rungs by it")
    out = claim_output(a.out, "shapes")
    per_rung = {name: [evaluate_seed(small, tuned, a.docs, units, chosen, device) for small, tuned in pairs]
                for name, pairs in runs.items()}
    command = shlex.join(["python", "lab/protocols.py", *a.rungs, f"--seeds={seeds}", f"--units={a.units}",
                          f"--docs={a.docs}", f"--protocols={','.join(chosen)}", f"--out={a.out}"])
    md = page(per_rung, seeds, a.docs, command)
    drawn = [rung for rung, results in per_rung.items() if "bojone" in results[0]]
    write_page(out, "shapes", md, dict(command=command, rungs=per_rung), drawn and plot(drawn, per_rung),
               indent=None)
    if wandb_log:
        log_page(out, "protocols", dict(rungs=list(per_rung), docs=a.docs), metrics(per_rung),
                 drawn and out / "shapes.png")


def page(per_rung, seeds, docs, command):
    lines = ["# Published tables in their own protocols, with exact crop beside\n",
             f"{generated(command)}\n",
             f"A screen: {seeds} seed(s) a rung, the {docs} documents; each cell the mean over seeds with each seed's value "
             "in brackets. Nothing here is decided. None of the published tables has an exact-crop row: each published "
             "number is beside the testbed's number measured in that source's protocol, and exact crop (every target from "
             "exactly its last L tokens) beside both.\n", "## Scoreboard\n",
             "| source | shape | rung | holds on the testbed |", "| --- | --- | --- | --- |"]
    for rung, results in per_rung.items():
        shapes = [("bojone/rerope", *kv) for kv in holds_bojone(results, results[0]["L"]).items()] if "bojone" in results[0] else []
        shapes += [(source, shape, ok) for (source, shape), ok in other_holds(results).items()]
        lines += [f"| {source} | {shape} | {rung} | {'yes' if ok else 'no'} |" for source, shape, ok in shapes]
    for rung, results in per_rung.items():
        first = results[0]
        lines += ["", f"## {rung} (L = {first['L']}; {first['units']} units"
                  + (f", {first['documents']} documents for YaRN's protocol" if "documents" in first else "") + ")\n"]
        for part, section in (("bojone", lambda: bojone_section(rung, results, first["L"])),
                             ("yarn_zero_shot", lambda: yarn_section(rung, results)),
                             ("press", lambda: press_su_section(rung, results)),
                             ("grid", lambda: grid_section(rung, results, docs))):
            lines += section() + [""] if part in first else []
    return "\n".join(lines) + "\n"


def other_holds(results):
    """YaRN's, Press's and Su's published shapes on the testbed's means, for the protocols that were read."""
    L, first = results[0]["L"], results[0]
    m = lambda name, k: float(np.mean(seed_means(results, name)[k]))
    r, rl = f"rerope:window={L // 2}", f"rerope:window={L // 2}+logn"
    out = {}
    if "yarn_tuned" in first:
        out["jquesnelle/yarn", "a fine-tune's perplexity falls to its length F and rises past it"] = (
            m("yarn_tuned", "none@4L") < m("yarn_tuned", "none@1L") and m("yarn_tuned", "none@5L") > m("yarn_tuned", "none@4L"))
    if "press" in first:
        out["Press et al. 2022", "RoPE as trained: whole windows of 2L above L"] = m("press", "none@2L") > m("press", "none@1L")
        for text in ("text", "repeated"):
            order = [m("su", f"{row}@8L/{text}") for row in ("none", "ntk-mixed+logn", r, rl)]
            out["Su 2023", f"accuracy at 8L, {text}: baseline < NTK-logn-mixed < ReRoPE <= ReRoPE+log-n"] = (
                order[0] < order[1] < order[2] <= order[3])
        out["Su 2023", "ReRoPE+log-n at 8L within 1 point of the accuracy at L"] = (
            m("su", f"{rl}@8L/text") > m("su", "none@1L") - 0.01)
        out["Su 2023", "repeated text read far better than text at 8L by ReRoPE+log-n (copying from 4L back)"] = (
            m("su", f"{rl}@8L/repeated") > m("su", f"{rl}@8L/text") + 0.05)
    return out


if __name__ == "__main__":
    run_cli("protocols.py", lambda: main(sys.argv[1:]))
