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
import shlex
import sys
import time
from pathlib import Path

import numpy as np
import torch

from common import (UserError, command_parser, json_text, parse_list, parse_number, run_cli, shared_values,
                    write_atomic)
from data.dataset import held_out, load_meta, load_split
from data.tokenizer import run_tokenizer
from eval.score import score_rows
from lab.crop import score_cropped
from lab.swap import final_nll, method, swap_prefix
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
    for spec in a.crops:  # a bad method or setting refused before anything is written
        crop_stride(spec, a.crop_stride, L)
    for spec, k in ((m, k) for m in a.methods if not is_crop(m) for k in a.lengths):
        method(spec, L, model.config.block_size, round(k * L), rotary_dim, None)
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
        from lab.long_context_page import write_report  # matplotlib and scipy only for a page

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


if __name__ == "__main__":
    run_cli("long_context.py", lambda: main(sys.argv[1:]))
