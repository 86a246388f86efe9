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
import json
import math
import shlex
import sys
from pathlib import Path

import numpy as np

from common import (UserError, claim_output, command_parser, json_text, parse_list, parse_number, run_cli,
                    shared_values, write_atomic)
from data.dataset import doc_windows, held_out, load_meta, load_split
from eval.report import png, pyplot
from eval.score import score_rows
from lab.crop import score_cropped
from runtime import load_run
from lab.pages import generated, interval_text, log_page, write_page
from lab.stats import interval
from lab.swap import donors, final_nll, method, swap_prefix
from wandb_runs import key

SU_MIXED = "ntk-mixed:k=8:b=0.625"  # Su's own settings (kexue.fm/archives/9675 and 9706)
LENGTHS = (1, 2, 3, 4)  # bojone's protocol: inputs of kL tokens
COPY = 2  # Su's repeated texts: the first COPY * L tokens of a unit repeated to fill 8L
PROTOCOLS = ("bojone", "yarn", "press", "su", "grid")


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
    """Su's rows: the baseline, NTK-RoPE-logn-mixed (Su's k = 8, b = 0.625 and bojone's 12, 0.75) and ReRoPE at w = 256
    of 512 (L/2), with and without log-n."""
    return ["none", f"{SU_MIXED}+logn", "ntk-mixed+logn", f"rerope:window={L // 2}", f"rerope:window={L // 2}+logn"]


def mean_rows(model, rows, last, how):
    """Per-row mean NLL and accuracy of the last `last` targets."""
    nll, hit = score_rows(model, rows, last=last, method=how)
    return nll.mean(axis=1), hit.mean(axis=1)


def bojone(model, units, L, rotary_dim, donor, eot, specs=None, lengths=LENGTHS, crop_stride=1):
    """{arm: {row: per-unit mean NLL of the final L targets}}: exact crop, and each method at kL of input for k in
    lengths (every factor fixed at the longest's), on the real units, on the swapped ones (swap_prefix) and, where the
    units reach back far enough, on the own-document control. crop_stride > 1: crop strided (score_cropped)."""
    k_max = max(lengths)
    same = units[:, -(k_max * L + 1):]
    arms = {"same": same, "swapped": swap_prefix(same, same[donor], L, eot)}
    if units.shape[1] >= same.shape[1] + (k_max - 2) * L + 1:
        # the control: the prefix from earlier in the unit's own document, no end-of-text token
        arms["own document"] = swap_prefix(same, units, L)
    out = {}
    for arm, rows_ in arms.items():
        out[arm] = {"crop": score_cropped(model, rows_, L, L, crop_stride)[0].mean(axis=1)}
        for spec in specs or bojone_methods(L, rotary_dim):
            for k in lengths:
                out[arm][f"{spec}@{k}L"] = final_nll(model, rows_, spec, L, k, k_max, rotary_dim)
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


