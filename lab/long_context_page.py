"""The page of lab/long_context.py's readings (docs/results/smollm2.md): passkey by length and depth with exact
intervals, loss by position against crop, bojone's decomposition, and what each reading cost, written from the items
that have landed, each cell with its count."""
import math
from pathlib import Path

import numpy as np
from scipy.stats import binomtest

from common import json_text, write_atomic
from eval.report import line_style, png, pyplot
from lab.long_context import DEPTHS, crop_stride, is_crop
from lab.pages import generated, interval_text
from lab.stats import interval


def binned(nll, width=256):
    """A loss item's per-target NLL as means of `width` targets (the last bin shorter): the page's JSON; every
    target's stays in OUT/items."""
    return [round(float(np.mean(nll[i:i + width])), 4) for i in range(0, len(nll), width)]


def collect(found, prefix):
    """{rest: [items]} of the items under prefix, grouped by what precedes the last '/'."""
    out = {}
    for name, value in found.items():
        if name.startswith(prefix + "/"):
            out.setdefault(name[len(prefix) + 1:].rsplit("/", 1)[0], []).append((name.rsplit("/", 1)[1], value))
    return out


def past(spec, nll, L):
    """A loss item's NLL on the targets past L (a crop's are only those)."""
    return np.asarray(nll) if is_crop(spec) else np.asarray(nll)[L:]


def loss_table(found, L, methods):
    """Rows of the loss reading at each length: mean NLL within L and past L, and past L minus crop on the same
    documents with its interval over documents."""
    got = collect(found, "loss")
    lines = []
    for key in sorted({k.split("@")[1] for k in got}):
        crop = dict(got.get(f"crop@{key}", []))
        lines += [f"\n**{key} ({round(float(key[:-1]) * L)} tokens)**: mean NLL by the target's position, and past L "
                  "minus crop on the same documents (negative: the longer context helps; 95% interval over "
                  "documents, no more than indicative below 8 of them).\n",
                  "| method | documents | within L | past L | past L minus crop |",
                  "| --- | ---: | ---: | ---: | ---: |"]
        for spec in methods:
            units = dict(got.get(f"{spec}@{key}", []))
            if not units:
                continue
            within = np.mean([np.mean(v["nll"][:L]) for v in units.values()])
            after = [x.mean() for v in units.values() if len(x := past(spec, v["nll"], L))]
            both = [u for u in units if u in crop and spec != "crop"]
            diff = [[past(spec, units[u]["nll"], L).mean() - np.mean(crop[u]["nll"]) for u in both]]
            c = interval(diff) if len(both) > 1 else None
            lines.append(f"| `{spec}` | {len(units)} | {'' if is_crop(spec) else f'{within:.3f}'} | "
                         f"{np.mean(after):.3f} | " + (interval_text(c) if c else "") + " |" if after else
                         f"| `{spec}` | {len(units)} | {within:.3f} | | |")
    return lines


def bojone_crop(found, spec):
    """{unit: NLL} of a crop's bojone items."""
    return {name.rsplit("/", 1)[1]: v["nll"] for name, v in found.items() if name.startswith(f"bojone/{spec}/")}


def bojone_table(found, methods, against="crop"):
    """Rows of the decomposition: per method, with 95% intervals over units (each from its own document). Against
    another crop (crop:stride=S) only the columns with crop in them."""
    crop = bojone_crop(found, against)
    same, swapped, own = (collect(found, f"bojone/{arm}") for arm in ("same", "swapped", "own"))
    full = against == "crop"
    lines = ["| method | units | 1L minus crop | kL minus crop | distortion (swapped kL minus crop) |" + (
             " reads past L (real kL minus swapped kL) | own text (real minus own-document kL) | splice (own-document "
             "minus swapped kL) |" if full else ""), "| --- | ---: | ---: | ---: | ---: |" + " ---: |" * 3 * full]
    ks = sorted({k.split("@")[1] for k in swapped})
    for spec in methods:
        for k in ks:
            real, swap, one, mine = (dict(d.get(f"{spec}@{x}", []))
                                     for d, x in ((same, k), (swapped, k), (same, "1L"), (own, k)))
            units = [u for u in real if u in swap and u in crop]
            if len(units) < 2:
                continue
            ci = lambda f: interval_text(interval([[f(u) for u in units]]))
            at1 = [u for u in one if u in crop]
            lines.append(f"| `{spec}` ({k}) | {len(units)} | "
                         + (interval_text(interval([[one[u]['nll'] - crop[u] for u in at1]])) if len(at1) > 1 else "")
                         + f" | {ci(lambda u: real[u]['nll'] - crop[u])} | {ci(lambda u: swap[u]['nll'] - crop[u])} |"
                         + (f" {ci(lambda u: real[u]['nll'] - swap[u]['nll'])} | {split(real, swap, mine, units)} |"
                            if full else ""))
    return lines


