"""A converted pretrained model read past its trained length L (docs/results/smollm2.md): does a method read context
from more than L back, or only remove the whole-window baseline's handicap? Three readings, every method beside
crop:

- passkey: the YaRN paper's prompt (jquesnelle/yarn eval/passkey.py, from Landmark Attention: the task, the filler
  "The grass is green. ...", the key's line at a depth, the filler, the question) at kL tokens. Greedy exact match
  is read teacher-forced: greedy decoding writes the key exactly when every key token is the argmax given the
  tokens before it, which one forward shows; the key's log-probability beside it.
- loss: the first kL + 1 tokens of each held-out document scored from position 0, loss by position; crop on the
  targets past L, strided (each window of L tokens scores its last --crop_stride targets; `crop:stride=S` beside it
  is crop at another stride, read against the folder's).
- bojone: the final L targets with kL tokens of input (bojone/rerope eval_loss.py), on the real units and on units
  whose tokens more than L before the first final target come from another document (lab/protocols.py's swap: crop
  reads none of them), so that the method on the real minus on the swapped units is what it reads from more than L
  back and the method on the swapped units minus crop its distortion.

Each item (a method on one trial, document or unit) is written to OUT/items/ as it lands: a killed run resumes, and
--page writes the page from what has landed, each cell with its count.

    python lab/long_context.py out/smollm2/run --out out/smollm2 --docs dev      # settings, on dev
    python lab/long_context.py out/smollm2/run --out out/smollm2                 # the readings, on test
    python lab/long_context.py out/smollm2/run --out out/smollm2 --page docs/results/smollm2.md
"""
import hashlib
import json
import math
import shlex
import sys
import time
from pathlib import Path

import numpy as np
import torch
from scipy.stats import binomtest

from common import (UserError, command_parser, json_text, parse_list, parse_number, run_cli, shared_values,
                    write_atomic)
from data.dataset import held_out, load_meta, load_split
from data.tokenizer import run_tokenizer
from eval.report import line_style, png, pyplot
from eval.score import score_rows
from lab.crop import score_cropped
from lab.pages import generated, interval_text
from lab.swap import final_nll, method, swap_prefix
from lab.stats import interval
from runfolder import load_checkpoint
from runtime import autocast, load_run, model_from_checkpoint

TASK = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. I will quiz "
        "you about the important information there.")
GARBAGE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = "What is the pass key? The pass key is"
STAGES = ("passkey", "loss", "bojone")
DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)


def default_methods(L):
    """Every method the issue reads, with the published settings' ratios (ReRoPE's and Self-Extend's window L/4, as
    bojone's 1,024 of 4k): the order is the order of the work, the field's question first."""
    w = L // 4
    return ["none", "crop", "yarn", "ntk", f"self-extend:window={w}", f"rerope:window={w}+logn", "dynamic-ntk", "pi",
            "llama3", f"rerope:window={w}", "ntk-mixed+logn"]


