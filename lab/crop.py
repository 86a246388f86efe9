"""Crop for the lab's protocols and context sweep: every target predicted from exactly its own last `context` tokens
(stride 1), or strided where exact crop is too dear (a real model's 8,192 tokens a target)."""
import numpy as np

from eval.score import score_rows


def score_cropped(model, rows, last, context, stride=1, dtype="auto"):
    """(NLL, top-1 hit) [N, last] of the last `last` targets of token rows [N, n+1], each predicted from its own
    last tokens at positions 0 .. context - 1 (fewer where the row holds fewer): exact crop at stride 1; at
    stride S each window of context tokens scores its last S targets, so a target sees context - S + 1 to
    context tokens."""
    rows = np.asarray(rows, dtype=np.int64)
    n = rows.shape[1] - 1
    first = n - last  # index of the first target asked for, in 0 .. n - 1 (target j is rows[:, j + 1])
    short = min(n, context)  # targets 0 .. short - 1 see their whole row prefix: one window from position 0
    parts = []
    if first < short:
        parts.append(score_rows(model, rows[:, :short + 1], last=short - first, dtype=dtype))
    # targets lo .. n - 1 in blocks counted back from the last: the block ending at e holds targets
    # e - stride .. e - 1 (the first block maybe fewer)
    lo = max(first, context)
    ends = list(range(n, lo, -stride))[::-1]
    if ends and (head := ends[0] - lo) < stride:
        parts.append(window_block(model, rows, ends.pop(0), context, head, dtype))
    if ends:
        parts.append(window_block(model, rows, ends, context, stride, dtype))
    return tuple(np.concatenate(p, axis=1) for p in zip(*parts))


def window_block(model, rows, ends, context, k, dtype):
    """(NLL, hit) [N, k * len(ends)]: the k targets before each end, each from the context tokens before it."""
    ends = np.atleast_1d(ends)
    windows = np.stack([rows[:, e - context:e + 1] for e in ends], axis=1).reshape(-1, context + 1)
    nll, hit = score_rows(model, windows, last=k, dtype=dtype)
    return nll.reshape(len(rows), -1), hit.reshape(len(rows), -1)
