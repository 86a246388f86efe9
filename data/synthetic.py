"""Synthetic retrieval sequences: random tokens repeated `distance` tokens later. Mixed into training batches (train.py's
retrieval_mix) they teach a small model to copy (an induction head); eval/probes.py asks how far it still copies."""
import numpy as np


def plant_repeat(row, segment, start, distance):
    """Write segment at row[start:] and again at row[start + distance:] (in place)."""
    k = len(segment)
    if distance < k:
        raise ValueError(f"distance {distance} is shorter than the segment ({k} tokens): the copies would overlap")
    if start < 0 or start + distance + k > len(row):
        raise ValueError(f"a segment of {k} at {start} repeated at distance {distance} does not fit in {len(row)} tokens")
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


def copy_rows(filler, rng, segment, distances, vocab):
    """Copy probe rows: filler [N, n] (a row per distance) with a random segment whose second copy ends the row,
    `distance` tokens after the first. Targets: its tokens 1..segment-1 (the first cannot be known), at n-segment .. n-2."""
    rows = np.array(filler, dtype=np.int64)  # a copy: the filler may be a read-only memmap
    for row, d in zip(rows, np.asarray(distances, dtype=np.int64).tolist()):
        plant_repeat(row, rng.integers(0, vocab, size=segment), len(row) - segment - d, d)
    return rows


NEEDLE = " The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = " What is the pass key? The pass key is"
KEY_DIGITS = 5  # a uniform guess of the key is right with probability 10^-5: the chance level


def passkey_row(filler, encode, key, depth):
    """(one passkey trial of len(filler) + 1 tokens, its number of key tokens at the end): held-out text with the
    needle stating the key at `depth` (0: first, 1: just before the question), then the question and the key."""
    if not 0 <= depth <= 1:
        raise ValueError(f"depth {depth!r} is outside [0, 1] (the fraction of the filler before the key)")
    needle, ask, answer = (encode(t) for t in (NEEDLE.format(key=key), QUESTION, f" {key}"))
    room = len(filler) + 1 - len(needle) - len(ask) - len(answer)  # filler tokens that fit around them
    if room < 0:
        raise ValueError(f"a passkey trial of {len(filler)} tokens is shorter than its needle, question and key "
                         f"({len(needle) + len(ask) + len(answer)} tokens); use a longer length")
    at = round(depth * room)
    return np.concatenate([filler[:at], needle, filler[at:room], ask, answer]).astype(np.int64), len(answer)
