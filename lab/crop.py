"""Exact crop: every target predicted from exactly its own last `context` tokens (stride 1), for the lab's
protocols and context sweep; the evaluation's crop (eval/score.py) strides its windows."""
import numpy as np

from eval.score import score_rows


def score_cropped(model, rows, last, context):
    """(NLL, top-1 hit) [N, last] of the last `last` targets of token rows [N, n+1], each predicted from
    exactly its own last `context` tokens at positions 0 .. context - 1 (fewer where the row holds fewer):
    exact crop, stride 1."""
    rows = np.asarray(rows, dtype=np.int64)
    n = rows.shape[1] - 1
    first = n - last  # index of the first target asked for, in 0 .. n - 1 (target j is rows[:, j + 1])
    short = min(n, context)  # targets 0 .. short - 1 see their whole row prefix: one window from position 0
    parts = []
    if first < short:
        nll, hit = score_rows(model, rows[:, :short + 1], last=short - first)
        parts.append((nll, hit))
    # targets lo .. n - 1, each with a window of context + 1 tokens ending at it
    if (lo := max(first, context)) < n:
        windows = np.lib.stride_tricks.sliding_window_view(rows, context + 1, axis=1)[:, lo - context + 1:]
        nll, hit = score_rows(model, windows.reshape(-1, context + 1), last=1)
        parts.append((nll.reshape(len(rows), -1), hit.reshape(len(rows), -1)))
    return tuple(np.concatenate(p, axis=1) for p in zip(*parts))