def passkey_row(encode, n, depth, key):
    """(tokens [n + 1] of the YaRN prompt with the key's line at `depth` of the filler, the key's token count)."""
    parts = [encode(TASK + "\n"), None, encode("\n" + NEEDLE.format(key=key) + "\n"), None,
             encode("\n" + QUESTION), encode(f" {key}")]
    garbage = encode(" ".join([GARBAGE] * (n // 10 + 10)))
    room = n + 1 - sum(len(p) for p in parts if p is not None)
    if room < 0:
        raise UserError(f"a passkey prompt of {n} tokens is shorter than its task, key and question")
    at = round(depth * room)
    parts[1], parts[3] = garbage[:at], garbage[:room - at]
    return np.concatenate([np.asarray(p, dtype=np.int64) for p in parts]), len(parts[-1])


def is_crop(spec):
    return spec.split(":")[0] == "crop"


def crop_stride(spec, default, L):
    """A crop's stride, at most L: 'crop' the folder's (--crop_stride), 'crop:stride=S' S."""
    key, _, value = spec.partition(":")[2].partition("=")
    if key not in ("", "stride"):
        raise UserError(f"unknown setting {key!r} of --methods {spec}; allowed: crop:stride=S")
    return parse_number(value if key else str(default), "methods crop:stride" if key else "crop_stride", int, 1, L)


def score(model, row, spec, L, last, rotary_dim, default_stride, dtype):
    """(NLL, hit) of the last `last` targets of one row under a method (crop: strided, score_cropped)."""
    if is_crop(spec):
        return score_cropped(model, row[None], last, L, crop_stride(spec, default_stride, L), dtype)
    how = method(spec, L, model.config.block_size, len(row) - 1, rotary_dim, None)
    return score_rows(model, row[None], last=last, method=how, dtype=dtype)


class Items:
    """OUT/items/<name>.json, one per reading, written atomically as each lands."""

    def __init__(self, out):
        self.folder = Path(out) / "items"
        self.folder.mkdir(parents=True, exist_ok=True)

    def get(self, name, compute):
        path = self.folder / (name.replace("/", "__") + ".json")
        if path.is_file():
            return json.loads(path.read_text())
        t0 = time.time()
        value = dict(compute(), seconds=round(time.time() - t0, 1))
        write_atomic(path, lambda f: f.write((json_text(value) + "\n").encode()))
        print(f"{name}: {value['seconds']} s", flush=True)
        return value

    def all(self):
        return {p.stem.replace("__", "/"): json.loads(p.read_text()) for p in sorted(self.folder.glob("*.json"))}


def passkey_key(k, depth, trial):
    """A trial's key, drawn from its length, depth and trial alone, so that reading more lengths, depths or trials
    (a resumed run) leaves every landed item's key as it was."""
    return int(np.random.default_rng([round(1000 * k), DEPTHS.index(depth), trial]).integers(1, 50001))


def passkey_items(items, model, encode, L, a, rotary_dim):
    for k in a.lengths:
        n = round(k * L)
        for t in range(a.trials):
            rows = {depth: passkey_row(encode, n, depth, passkey_key(k, depth, t)) for depth in a.depths}
            for spec in (m for m in a.methods if k > 1 or m in a.at_1x):
                for depth, (row, m) in rows.items():

                    def compute():
                        nll, hit = score(model, row, spec, L, m, rotary_dim, a.crop_stride, a.dtype)
                        return dict(exact=bool(hit.all()), logp=-float(nll.sum()))
                    items.get(f"passkey/{spec}@{k:g}x/d{depth:g}/t{t}", compute)


def loss_items(items, model, tokens, docs, L, a, rotary_dim):
    for k in a.lengths:
        n = round(k * L)
        usable = [d for d in docs if d[1] - d[0] >= n + 1][:a.units]
        for i, (s, _) in enumerate(usable):
            row = tokens[s:s + n + 1].astype(np.int64)
            for spec in (m for m in a.methods if k > 1 or m in a.at_1x):
                last = n - L if is_crop(spec) else n  # crop differs from the whole window only past L

                def compute():
                    nll = score(model, row, spec, L, last, rotary_dim, a.crop_stride, a.dtype)[0][0]
                    return dict(nll=np.round(nll.astype(float), 4).tolist(), doc=int(s))
                if not is_crop(spec) or n > L:
                    items.get(f"loss/{spec}@{k:g}x/u{i}", compute)


def unit_donors(count, pool):
    """The donor of each of the first `count` units: another of the `pool` usable documents, drawn from the unit's
    index alone, so that reading more units (--units) leaves every landed unit's swapped arm as it was."""
    return [int(np.random.default_rng([1, i]).choice([j for j in range(pool) if j != i])) for i in range(count)]


def bojone_items(items, model, tokens, docs, L, a, rotary_dim, eot):
    k = max(a.lengths)
    n = round(k * L)
    usable = [d for d in docs if d[1] - d[0] >= n + 1 + L]  # at least L into the document, as lab/protocols.py
    pool = [int(d[1]) for d in usable]  # each document's last kL + 1 tokens
    ends = pool[:a.units]
    if len(ends) < 2:
        raise UserError(f"bojone's protocol at {k:g}L needs two documents of {n + 1 + L} tokens; {len(ends)} found")
    last = lambda e: tokens[e - n - 1:e].astype(np.int64)
    units = np.stack([last(e) for e in ends])
    swapped = swap_prefix(units, np.stack([last(pool[j]) for j in unit_donors(len(ends), len(pool))]), L, eot)
    # the own-document control where the document holds kL more tokens: the prefix from kL further back
    own = [swap_prefix(units[i:i + 1], tokens[None, e - 2 * n - 1:e - n], L)[0] if e - 2 * n - 1 >= d[0] else None
           for i, (e, d) in enumerate(zip(ends, usable))]
    for i in range(len(units)):
        for crop in a.crops:  # the same on both arms
            items.get(f"bojone/{crop}/u{i}", lambda: dict(
                nll=float(score(model, units[i], crop, L, L, rotary_dim, a.crop_stride, a.dtype)[0].mean())))
        arms = [("same", units[i]), ("swapped", swapped[i])] + ([("own", own[i])] if own[i] is not None else [])
        for spec in (m for m in a.methods if not is_crop(m)):
            for arm, row in arms:
                for j in (1, k):
                    if j == 1 and arm != "same":
                        continue  # nothing is swapped in the last L + 1 tokens: the null is zero by construction
                    items.get(f"bojone/{arm}/{spec}@{j:g}L/u{i}", lambda: dict(
                        nll=float(final_nll(model, row[None], spec, L, j, k, rotary_dim, a.dtype)[0])))


def tensors_id(state):
    """The first 16 hex digits of the sha256 of the weights as loaded (names, shapes, bytes): the same model converted
    into another run folder (another dataset named) keeps its id, so its readings stay its own."""
    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name].detach().cpu().contiguous()
        h.update(f"{name}{tuple(t.shape)}{t.dtype}".encode())
        h.update(t.view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def binned(nll, width=256):
    """A loss item's per-target NLL as means of `width` targets (the last bin shorter): the page's JSON; every
    target's stays in OUT/items."""
    return [round(float(np.mean(nll[i:i + width])), 4) for i in range(0, len(nll), width)]


def parse(argv):
    p = command_parser(__doc__, "device")
    p.add_argument("run", help="a converted run folder (python pretrained.py MODEL --out RUN --dataset NAME)")
    p.add_argument("--out", required=True, help="the readings' folder: items land in OUT/items")
    p.add_argument("--stages", default=",".join(STAGES), help=f"which, in this order: {', '.join(STAGES)}")
    p.add_argument("--methods", default="auto", help="methods (lab/protocols.py's names; auto: default_methods)")
    p.add_argument("--at_1x", default="none,self-extend,rerope", help="the methods read at 1x too, by name "
                   "(the others, log-n and crop equal none there)")
    p.add_argument("--lengths", default="1,2", help="multiples of L (bojone: the largest, with 1)")
    p.add_argument("--trials", default="1", help="passkey trials per length and depth")
    p.add_argument("--depths", default=",".join(f"{d:g}" for d in DEPTHS), help="passkey depths read, of those")
    p.add_argument("--units", default="8", help="documents (loss) and units (bojone) read, at most")
    p.add_argument("--crop_stride", default="auto", help="crop's stride in targets, at most L (1: exact, one forward a "
                   "target; auto: L/8)")
    p.add_argument("--docs", default="test", help="held-out documents: dev or test")
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                   help="the forwards' (auto: bfloat16 on CUDA, float32 on CPU); a folder of readings holds one")
    p.add_argument("--page", default=None, help="write the page (markdown, with .json and .png beside) from the items")
    a = p.parse_args(argv)
    a.lengths = parse_list(a.lengths, "lengths", float)
    a.depths = parse_list(a.depths, "depths", float, tuple(f"{d:g}" for d in DEPTHS))
    a.trials, a.units = parse_number(a.trials, "trials", int, 1), parse_number(a.units, "units", int, 1)
    a.crop_stride = None if a.crop_stride == "auto" else parse_number(a.crop_stride, "crop_stride", int, 1)
    a.stages = parse_list(a.stages, "stages", str, STAGES)
    a.device = shared_values(a)["device"]
    if a.docs not in ("dev", "test"):
        raise UserError(f"unknown --docs {a.docs!r}; allowed: dev, test")
    return a


def main(argv):
    a = parse(argv)
    run = Path(a.run)
    text = {"loss", "bojone"} & set(a.stages) and not a.page  # the passkey prompt needs no held-out text
    if text:
        model, ckpt, data_dir, _ = load_run(run, a.device)
    else:
        ckpt = load_checkpoint(run, a.device)
        model = model_from_checkpoint(ckpt).to(a.device).eval()
    L, rotary_dim = model.config.train_len, model.config.rotary_dim
    a.methods = default_methods(L) if a.methods == "auto" else parse_list(a.methods, "methods", str)
    a.at_1x = [m for m in a.methods if m.split(":")[0] in a.at_1x.split(",") and "+logn" not in m]
    a.crop_stride = a.crop_stride or max(1, L // 8)
    a.crops = list(dict.fromkeys(m for m in ["crop", *a.methods] if is_crop(m)))  # bojone reads the folder's always
    for spec in a.crops:
        crop_stride(spec, a.crop_stride, L)  # a bad stride refused before anything is written
    tokenizer = run_tokenizer(ckpt)
    out = Path(a.out) / a.docs
    known = out / "ids.json"
    if a.page and known.is_file():  # the page says the dtype its readings were read in, wherever it is written
        a.dtype = json.loads(known.read_text()).get("dtype", a.dtype)
    a.dtype = autocast(a.dtype, next(model.parameters()).device.type)[0]
    ids = dict(weights=tensors_id(ckpt["model"]), tokenizer=getattr(tokenizer, "identity", None), docs=a.docs,
               crop_stride=a.crop_stride, dtype=a.dtype)
    out.mkdir(parents=True, exist_ok=True)
    if known.is_file() and json.loads(known.read_text()) != ids:
        raise UserError(f"{out} holds readings of other weights or options ({known}); use another --out")
    write_atomic(known, lambda f: f.write((json_text(ids) + "\n").encode()))
    items = Items(out)
    if a.page:
        return write_report(items.all(), L, a, ckpt, " ".join(["python lab/long_context.py", *map(shlex.quote, argv)]))
    tokens, docs = load_split(data_dir, "val") if text else (None, None)
    docs = held_out(docs, a.docs) if text else None
    for stage in a.stages:
        if stage == "passkey":
            passkey_items(items, model, tokenizer.encode_ordinary, L, a, rotary_dim)
        elif stage == "loss":
            loss_items(items, model, tokens, docs, L, a, rotary_dim)
        else:
            bojone_items(items, model, tokens, docs, L, a, rotary_dim, load_meta(data_dir)["eot_token"])


# ----------------------------------------------------------------------------- the page


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
        for spec in (m for m in methods if f"{m}@{key}" in got):
            units = {u: np.asarray(v["nll"]) for u, v in got[f"{spec}@{key}"]}
            style = {**line_style(spec), **({"ls": ":"} if "+logn" in spec else {})}  # ReRoPE's two told apart
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


def write_report(found, L, a, ckpt, command):
    grid, losses = passkey_grid(found, a.methods), bool(collect(found, "loss"))
    page = Path(a.page)
    heatmap, curves = page.with_suffix(".png"), page.with_name(page.stem + "_loss.png")
    lines = [f"# A real model read past its trained length: {Path(a.run).name}\n", f"{generated(command)}\n",
             f"The model: {source(ckpt, a.run)}, trained at L = {L:,}, read in {a.dtype}. The text: the {a.docs} "
             f"half of the held-out documents. Crop is strided at {a.crop_stride:,}: each target past L from "
             f"{L - a.crop_stride + 1:,} to {L:,} tokens. Settings as published, not chosen here: ReRoPE's and "
             "Self-Extend's window L/4 (bojone's 1,024 of 4k), Self-Extend's group the smallest whose grouped "
             "distances stay inside L, every scaling at the length's factor (passkey and loss) or the longest "
             "input's (bojone). Each cell counts the items it rests on; intervals are 95%, bootstrap over documents.\n",
             "## Passkey (greedy exact match, teacher-forced)\n",
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
    if grid:
        lines += ["", f"![passkey, accuracy by length and depth]({heatmap.name})"]
    lines += ["", "## Loss by position against crop"] + loss_table(found, L, a.methods)
    if losses:
        lines += ["", f"![loss by position]({curves.name})"]
    lines += ["", "## bojone's protocol with the swap that leaves crop untouched\n",
              "The final L targets of each unit (one a document, its last kL + 1 tokens); the swapped arm's tokens "
              "more than L before the first final target come from another document (an end-of-text token at the "
              "splice), so crop is the same on both arms. Reads past L negative: the method gains from the tokens more "
              "than L back that the swap replaces (those before every final target's window; what it reads from a "
              "later target's real tokens more than L back falls in its distortion). The own-document control, where "
              "the document holds kL more tokens, takes them from its own text kL further back (no end-of-text "
              "token): own text and splice split reads past L in two.\n"]
    lines += bojone_table(found, a.methods)
    for spec in (m for m in a.methods if is_crop(m) and m != "crop"):
        lines += another_crop(found, L, a, spec)
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


if __name__ == "__main__":
    run_cli("long_context.py", lambda: main(sys.argv[1:]))
