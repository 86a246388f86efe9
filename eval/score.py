"""Every evaluation scores through score_rows, so "the loss at position p" means the same thing everywhere."""
import math

import numpy as np
import torch
from torch.nn import functional as F

from common import UserError
from data.dataset import doc_windows
from positions import AS_TRAINED
from runtime import autocast


def score_windows(model, tokens, starts, length, tokens_per_batch=16384, last=None, method=AS_TRAINED):
    rows = np.stack([tokens[s:s + length + 1] for s in starts])  # starts from doc_windows: they fit
    return score_rows(model, rows, tokens_per_batch, last, method)[0]


@torch.no_grad()
def score_rows(model, rows, tokens_per_batch=16384, last=None, method=AS_TRAINED, dtype="auto"):
    """(NLL [N, m] float64, top-1 hit [N, m] bool) of the last m = last (default all n) targets of rows
    [N, n+1]. crop is done here, for every command: a row is cut to its last crop tokens."""
    rows = np.asarray(rows, dtype=np.int64)
    if method.crop and rows.shape[1] - 1 > method.crop:
        rows, last = rows[:, -(method.crop + 1):], min(last or method.crop, method.crop)
    N, n, device = rows.shape[0], rows.shape[1] - 1, next(model.parameters()).device
    batch, m = max(1, tokens_per_batch // n), last or n
    nll, hit = np.empty((N, m), dtype=np.float64), np.empty((N, m), dtype=bool)
    for i in range(0, N, batch):
        chunk = torch.from_numpy(rows[i:i + batch]).to(device)
        with autocast(dtype, device.type)[1]:  # auto: bf16 on CUDA if supported, float32 on CPU
            # the head only over the targets asked for: a strided crop reads few of them
            logits, _ = model(chunk[:, :-1], last=m, method=method)
        y = chunk[:, -m:]  # per token, in float32 as the model's own loss
        loss = F.cross_entropy(logits.float().transpose(1, 2), y, reduction="none")
        nll[i:i + len(chunk)] = loss.double().cpu().numpy()
        hit[i:i + len(chunk)] = (logits.argmax(-1) == y).cpu().numpy()
    return nll, hit


def sliding_windows(n, length, stride):
    # (start in a stretch of n tokens, last targets scored) per sliding window: every target once
    if not 1 <= stride <= length <= n:
        raise UserError(f"sliding protocol needs 1 <= stride <= length <= stretch, got stride {stride}, "
                         f"length {length}, stretch {n}")
    ends = list(range(length, n, stride)) + [n]
    return [(e - length, e - prev) for prev, e in zip([0] + ends, ends)]


def score_sliding(model, tokens, start, n, length, stride, method=AS_TRAINED):
    # NLL [n] of targets tokens[start+1 .. start+n]: the first window scores all its targets, others the last
    plan = sliding_windows(n, length, stride)
    later = [start + s for s, _ in plan[1:]]
    nll = [*score_windows(model, tokens, [start + plan[0][0]], length, method=method),
           *(score_windows(model, tokens, later, length, last=stride, method=method) if later else [])]
    return np.concatenate([row[len(row) - k:] for row, (_, k) in zip(nll, plan)])


def choose_units(docs, protocol, eval_len, tokens, min_units, seed):
    # (unit length, starts) for every method: windows, or sliding stretches of >= 2 windows
    longest = int((docs[:, 1] - docs[:, 0]).max()) - 1 if len(docs) else 0  # room for the shifted target
    n = eval_len if protocol == "windows" else max(eval_len, min(max(2 * eval_len, tokens // 4), longest))
    try:
        return n, doc_windows(docs, n + 1, max(min_units, math.ceil(tokens / n)), np.random.default_rng(seed))
    except UserError as e:
        raise UserError(f"length {eval_len}, {protocol} protocol (units of {n + 1} tokens): {e}") from None


def score_units(model, tokens, starts, n, protocol, eval_len, stride, method, crop_stride):
    # NLL [units, n] of every target of every unit, in order
    if method.crop:  # truncation of every target: windows of crop at positions 0.., crop_stride apart
        crop, stride = min(method.crop, n), min(crop_stride, method.crop, n)
        return np.stack([score_sliding(model, tokens, s, n, crop, stride) for s in starts])
    if protocol == "sliding":
        return np.stack([score_sliding(model, tokens, s, n, eval_len, stride, method) for s in starts])
    return score_windows(model, tokens, starts, n, method=method)
