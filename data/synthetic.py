"""Synthetic retrieval rows: random tokens repeated later (copy), or key-value pairs recalled (MQAR). Mixed
into training batches (retrieval_mix) they teach a small model to copy; lab/probes.py asks how far."""
import numpy as np

from common import UserError
from data.dataset import get_rows


def plant_repeat(row, segment, start, distance):
    """Write segment at row[start:] and again `distance` tokens later (in place)."""
    k = len(segment)
    if distance < k:
        raise UserError(f"distance {distance} is shorter than the segment ({k} tokens): the copies would "
                        "overlap")
    if start < 0 or start + distance + k > len(row):
        raise UserError(f"a segment of {k} at {start} repeated at distance {distance} does not fit in "
                        f"{len(row)} tokens")
    row[start:start + k] = row[start + distance:start + distance + k] = segment


def random_vocab(retrieval_vocab, vocab_size):
    """How many ids random segments draw from: retrieval_vocab (0: all), never EOT (the last id)."""
    return min(retrieval_vocab or vocab_size - 1, vocab_size - 1)


def copy_chunk_row(rng, n, vocab, longest):
    """n tokens in chunks of 2..longest, each (once there is room) with probability 1/2 a copy of an earlier
    stretch, from anywhere (every distance is practised), else random ids. No fixed offset predicts so many
    repeats: the model has to match content (an induction head)."""
    row, at = np.empty(n, dtype=np.int64), 0
    while at < n:
        k = min(int(rng.integers(2, longest + 1)), n - at)
        if at >= k and rng.random() < 0.5:
            src = int(rng.integers(0, at - k + 1))
            row[at:at + k] = row[src:src + k]
        else:
            row[at:at + k] = rng.integers(0, vocab, size=k)
        at += k
    return row


def mix_copies(rows, rng, fraction, longest, vocab):
    for row in rows[:round(fraction * len(rows))]:
        row[:] = copy_chunk_row(rng, len(row), vocab, longest)


def copy_rows(filler, rng, segment, distances, vocab, segments=None):
    """Copy probe rows: filler [N, n] (copied: it may be a read-only memmap), a row per distance, with a
    segment (random ids, or segments[i]) whose second copy ends the row."""
    rows = np.array(filler, dtype=np.int64)
    for i, (row, d) in enumerate(zip(rows, np.asarray(distances, dtype=np.int64).tolist())):
        seg = rng.integers(0, vocab, size=segment) if segments is None else segments[i]
        plant_repeat(row, seg, len(row) - segment - d, d)
    return rows


def mqar_rows(filler, rng, pairs, vocab, at):
    """Multi-query associative recall rows (Zoology, Arora et al. 2023): filler [N, n] (copied) with `pairs`
    keys < vocab // 2, each followed by its value (>= vocab // 2: never taken for a key), then the keys asked
    again in random order (in order it would be a plain copy) at positions at [N, pairs], each followed by
    its value. Returns (rows, mask): True exactly at those values, the only tokens a model can know."""
    rows, at = np.array(filler, dtype=np.int64), np.asarray(at, dtype=np.int64).reshape(len(filler), pairs)
    if not 1 <= pairs <= vocab // 2:
        raise UserError(f"{pairs} key-value pairs need 1 <= pairs <= vocab // 2 = {vocab // 2}")
    if (at[:, 0] < 2 * pairs).any() or (at[:, -1] + 1 >= rows.shape[1]).any() or (np.diff(at) < 2).any():
        raise UserError(f"queries at {at.tolist()} must follow the {2 * pairs} tokens of pairs, increase by "
                        f">= 2 and leave room for their values in {rows.shape[1]} tokens")
    mask = np.zeros(rows.shape, dtype=bool)
    for row, where, m in zip(rows, at, mask):
        keys = rng.choice(vocab // 2, pairs, replace=False)
        values = vocab // 2 + rng.choice(vocab - vocab // 2, pairs, replace=False)
        row[0:2 * pairs:2], row[1:2 * pairs:2] = keys, values
        order = rng.permutation(pairs)
        row[where], row[where + 1], m[where + 1] = keys[order], values[order], True
    return rows, mask


def mqar_batch(rng, count, n, pairs, vocab):
    """`count` training MQAR rows of n tokens: the filler random ids (as Zoology's), the queries at slots
    drawn uniformly (Zoology: a power law favouring short gaps), so that every distance is practised."""
    slots = (n - 2 * pairs) // 2  # the last slot's value is the row's last token at most
    if slots < pairs:
        raise UserError(f"{pairs} key-value pairs and their queries need {4 * pairs} tokens, a row has {n}")
    at = [2 * pairs + 2 * np.sort(rng.choice(slots, pairs, replace=False)) for _ in range(count)]
    return mqar_rows(rng.integers(0, vocab, size=(count, n)), rng, pairs, vocab, at)


def mix_mqar(rows, rng, fraction, pairs, vocab):
    m = round(fraction * len(rows))
    rows[:m] = mqar_batch(rng, m, rows.shape[1], pairs, vocab)[0]


def mix_retrieval(rows, rng, config, vocab):
    """Replace retrieval_mix of a batch's rows [B, T + 1] by retrieval_task's (in place)."""
    if config["retrieval_mix"] and config["retrieval_task"] == "mqar":
        mix_mqar(rows, rng, config["retrieval_mix"], config["retrieval_segment"] // 2, vocab)
    elif config["retrieval_mix"]:
        mix_copies(rows, rng, config["retrieval_mix"], config["retrieval_segment"], vocab)


def retrieval_check(rng, config, count, T, val_tokens, vocab):
    """(metric, rows [count, T + 1], known: the tokens a model can know) that training scores top-1 on: MQAR
    rows (mqar_acc), or held-out text with a segment repeated at distances over the window (copy_top1)."""
    if config["retrieval_task"] == "mqar":
        return ("mqar_acc", *mqar_batch(rng, count, T + 1, config["retrieval_segment"] // 2, vocab))
    k = config["retrieval_segment"]
    distances = np.linspace(k, T + 1 - k, count).round()
    rows = copy_rows(get_rows(val_tokens, count, T, rng), rng, k, distances, vocab)
    known = np.zeros(rows.shape, dtype=bool)
    known[:, -(k - 1):] = True
    return "copy_top1", rows, known