def another_crop(found, L, a, spec):
    """Lines: the decomposition's columns with crop in them against crop at another stride, and it minus crop."""
    stride, other, crop = crop_stride(spec, a.crop_stride, L), bojone_crop(found, spec), bojone_crop(found, "crop")
    units = [u for u in other if u in crop]
    if len(units) < 2:
        return []
    gap = interval_text(interval([[other[u] - crop[u] for u in units]]))
    return [f"\n**Against crop strided at {stride:,}** (`{spec}`: each target sees {L - stride + 1:,} to {L:,} "
            f"tokens; it minus crop strided at {a.crop_stride:,}: {gap} on {len(units)} units):\n",
            *bojone_table(found, a.methods, spec)]


def split(real, swap, own, units):
    """The own-document control's two cells on the units that have it: own text, and splice."""
    units = [u for u in units if u in own]
    if len(units) < 2:
        return " | "
    return " | ".join(interval_text(interval([[a[u]["nll"] - b[u]["nll"] for u in units]]))
                      for a, b in ((real, own), (own, swap))) + f" ({len(units)} units)"


def passkey_grid(found, methods):
    """{method: {(length, depth): [exact per trial]}}."""
    grid = {}
    for name, v in found.items():
        if name.startswith("passkey/"):
            _, at, depth, _ = name.split("/")
            spec, length = at.rsplit("@", 1)
            grid.setdefault(spec, {}).setdefault((length, float(depth[1:])), []).append(v["exact"])
    return {m: grid[m] for m in methods if m in grid}


def rate(hits):
    """'k/n [lo, hi]': greedy exact matches with their exact (Clopper-Pearson) 95% interval."""
    ci = binomtest(sum(hits), len(hits)).proportion_ci(method="exact")
    return f"{sum(hits)}/{len(hits)} [{ci.low:.0%}, {ci.high:.0%}]"


