"""Synthetic retrieval sequences: random tokens repeated `distance` tokens later, or key-value pairs recalled (MQAR).
Mixed into training batches (train.py's retrieval_mix, retrieval_task) they teach a small model to copy (an induction
head); lab/probes.py asks how far it still copies."""
import numpy as np

from data.dataset import doc_windows
from runtime import UserError


def plant_repeat(row, segment, start, distance):
    """Write segment at row[start:] and again at row[start + distance:] (in place)."""
    k = len(segment)
    if distance < k:
        raise UserError(f"distance {distance} is shorter than the segment ({k} tokens): the copies would overlap")
    if start < 0 or start + distance + k > len(row):
        raise UserError(f"a segment of {k} at {start} repeated at distance {distance} does not fit in {len(row)} tokens")
    row[start:start + k] = segment
    row[start + distance:start + distance + k] = segment


def random_vocab(retrieval_vocab, vocab_size):
    """How many ids random segments draw from: retrieval_vocab (0: all) but never EOT, a vocabulary's last id."""
    return min(retrieval_vocab or vocab_size - 1, vocab_size - 1)


def copy_chunk_row(rng, n, vocab, longest):
    """n tokens of chunks of uniform length 2..longest, each (once there is room) with probability 1/2 a copy
    of an earlier stretch of the row (uniform start: every distance up to n is practised), else uniform ids
    < vocab. No fixed offset predicts so many repeats: the model has to match content (an induction head)."""
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
    """Replace the first round(fraction * B) rows of a [B, T+1] batch of text by copy_chunk_row rows (in place)."""
    for row in rows[:round(fraction * len(rows))]:
        row[:] = copy_chunk_row(rng, len(row), vocab, longest)


def copy_rows(filler, rng, segment, distances, vocab, segments=None):
    """Copy probe rows: filler [N, n] (a row per distance) with a random segment whose second copy ends the row,
    `distance` tokens after the first. Targets: its tokens 1..segment-1 (the first cannot be known), at n-segment .. n-2.
    segments [N, segment]: plant these (e.g. stretches of held-out text) instead of uniform ids < vocab."""
    rows = np.array(filler, dtype=np.int64)  # a copy: the filler may be a read-only memmap
    for i, (row, d) in enumerate(zip(rows, np.asarray(distances, dtype=np.int64).tolist())):
        seg = rng.integers(0, vocab, size=segment) if segments is None else segments[i]  # None: the rng draws as before
        plant_repeat(row, seg, len(row) - segment - d, d)
    return rows


def mqar_rows(filler, rng, pairs, vocab, at):
    """Multi-query associative recall (Zoology, Arora et al. 2023) rows: filler [N, n] (copied) with `pairs` distinct keys
    < vocab // 2 at 0, 2, 4, ..., each followed by its value (distinct, in vocab // 2 .. vocab - 1: a disjoint range, so
    a value is never mistaken for a key), and the keys asked again in a random order (a block asked in order would be
    a plain copy) at positions at [N, pairs], each followed by its value. Returns (rows, mask [N, n]): True exactly at
    the values after the queries, the only tokens a model can know; what lies between is the filler, untouched."""
    rows, at = np.array(filler, dtype=np.int64), np.asarray(at, dtype=np.int64).reshape(len(filler), pairs)
    if not 1 <= pairs <= vocab // 2:
        raise UserError(f"{pairs} key-value pairs need 1 <= pairs <= vocab // 2 = {vocab // 2}")
    if (at[:, 0] < 2 * pairs).any() or (at[:, -1] + 1 >= rows.shape[1]).any() or (np.diff(at) < 2).any():
        raise UserError(f"queries at {at.tolist()} must follow the {2 * pairs} tokens of pairs, increase by >= 2 "
                         f"and leave room for their values in {rows.shape[1]} tokens")
    mask = np.zeros(rows.shape, dtype=bool)
    for row, where, m in zip(rows, at, mask):
        keys = rng.choice(vocab // 2, pairs, replace=False)
        values = vocab // 2 + rng.choice(vocab - vocab // 2, pairs, replace=False)
        row[0:2 * pairs:2], row[1:2 * pairs:2] = keys, values
        order = rng.permutation(pairs)
        row[where], row[where + 1], m[where + 1] = keys[order], values[order], True
    return rows, mask


def mqar_batch(rng, count, n, pairs, vocab):
    """`count` training MQAR rows of n tokens: distractors uniform ids < vocab (the keys' and values' own distribution,
    as Zoology's), queries at two-token slots after the pairs drawn uniformly (Zoology: a power law favouring short
    gaps) so that every distance up to n is practised. Returns mqar_rows' (rows, mask)."""
    slots = (n - 2 * pairs) // 2  # the last slot's value is the row's last token at most
    if slots < pairs:
        raise UserError(f"{pairs} key-value pairs and their queries need {4 * pairs} tokens, a row has {n}")
    at = [2 * pairs + 2 * np.sort(rng.choice(slots, pairs, replace=False)) for _ in range(count)]
    return mqar_rows(rng.integers(0, vocab, size=(count, n)), rng, pairs, vocab, at)


def mix_mqar(rows, rng, fraction, pairs, vocab):
    """Replace the first round(fraction * B) rows of a [B, T+1] batch of text by mqar_batch rows (in place)."""
    m = round(fraction * len(rows))
    rows[:m] = mqar_batch(rng, m, rows.shape[1], pairs, vocab)[0]


NEEDLE = " The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = " What is the pass key? The pass key is"
KEY_DIGITS = 5  # a uniform guess of the key is right with probability 10^-5: the chance level


def passkey_row(filler, encode, key, depth):
    """(one passkey trial of len(filler) + 1 tokens, its number of key tokens at the end): held-out text with the
    needle stating the key at `depth` (0: first, 1: just before the question), then the question and the key."""
    if not 0 <= depth <= 1:
        raise UserError(f"depth {depth!r} is outside [0, 1] (the fraction of the filler before the key)")
    needle, ask, answer = (encode(t) for t in (NEEDLE.format(key=key), QUESTION, f" {key}"))
    room = len(filler) + 1 - len(needle) - len(ask) - len(answer)  # filler tokens that fit around them
    if room < 0:
        raise UserError(f"a passkey trial of {len(filler)} tokens is shorter than its needle, question and key "
                         f"({len(needle) + len(ask) + len(answer)} tokens); use a longer length")
    at = round(depth * room)
    return np.concatenate([filler[:at], needle, filler[at:room], ask, answer]).astype(np.int64), len(answer)


def copy_trials(tokens, docs, L, args, vocab):
    """(distance d, rows [trials, d + segment + 1]) per --distances multiple of L: the copy probe's trials, the same
    for every run on the same data and options (its seeds), so a study can pair them."""
    k, rng = args["segment"], np.random.default_rng(args["seed"])
    for mult in args["distances"]:
        d = max(k, round(mult * L))
        n = d + k  # the first copy starts one token in: position 1 .. k, the second ends the window
        filler = np.stack([tokens[s:s + n + 1] for s in doc_windows(docs, n + 1, args["trials"], rng)])
        segments = (None if args.get("copy_source", "random") == "random"  # text: the filler's own distribution
                    else np.stack([tokens[s:s + k] for s in doc_windows(docs, k, len(filler), rng)]))
        yield d, copy_rows(filler, rng, k, [d] * len(filler), vocab, segments)