def press_su(model, led, L, rotary_dim):
    """led [N, L + 8L + 1]: each unit after the L tokens before it (crop's context of the unit's first targets).
    Press: {k: per-unit mean NLL} of the unit's 8L targets in non-overlapping windows of kL, and exact crop on the same
    targets. Su: per-unit accuracy at L (windows of L), at 8L on the unit and on its first 2L tokens repeated to fill
    the window (Su's repeated texts: a text shorter than the window, repeated; the copy distance 2L, beyond crop)."""
    units = led[:, L:]
    n = units.shape[1] - 1
    press, su = {"crop": score_cropped(model, led, n, L)[0].mean(axis=1)}, {}
    for k in (1, 2, 4, 8):
        w = k * L
        windows = np.stack([units[:, s:s + w + 1] for s in range(0, n, w)], axis=1).reshape(-1, w + 1)
        nll, hit = score_rows(model, windows, method=method("none", L, model.config.block_size, w, rotary_dim, None))
        press[f"none@{k}L"] = nll.reshape(len(units), -1).mean(axis=1)
        if k == 1:
            su["none@1L"] = hit.reshape(len(units), -1).mean(axis=1)
    repeated = np.tile(units[:, :COPY * L], (1, n // (COPY * L) + 1))[:, :n + 1]
    for text, rows, crop_rows in (("text", units, led), ("repeated", repeated, repeated)):
        su[f"crop@8L/{text}"] = score_cropped(model, crop_rows, n, L)[1].mean(axis=1)
        for spec in su_methods(L):
            how = method(spec, L, model.config.block_size, n, rotary_dim, 8.0)
            su[f"{spec}@8L/{text}"] = mean_rows(model, rows, n, how)[1]
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


def members(path, seeds, tuned=True):
    """[(L model, its 4L fine-tune or None)] per seed: a rung folder's code_small_seed<k> and code_yarn4x_seed<k> (tuned
    False: only YaRN's protocol reads the fine-tune, so none is needed), or one run folder alone (a converted pretrained
    model's too)."""
    if (path / "code_small_seed0").is_dir():
        pairs = [(path / f"code_small_seed{k}", path / f"code_yarn4x_seed{k}" if tuned else None) for k in range(seeds)]
    else:
        pairs = [(path, None)]
    for run in (r for pair in pairs for r in pair if r is not None):  # hashed once, later, by evaluate_seed
        if not (run / "ckpt.pt").is_file():
            raise UserError(f"{run} holds no checkpoint: train it first (docs/experiments.md, the regime ladder), "
                            "or convert a model folder (python pretrained.py MODEL_DIR --out RUN_DIR)")
    return pairs


def half_tune(small):
    """The seed's s = 2 YaRN fine-tune at 2L (code_yarn2x_seed<k>, the published model's s), where it was trained."""
    run = small.parent / small.name.replace("code_small", "code_yarn2x")
    return run if run != small and (run / "ckpt.pt").is_file() else None


def evaluate_seed(small, tuned, docs_name, units_n, chosen, device):
    """The chosen protocols' per-unit readings for one L model (and YaRN's on its fine-tune, if any), reused from
    small/protocols_<docs>.json while the weights and options are the same."""
    model, _, data_dir, small_id = load_run(small, device)
    tuned_model, _, _, tuned_id = load_run(tuned, device) if tuned else (None, None, None, None)
    half = half_tune(small) if tuned and "yarn" in chosen else None
    half_model, _, _, half_id = load_run(half, device) if half else (None, None, None, None)
    L = model.config.train_len
    # NTK-mixed's pairs are the rotating ones: a partial rotary factor (Pythia's 0.25) leaves the rest unrotated
    rotary_dim = model.config.rotary_dim
    units_n = units_n or max(16, 2048 // L)  # auto: the same 16k targets at every L, at least 16 units
    ids = dict(version=4, small=small_id, tuned=tuned_id, docs=docs_name, units=units_n,
               **({"half": half_id} if half else {}),
               **({} if chosen == list(PROTOCOLS) else {"protocols": chosen}))  # a subset is part of the key
    cache = small / f"protocols_{docs_name}{''.join('_' + x for x in ids.get('protocols', []))}.json"
    if cache.is_file() and (done := json.loads(cache.read_text())).get("ids") == ids:
        return done
    print(f"protocols: {small} on {docs_name}", flush=True)
    tokens, docs = load_split(data_dir, "val")
    docs = held_out(docs, docs_name)
    if "yarn" in chosen:  # before anything is scored: its rows are documents' first 5L + 1 tokens
        long_docs = docs[docs[:, 1] - docs[:, 0] > 5 * L]
        if not len(long_docs):
            raise UserError(f"{small}: no held-out document of --docs {docs_name} has more than 5L = {5 * L} tokens "
                            f"(the longest has {int((docs[:, 1] - docs[:, 0]).max())}), and YaRN's protocol reads each "
                            "one's first 5L + 1: use a corpus with longer documents, or --protocols without yarn")
        long_docs = long_docs[np.sort(np.random.default_rng(0).permutation(len(long_docs))[:units_n])]
    reach = 8 * L if {"press", "su", "bojone"} & set(chosen) else 4 * L  # the longest reading: the own-document arm 4L back
    lead, units, unit_docs = draw_units(tokens, docs, L, reach, units_n)
    result = dict(ids=ids, L=L, units=len(units), unit_docs=unit_docs.tolist())
    if "bojone" in chosen:
        if None in (donor := donors(unit_docs, np.random.default_rng(1))):
            raise UserError(f"{small}: every unit comes from one document; the swapped prefix needs two (more --units)")
        result["bojone"] = bojone(model, units, L, rotary_dim, donor, load_meta(data_dir)["eot_token"])
    if "grid" in chosen:
        result["grid"] = window_grid(model, units, L, rotary_dim)
    if {"press", "su"} & set(chosen):
        result["press"], result["su"] = press_su(model, np.concatenate([lead, units], axis=1), L, rotary_dim)
    if "yarn" in chosen:
        result["documents"] = len(long_docs)
        result["yarn_zero_shot"] = yarn_protocol(model, tokens, long_docs, L, rotary_dim, (1, 2, 4),
                                                 ("none", "pi", "ntk", "yarn"), {"crop": L})
        if tuned is not None:
            result["yarn_tuned"] = yarn_protocol(tuned_model, tokens, long_docs, L, rotary_dim, (1, 2, 4, 5), ("none",),
                                                 {"crop": tuned_model.config.block_size, "crop-L": L})
        if half is not None:  # F = 2L: F/4, F/2, F and 1.25F are L/2, L, 2L and 2.5L
            result["yarn_half"] = yarn_protocol(half_model, tokens, long_docs, L, rotary_dim, (0.5, 1, 2, 2.5), ("none",),
                                                {"crop": half_model.config.block_size, "crop-L": L})
    result = json_ready(result)
    write_atomic(cache, lambda f: f.write((json_text(result) + "\n").encode()))
    return result


def draw_units(tokens, docs, L, reach, n):
    """(lead [N, L], units [N, reach + 1], each unit's document): units drawn from at least L tokens into their document,
    so that exact crop of a unit's first target reads the L tokens before it (the lead), as of every other."""
    inside = np.asarray(docs, dtype=np.int64).copy()
    inside[:, 0] += L
    inside = inside[inside[:, 1] - inside[:, 0] >= reach + 1]
    if not len(inside):
        raise UserError(f"no held-out document holds {L + reach + 1} tokens (L before a unit of {reach + 1}): "
                        "use a corpus with longer documents, or fewer protocols (--protocols bojone needs 5L + 1)")
    starts = doc_windows(inside, reach + 1, n, np.random.default_rng(0))
    rows = np.stack([tokens[s - L:s + reach + 1] for s in starts]).astype(np.int64)
    return rows[:, :L], rows[:, L:], np.searchsorted(docs[:, 0], starts, side="right") - 1


def json_ready(x):
    if isinstance(x, dict):
        return {k: json_ready(v) for k, v in x.items()}
    return np.round(np.asarray(x, dtype=float), 6).tolist() if isinstance(x, np.ndarray) else x


def per_unit(results, *path):
    """{row: [seeds, units]} of one protocol's per-unit readings (path: the keys down to the rows)."""
    tables = list(results)
    for step in path:
        tables = [t[step] for t in tables]
    return {row: np.array([t[row] for t in tables], dtype=float) for row in tables[0]}


def ci(values, results, by_document=True):
    """The interval of the mean of values [seeds, units] from the two-way bootstrap over seeds and held-out documents
    (a document drawn brings all its units; lab/stats.py); by_document False: each unit its own document."""
    return interval(values, results[0]["unit_docs"] if by_document else None)


def reading(c, below=True):
    """A published shape read on an interval of (testbed difference): 'holds' where the whole interval lies on the
    shape's side of zero (below, or above), 'does not hold' where it lies on the other side, else 'within noise'."""
    side = -1 if below else 1
    if side * c["lo"] > 0 and side * c["hi"] > 0:
        return "holds"
    return "does not hold" if side * c["lo"] < 0 and side * c["hi"] < 0 else "within noise"


def chain(readings):
    """A shape made of several contrasts: holds where every one holds, does not hold where any is reversed."""
    return ("does not hold" if "does not hold" in readings else "holds" if set(readings) == {"holds"}
            else "within noise")


def cell(values, digits=3, scale=1.0):
    """A screen's cell: the mean over seeds and units, and each seed's mean in brackets."""
    v = [float(np.mean(x)) * scale for x in values]
    return f"{np.mean(v):.{digits}f}" + (f" ({', '.join(f'{x:.{digits}f}' for x in v)})" if len(v) > 1 else "")


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
# on ordinary / repeated text. The rows with log-n are his dagger rows, log-n applied at inference only as here (posts
# 9706 and 9728); his NTK-RoPE-logn-mixed 45.41 / 68.91 is a model pretrained with log-n, not comparable.
SU_AT_L = 49.41
SU = {"none": ("baseline", 23.16, 24.17),
      SU_MIXED + "+logn": ("NTK-RoPE-logn-mixed, k = 8, b = 0.625, log-n at inference", 42.38, 59.11),
      "rerope:window={w2}": ("ReRoPE w = 256 (L/2)", 48.48, 77.90),
      "rerope:window={w2}+logn": ("ReRoPE w = 256 with log-n at inference", 48.85, 82.40)}
SU_WINDOW = ("window attention, trained", 48.15, 80.84)


def bojone_contrasts(results):
    """{row: {name: [seeds, units]}} of bojone's decomposition on the final L targets: minus crop at each input;
    reads past L at kL, the method on the real units minus on the swapped ones (negative: it gains from the tokens
    more than L back); its distortion at kL, on the swapped units minus crop (crop is the same on both arms). With the
    own-document control: own text, the real units minus the control (what the text at its own place gives beyond
    its document's other text), and splice, the control minus the swapped arm (what another document and the
    end-of-text token cost); the two add up to reads past L."""
    same, swapped = per_unit(results, "bojone", "same"), per_unit(results, "bojone", "swapped")
    own = per_unit(results, "bojone", "own document") if "own document" in results[0]["bojone"] else None
    lengths = sorted(int(k.split("@")[1][:-1]) for k in same if k.startswith("none@"))
    out = {}
    for spec in read_rows(results):
        rows = {f"minus crop {k}L": same[f"{spec}@{k}L"] - same["crop"] for k in lengths}
        rows.update({f"reads past L {k}L": same[f"{spec}@{k}L"] - swapped[f"{spec}@{k}L"] for k in lengths})
        rows.update({f"distortion {k}L": swapped[f"{spec}@{k}L"] - swapped["crop"] for k in lengths})
        if own:
            rows.update({f"own text {k}L": same[f"{spec}@{k}L"] - own[f"{spec}@{k}L"] for k in lengths})
            rows.update({f"splice {k}L": own[f"{spec}@{k}L"] - swapped[f"{spec}@{k}L"] for k in lengths})
        out[spec] = rows
    return out, lengths


def bojone_section(rung, results, L):
    same = per_unit(results, "bojone", "same")
    contrasts, lengths = bojone_contrasts(results)
    far = [k for k in lengths if k >= 3]
    handicap = ci(same["none@1L"] - same["crop"], results)
    crop_moves = max(float(np.abs(per_unit(results, "bojone", arm)["crop"] - same["crop"]).max())
                     for arm in results[0]["bojone"] if arm != "same")
    lines = [f"### bojone/rerope's protocol, rung {rung}\n",
             f"Exact crop on the final L targets: {cell(same['crop'])}. The whole-window reading at L (RoPE as trained, "
             "its targets with 0 to L - 1 tokens of context) minus crop, the baseline's handicap: "
             f"**{interval_text(handicap)}** (bojone's RoPE-4k row is this whole-window reading: no published row is "
             "crop). The swapped arm replaces every token more than L before the first final target (from another "
             "held-out document, with the end-of-text token at the splice): exact crop differs between the arms by at "
             f"most {crop_moves:.1g} nats. **Reads past L** is the method on the real units minus on the swapped ones: "
             "negative, it gains from the tokens more than L back; **distortion** is the method on the swapped units "
             "minus crop. At 1L nothing is swapped: its reads past L is the null, zero by construction. Intervals: 95%, "
             "bootstrap over seeds and documents.\n",
             "| row | published 4k / 8k / 16k | testbed " + " / ".join(f"{k}L" for k in lengths) + " | minus crop "
             f"{lengths[-1]}L | " + " | ".join(f"distortion {k}L | reads past L {k}L" for k in far) + " | null 1L |",
             "| --- | --- | --- | ---: | " + " | ".join("---: | ---:" for _ in far) + " | ---: |"]
    for spec, rows in contrasts.items():
        published = next((v for k, v in BOJONE.items() if k.format(w4=L // 4) == spec), None)
        pub = " / ".join("-" if x is None else f"{x:.4f}" for x in published[1]) if published else ""
        name = f"`{spec}`" + (f" ({published[0]})" if published else "")
        at = " / ".join(f"{np.mean(same[f'{spec}@{k}L']):.3f}" for k in lengths)
        cells = [interval_text(ci(rows[f"minus crop {lengths[-1]}L"], results))]
        cells += [interval_text(ci(rows[f"{what} {k}L"], results)) for k in far for what in ("distortion", "reads past L")]
        cells.append(f"{np.abs(rows['reads past L 1L']).max():.1g}")
        lines.append(f"| {name} | {pub} | {at} | " + " | ".join(cells) + " |")
    if "own document" in results[0]["bojone"]:
        lines += own_document_table(contrasts, results, far)
    return lines


def own_document_table(contrasts, results, far):
    """The control that splits reads past L: the same rows with the prefix from earlier in the unit's own document."""
    lines = ["\nThe own-document control: the same prefix replaced instead by the unit's own document's text from "
             "further back (the 2L + 1 tokens 4L before their place, no end-of-text token; crop again unchanged). "
             "**Own text** is the real units minus the control (negative: the method gains from the very text more "
             "than L back, beyond other text of its document); **splice** is the control minus the swapped arm "
             "(negative: the foreign document and its end-of-text token cost the method, not the text it lost). The "
             "two add up to reads past L.\n",
             "| row | " + " | ".join(f"reads past L {k}L | own text {k}L | splice {k}L" for k in far) + " |",
             "| --- | " + " | ".join("---: | ---: | ---:" for _ in far) + " |"]
    for spec, rows in contrasts.items():
        cells = [interval_text(ci(rows[f"{what} {k}L"], results))
                 for k in far for what in ("reads past L", "own text", "splice")]
        lines.append(f"| `{spec}` | " + " | ".join(cells) + " |")
    return lines


def holds_bojone(results, L):
    """bojone's published shapes as contrasts on the testbed ({shape: (interval, reading)}): each ReRoPE row's
    "longer input, lower loss" (2L below the whole-window RoPE reading at L, the longest input below 2L), NTK-mixed
    falling with input, RoPE as trained above its L reading at 2L; and what no published row tested: below exact crop,
    and reading the tokens more than L back."""
    same = per_unit(results, "bojone", "same")
    contrasts, lengths = bojone_contrasts(results)
    top = lengths[-1]
    out = {}
    for r in (s for s in read_rows(results) if s.startswith("rerope")):
        out[f"`{r}`: 2L below RoPE's whole window at L"] = same[f"{r}@2L"] - same["none@1L"], True
        out[f"`{r}`: {top}L below 2L"] = same[f"{r}@{top}L"] - same[f"{r}@2L"], True
        out[f"`{r}`: below exact crop at {top}L (not in the published table)"] = contrasts[r][f"minus crop {top}L"], True
    for r in read_rows(results):
        out[f"`{r}`: reads the tokens more than L back at {top}L (not in the published table)"] = (
            contrasts[r][f"reads past L {top}L"], True)
        if f"own text {top}L" in contrasts[r]:
            out[f"`{r}`: reads its own text more than L back at {top}L, the splice aside (not published)"] = (
                contrasts[r][f"own text {top}L"], True)
    if "ntk-mixed+logn" in contrasts:
        out[f"NTK-logn-mixed: {top}L below 2L"] = same[f"ntk-mixed+logn@{top}L"] - same["ntk-mixed+logn@2L"], True
    out["RoPE as trained: above its L reading at 2L"] = same["none@2L"] - same["none@1L"], False
    return {shape: (ci(v, results), below) for shape, (v, below) in out.items()}


def yarn_section(rung, results):
    zero = per_unit(results, "yarn_zero_shot")
    ppl = lambda v: [math.exp(np.mean(x)) for x in v]
    lines = [f"### YaRN's protocol (documents truncated, one window from 0), rung {rung}\n",
             "Perplexity; F, the fine-tuned length (published 8k with s = 2, so its F/2 is the base model's length; the "
             "testbed's s = 4 fine-tune has F = 4L, so its F/4 is L and its columns align by F, not by the base length; "
             "its s = 2 fine-tune, where trained, aligns by both). Cells marked = equal the row's fine-tune by "
             "construction (no crop window is shorter than the input) and are not measurements. The "
             "testbed's documents are those of at least 5L + 1 tokens, each cut at its start. Every window starts at "
             "the document's start, so a shorter window holds more targets with little context: the curve falls with "
             "the length partly by dilution, which exact crop's own curve (below) shows without any context past L.\n",
             "| row | F/4 | F/2 | F | 1.25F |", "| --- | ---: | ---: | ---: | ---: |"]
    lines += [f"| {name} (published) | " + " | ".join(f"{x:.3f}" for x in v) + " |" for name, v in YARN.items()]
    if "yarn_tuned" in results[0]:
        tuned = per_unit(results, "yarn_tuned")
        lines.append("| the ceiling (YaRN s = 4 fine-tune at 4L) | "
                     + " | ".join(cell(ppl(tuned[f"none@{k}L"])) for k in (1, 2, 4, 5)) + " |")
        lines.append("| its exact crop to 4L | = the ceiling (no window is longer) | = | = | "
                     + cell(ppl(tuned["crop@5L"])) + " |")
        lines.append("| its exact crop to L | " + " | ".join(cell(ppl(tuned[f"crop-L@{k}L"])) for k in (1, 2, 4, 5)) + " |")
    if all("yarn_half" in r for r in results):  # the published model's s: its columns align by F and base length
        half = per_unit(results, "yarn_half")
        lines.append("| the s = 2 fine-tune at F = 2L | "
                     + " | ".join(cell(ppl(half[f"none@{k:g}L"])) for k in (0.5, 1, 2, 2.5)) + " |")
        lines.append("| its exact crop to 2L | = the fine-tune (no window is longer) | = | = | "
                     + cell(ppl(half["crop@2.5L"])) + " |")
        lines.append("| its exact crop to L | = | = | " + " | ".join(cell(ppl(half[f"crop-L@{k:g}L"])) for k in (2, 2.5))
                     + " |")
    lines += ["", "Zero-shot on the L model in the same protocol (factor k at kL), perplexity:\n",
              "| row | L | 2L | 4L |", "| --- | ---: | ---: | ---: |"]
    for row in ("none", "pi", "ntk", "yarn", "crop"):
        lines.append(f"| `{row}` | " + " | ".join(cell(ppl(zero[f"{row}@{k}L"])) for k in (1, 2, 4)) + " |")
    return lines


def press_su_section(rung, results):
    press, su = per_unit(results, "press"), per_unit(results, "su")
    ppl = lambda v: [math.exp(np.mean(x)) for x in v]
    L = results[0]["L"]
    lines = [f"### Press et al.'s protocol (non-overlapping windows of kL, every target), rung {rung}\n",
             f"Published (Table 2, {PRESS[0]}): {PRESS[1]} at L, {PRESS[2]} at about 2L (x{PRESS[2] / PRESS[1]:.3f}). "
             "Testbed, perplexity over the same 8L targets of each unit (each unit drawn at least L tokens into its "
             "document, so exact crop reads L tokens for every target):\n",
             "| reading | L | 2L | 4L | 8L | exact crop |", "| --- | ---: | ---: | ---: | ---: | ---: |",
             "| RoPE as trained | " + " | ".join(cell(ppl(press[f"none@{k}L"]), 2) for k in (1, 2, 4, 8))
             + f" | {cell(ppl(press['crop']), 2)} |", "",
             f"### Su's protocol (next-token accuracy, %), rung {rung}\n",
             f"At L: published {SU_AT_L}, testbed {cell(su['none@1L'], 2, 100)}. At 8L on the units' text, and on "
             f"repeated text: each unit's first {COPY}L tokens repeated to fill the window (copy distance {COPY}L, beyond "
             "crop's reach; Su's repeated set also mixes natural samples in, in a proportion his posts do not give). The "
             "copy measure: the row's (repeated - text) minus crop's, with its interval. The published log-n rows are "
             "Su's log-n at inference (his dagger rows), as the testbed applies it.\n",
             "| row | published text / repeated | testbed text | testbed repeated | copy measure (points) |",
             "| --- | --- | ---: | ---: | ---: |"]
    crop_gap = su["crop@8L/repeated"] - su["crop@8L/text"]
    for spec in su_methods(L):
        name, text, rep = next(((n, t, r) for k, (n, t, r) in SU.items() if k.format(w2=L // 2) == spec),
                               ("bojone's k = 12, b = 0.75, log-n", None, None))
        pub = f"{text:.2f} / {rep:.2f}" if text is not None else "(not published)"
        copy = ci(100 * (su[f"{spec}@8L/repeated"] - su[f"{spec}@8L/text"] - crop_gap), results)
        lines.append(f"| `{spec}` ({name}) | {pub} | {cell(su[f'{spec}@8L/text'], 2, 100)} | "
                     f"{cell(su[f'{spec}@8L/repeated'], 2, 100)} | {interval_text(copy, '+.2f')} |")
    lines.append(f"| {SU_WINDOW[0]} | {SU_WINDOW[1]:.2f} / {SU_WINDOW[2]:.2f} | not trained here | | |")
    lines.append(f"| exact crop | (not published) | {cell(su['crop@8L/text'], 2, 100)} | "
                 f"{cell(su['crop@8L/repeated'], 2, 100)} | |")
    return lines


def grid_scores(results):
    """{setting: per-unit [seeds, units] mean of minus crop at 2L and 4L}."""
    g = per_unit(results, "grid")
    L = results[0]["L"]
    return {spec: (g[f"{spec}@2L"] + g[f"{spec}@4L"]) / 2 - g["crop"] for spec in grid(L)}


def dev_choice(scores):
    """The lowest setting of each method on dev: what the test page marks."""
    return {min((s for s in scores if s.split(":")[0] == m), key=lambda s: float(np.mean(scores[s])))
            for m in ("rerope", "leaky-rerope")}


def grid_section(rung, results, docs, chosen):
    g = per_unit(results, "grid")
    lines = [f"### ReRoPE's windows to L - 2, with and without log-n, rung {rung} ({docs} documents)\n",
             "bojone's protocol (the final L targets), each setting minus exact crop at 2L / 4L of input (mean over "
             "seeds and units); in bold the setting of each method "
             + ("with the lowest mean here (dev: where settings are chosen)" if chosen is None else
                "chosen on the dev documents (lab/protocols.py --docs dev), whatever its rank here") + ".\n",
             "| setting | 2L | 4L |", "| --- | ---: | ---: |"]
    scores = grid_scores(results)
    marked = dev_choice(scores) if chosen is None else chosen
    for spec in scores:
        bold = "**" if spec in marked else ""
        a, b = (float(np.mean(g[f"{spec}@{k}L"] - g["crop"])) for k in (2, 4))
        lines.append(f"| {bold}`{spec}`{bold} | {a:+.3f} | {b:+.3f} |")
    return lines


def plot(rungs, per_rung):
    """Per rung: each bojone row's reading at each input, exact crop dashed, the swapped arm dotted."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(rungs), figsize=(6.5 * len(rungs), 4.5), squeeze=False)
    for ax, rung in zip(axes[0], rungs):
        results = per_rung[rung]
        same, swapped = per_unit(results, "bojone", "same"), per_unit(results, "bojone", "swapped")
        lengths = bojone_contrasts(results)[1]
        for n, spec in enumerate(s for s in read_rows(results) if s != "none"):
            color = plt.cm.tab10(n % 10)
            ax.plot(lengths, [np.mean(same[f"{spec}@{k}L"]) for k in lengths], "o-", color=color, label=spec)
            ax.plot(lengths, [np.mean(swapped[f"{spec}@{k}L"]) for k in lengths], ":", color=color)
        ax.axhline(np.mean(same["crop"]), color="k", ls="--", label="exact crop (both arms)")
        ax.axhline(np.mean(same["none@1L"]), color="grey", ls="-.", label="RoPE as trained at L (whole window)")
        ax.set(xscale="log", xticks=lengths, xticklabels=[f"{k}L" for k in lengths], xlabel="input (multiples of L)",
               ylabel="NLL of the final L targets", title=f"{rung}: bojone's protocol (dotted: swapped prefix)")
        ax.minorticks_off()
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    return png(fig)


def metrics(per_rung):
    """Summary metrics a runs table compares across pages, means over seeds and units: per rung bojone's decomposition
    (protocols/<rung>/bojone/<row>/{minus_crop_kL,distortion_kL,reads_past_L_kL,own_text_kL,splice_kL}, the handicap), Su's accuracies and
    Press's and YaRN's readings."""
    out = {}
    for rung, results in per_rung.items():
        for name in ("su", "press", "yarn_tuned", "yarn_half", "yarn_zero_shot"):
            if all(name in r for r in results):
                out.update({key("protocols", rung, name, row): float(np.mean(v))
                            for row, v in per_unit(results, name).items()})
        if "bojone" not in results[0]:
            continue
        same = per_unit(results, "bojone", "same")
        out[key("protocols", rung, "bojone", "handicap")] = float(np.mean(same["none@1L"] - same["crop"]))
        for spec, rows in bojone_contrasts(results)[0].items():
            out.update({key("protocols", rung, "bojone", spec, name.replace(" ", "_")): float(np.mean(v))
                        for name, v in rows.items()})
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
    runs = {Path(r).name: members(Path(r), seeds, "yarn" in chosen) for r in a.rungs}
    if len(runs) < len(a.rungs):
        raise UserError(f"two rungs share a folder name in {' '.join(a.rungs)}: the page names rungs by it")
    out = claim_output(a.out, "shapes")
    per_rung = {name: [evaluate_seed(small, tuned, a.docs, units, chosen, device) for small, tuned in pairs]
                for name, pairs in runs.items()}
    command = shlex.join(["python", "lab/protocols.py", *a.rungs, f"--seeds={seeds}", f"--units={a.units}",
                          f"--docs={a.docs}", f"--protocols={','.join(chosen)}", f"--out={a.out}"])
    md = page(per_rung, seeds, a.docs, command, {name: chosen_on_dev(pairs) for name, pairs in runs.items()}
              if a.docs == "test" and "grid" in chosen else None)
    drawn = [rung for rung, results in per_rung.items() if "bojone" in results[0]]
    write_page(out, "shapes", md, dict(command=command, rungs=per_rung), drawn and plot(drawn, per_rung),
               indent=None)
    if wandb_log:
        log_page(out, "protocols", dict(rungs=list(per_rung), docs=a.docs), metrics(per_rung),
                 drawn and out / "shapes.png")


def chosen_on_dev(pairs):
    """The grid's settings dev chose (dev_choice), from the seeds' dev readings cached beside them (every protocol's,
    or the grid's alone: --protocols grid); None if a seed's was not read."""
    dev = [next((d for name in ("protocols_dev.json", "protocols_dev_grid.json") if (small / name).is_file()
                 and "grid" in (d := json.loads((small / name).read_text()))), None) for small, _ in pairs]
    return None if None in dev else dev_choice(grid_scores(dev))


def page(per_rung, seeds, docs, command, chosen=None):
    lines = ["# Published tables in their own protocols, with exact crop beside\n",
             f"{generated(command)}\n",
             f"{seeds} seed(s) a rung, the {docs} documents; each cell the mean over seeds and units, with each seed's "
             "mean in brackets where there are several. None of the published tables has an exact-crop row: each "
             "published number is beside the testbed's number measured in that source's protocol, and exact crop "
             "(every target from exactly its last L tokens) beside both. Every shape is a declared contrast with its 95% "
             "interval (bootstrap over seeds and held-out documents): it holds where the interval lies on the shape's "
             "side of zero, does not hold where it lies on the other, and is within noise otherwise.\n",
             "## Scoreboard\n", "| source | shape | rung | testbed difference [95% interval] | reading |",
             "| --- | --- | --- | ---: | --- |"]
    for rung, results in per_rung.items():
        shapes = ([("bojone/rerope", *kv) for kv in holds_bojone(results, results[0]["L"]).items()]
                  if "bojone" in results[0] else [])
        shapes += [(source, shape, v) for (source, shape), v in other_holds(results).items()]
        for source, shape, (c, below) in shapes:
            verdict = chain(below) if isinstance(below, list) else reading(c, below)
            lines.append(f"| {source} | {shape} | {rung} | {interval_text(c)} | {verdict} |")
    for rung, results in per_rung.items():
        first = results[0]
        lines += ["", f"## {rung} (L = {first['L']}; {first['units']} units"
                  + (f", {first['documents']} documents for YaRN's protocol" if "documents" in first else "") + ")\n"]
        for part, section in (("bojone", lambda: bojone_section(rung, results, first["L"])),
                              ("yarn_zero_shot", lambda: yarn_section(rung, results)),
                              ("press", lambda: press_su_section(rung, results)),
                              ("grid", lambda: grid_section(rung, results, docs, (chosen or {}).get(rung)))):
            lines += section() + [""] if part in first else []
    return "\n".join(lines) + "\n"


def other_holds(results):
    """YaRN's, Press's and Su's published shapes as contrasts ({(source, shape): (interval, below or [readings])}),
    for the protocols that were read. A shape of several contrasts gives the readings of each; its interval is the
    weakest one's."""
    L, first = results[0]["L"], results[0]
    r, rl = f"rerope:window={L // 2}", f"rerope:window={L // 2}+logn"
    out = {}
    if "yarn_tuned" in first:
        out["jquesnelle/yarn", "a fine-tune's perplexity falls to its length F and rises past it"] = fall_and_rise(
            per_unit(results, "yarn_tuned"), "1L", "4L", "5L", results)
    if all("yarn_half" in r for r in results):  # every seed's s = 2 fine-tune trained
        out["jquesnelle/yarn", "the same, the s = 2 fine-tune (F = 2L)"] = fall_and_rise(
            per_unit(results, "yarn_half"), "0.5L", "2L", "2.5L", results)
    if "press" in first:
        press, su = per_unit(results, "press"), per_unit(results, "su")
        out["Press et al. 2022", "RoPE as trained: whole windows of 2L above L"] = (
            ci(press["none@2L"] - press["none@1L"], results), False)
        for text in ("text", "repeated"):
            order = [su[f"{row}@8L/{text}"] for row in ("none", f"{SU_MIXED}+logn", r, rl)]
            parts = [(ci(order[i + 1] - order[i], results), False) for i in range(3)]
            out["Su 2023", f"accuracy at 8L, {text}: baseline < NTK-logn-mixed (Su's) < ReRoPE < ReRoPE+log-n"] = (
                weakest(parts))
        out["Su 2023", "ReRoPE+log-n at 8L no more than 1 point below the accuracy at L"] = (
            ci(su[f"{rl}@8L/text"] - su["none@1L"] + 0.01, results), False)
        copy = lambda row: su[f"{row}@8L/repeated"] - su[f"{row}@8L/text"]
        out["Su 2023", "ReRoPE+log-n copies from 2L back (its repeated - text above crop's)"] = (
            ci(copy(rl) - copy("crop"), results), False)
    return out


def fall_and_rise(tuned, start, F, past, results):
    """YaRN's published shape on a fine-tune's readings (each document alone): down from start to F, up past F."""
    return weakest([(ci(tuned[f"none@{F}"] - tuned[f"none@{start}"], results, False), True),
                    (ci(tuned[f"none@{past}"] - tuned[f"none@{F}"], results, False), False)])


def weakest(parts):
    """(the interval nearest zero, [each part's reading]) of a shape made of several contrasts."""
    return min(parts, key=lambda p: min(abs(p[0]["lo"]), abs(p[0]["hi"])))[0], [reading(c, b) for c, b in parts]


if __name__ == "__main__":
    run_cli("protocols.py", lambda: main(sys.argv[1:]))