def passkey_plot(grid, L):
    plt = pyplot()
    n = len(grid)
    cols = min(4, n)
    fig, axes = plt.subplots(math.ceil(n / cols), cols, figsize=(3.2 * cols, 2.6 * math.ceil(n / cols)), squeeze=False)
    lengths = sorted({k for cells in grid.values() for k, _ in cells}, key=lambda s: float(s[:-1]))
    for ax, (spec, cells) in zip(axes.flat, grid.items()):
        acc = np.full((len(DEPTHS), len(lengths)), np.nan)
        for (length, depth), hits in cells.items():
            acc[DEPTHS.index(depth), lengths.index(length)] = np.mean(hits)
        ax.imshow(acc, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
        ax.set(xticks=range(len(lengths)), xticklabels=[f"{float(s[:-1]) * L / 1024:g}k" for s in lengths],
               yticks=range(len(DEPTHS)), yticklabels=[f"{d:g}" for d in DEPTHS], title=spec, xlabel="length",
               ylabel="depth of the key")
        for (i, j), v in np.ndenumerate(acc):
            if not np.isnan(v):
                ax.text(j, i, f"{v:.0%}", ha="center", va="center", fontsize=8)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.suptitle("passkey, greedy exact match (teacher-forced)")
    return png(fig)


def loss_plot(found, L, methods, width=512):
    """Per length: each method's NLL by position over the whole window (crop's past L), and past L its NLL minus
    crop's on the same documents, zoomed near crop (a method off the scale keeps its mean in the legend); means of
    `width` targets, bands one standard error over documents."""
    got = collect(found, "loss")
    keys = sorted({k.split("@")[1] for k in got}, key=lambda s: float(s[:-1]))
    plt = pyplot()
    fig, axes = plt.subplots(2, len(keys), figsize=(7 * len(keys), 7), squeeze=False, sharex="col")
    for col, key in enumerate(keys):
        crop = {u: np.asarray(v["nll"]) for u, v in got.get(f"crop@{key}", [])}
        top, bottom = axes[0, col], axes[1, col]
        drawn = []
        for spec in (m for m in methods if f"{m}@{key}" in got):
            units = {u: np.asarray(v["nll"]) for u, v in got[f"{spec}@{key}"]}
            style = {**line_style(spec), **({"ls": ":"} if "+logn" in spec else {})}  # ReRoPE's two told apart
            if style in drawn:  # the same method at another setting (a window chosen on dev)
                style = {**style, "ls": "-." if style.get("ls") != "-." else "-", "mfc": "none"}
            drawn.append(style)
            start = L if is_crop(spec) else 0
            x = start + np.arange(0, len(next(iter(units.values()))), width) + width / 2
            top.plot(x, np.mean([binned(v, width) for v in units.values()], axis=0), lw=1.5, ms=3,
                     label=f"{spec} ({len(units)})", **style)
            both = [u for u in units if u in crop and spec != "crop"]
            if len(both) < 2:
                continue
            diff = np.array([np.subtract(binned(past(spec, units[u], L), width), binned(crop[u], width)) for u in both])
            mean, err = diff.mean(0), diff.std(0, ddof=1) / np.sqrt(len(both))
            gap = np.mean([past(spec, units[u], L).mean() - crop[u].mean() for u in both])  # the table's number
            x = L + np.arange(0, diff.shape[1]) * width + width / 2
            bottom.plot(x, mean, lw=1.5, ms=3, label=f"{spec}: {gap:+.3f}", **style)
            bottom.fill_between(x, mean - err, mean + err, alpha=0.15, color=style["color"], lw=0)
        for ax in (top, bottom):
            ax.axvline(L, color="0.3", ls="--", lw=1)
        bottom.axhline(0, color="k", lw=2)
        docs = {u for name, read in got.items() if name.endswith(f"@{key}") for u, _ in read}
        top.set(title=f"{key}: NLL by position ({len(docs)} documents)", ylabel="NLL (nats)")
        bottom.set(title="past L: minus crop on the same documents (below zero: context helps)",
                   xlabel="target position", ylabel="minus crop (nats)", ylim=(-0.15, 0.35), xlim=(0, None))
        top.legend(fontsize=7, title="documents", title_fontsize=7)
        if bottom.get_legend_handles_labels()[0]:
            bottom.legend(fontsize=7, title="mean past L", title_fontsize=7)
        else:  # at 1x: nothing past L
            bottom.axis("off")
    fig.suptitle(f"loss by position, trained at L = {L:,}; bins of {width} targets, bands one standard error "
                 "over documents", fontsize=9)
    return png(fig)


def source(ckpt, run):
    """The model's name and file: a GGUF's general.name and sha256, a model folder's path, else the run folder."""
    record = ckpt.get("pretrained") or {}
    if gguf := record.get("gguf"):
        return f"{gguf['name']} ({Path(gguf['file']).name}, sha256 {gguf['sha256'][:12]}, {gguf['types']})"
    return record.get("folder") or str(run)


def cost(found):
    """Lines: the seconds each kind of item took, what the page rests on."""
    kinds = {}
    for name, v in found.items():
        parts = name.split("/")
        stage, at = parts[0], next((x for x in parts if "@" in x), parts[1])
        kinds.setdefault((stage, at), []).append(v["seconds"])
    return [f"| {stage} | `{at}` | {len(s)} | {np.median(s):,.0f} | {sum(s) / 60:,.0f} |"
            for (stage, at), s in sorted(kinds.items())]


def passkey_section(grid, heatmap):
    lines = ["## Passkey (greedy exact match, teacher-forced)\n",
             "Readings in flight while the machine was paused for a benchmark count the pause in their seconds. "
             "One trial a cell is an anecdote, not a rate; the last column pools the depths, with its exact 95% "
             "interval (Clopper-Pearson, each depth and trial one draw).\n",
             "The key's line at a depth of the filler (0: first, 1: just before the question); at 2x a key at depth "
             "below about 0.5 lies more than L before the question, where crop cannot see it.\n",
             "| method | " + " | ".join(f"depth {d:g}" for d in DEPTHS) + " | all depths |",
             "| --- |" + " ---: |" * (len(DEPTHS) + 1)]
    for spec, cells in grid.items():
        for length in sorted({k for k, _ in cells}, key=lambda s: float(s[:-1])):
            row = [cells.get((length, d)) for d in DEPTHS]
            lines.append(f"| `{spec}` at {length} | " + " | ".join(f"{sum(h)}/{len(h)}" if h else "" for h in row)
                         + f" | {rate([x for h in row if h for x in h])} |")
    return lines + ["", f"![passkey, accuracy by length and depth]({heatmap.name})"]


def bojone_section(found, L, a):
    lines = ["", "## bojone's protocol with the swap that leaves crop untouched\n",
             "The final L targets of each unit (one a document, its last kL + 1 tokens); the swapped arm's tokens "
             "more than L before the first final target come from another document (an end-of-text token at the "
             "splice), so crop is the same on both arms. Reads past L negative: the method gains from the tokens more "
             "than L back that the swap replaces (those before every final target's window; what it reads from a "
             "later target's real tokens more than L back falls in its distortion). The own-document control, where "
             "the document holds kL more tokens, takes them from its own text kL further back (no end-of-text "
             "token): own text and splice split reads past L in two.\n", *bojone_table(found, a.methods)]
    for spec in (m for m in a.methods if is_crop(m) and m != "crop"):
        lines += another_crop(found, L, a, spec)
    return lines


def write_report(found, L, a, ckpt, command):
    grid, losses = passkey_grid(found, a.methods), bool(collect(found, "loss"))
    page = Path(a.page)
    heatmap, curves = page.with_suffix(".png"), page.with_name(page.stem + "_loss.png")
    lines = [f"# A real model read past its trained length: {Path(a.run).name}\n", f"{generated(command)}\n",
             f"The model: {source(ckpt, a.run)}, trained at L = {L:,}, read in {a.dtype}. The text: the {a.docs} "
             f"half of the held-out documents. Crop is strided at {a.crop_stride:,}: each target past L from "
             f"{L - a.crop_stride + 1:,} to {L:,} tokens. Settings as each method's name says: ReRoPE's and "
             "Self-Extend's window L/4 as published (bojone's 1,024 of 4k) or one chosen on the dev half (a row of "
             "its own), Self-Extend's group the smallest whose grouped distances stay inside L, every scaling at the "
             "length's factor (passkey and loss) or the longest input's (bojone). Each cell counts the items it rests "
             "on; intervals are 95%, bootstrap over documents. A reading none of whose items has landed has no "
             "section.\n"]
    if grid:
        lines += passkey_section(grid, heatmap)
    if losses:
        lines += ["", "## Loss by position against crop"] + loss_table(found, L, a.methods)
        lines += ["", f"![loss by position]({curves.name})"]
    if any(name.startswith("bojone/") for name in found):
        lines += bojone_section(found, L, a)
    lines += ["", "## What each reading cost\n", "| reading | method at length | items | median seconds | minutes |",
              "| --- | --- | ---: | ---: | ---: |"] + cost(found)
    page.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(page, lambda f: f.write(("\n".join(lines) + "\n").encode()))
    write_atomic(page.with_suffix(".json"), lambda f: f.write((json_text(dict(command=command, items={
        name: {**item, "nll": binned(item["nll"])} if isinstance(item.get("nll"), list) else item
        for name, item in found.items()})) + "\n").encode()))
    if grid:
        figure = passkey_plot(grid, L)
        write_atomic(heatmap, lambda f: f.write(figure))
    if losses:
        figure = loss_plot(found, L, a.methods)
        write_atomic(curves, lambda f: f.write(figure))
    print(f"-> {page}")
