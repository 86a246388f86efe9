"""
Synthetic retrieval sequences: a segment of random tokens planted in text and repeated `distance` tokens
later. Mixed into training batches (train.py's retrieval_mix) they teach a small model to copy (an
induction head), and the probes in eval/probes.py use the same generator to ask how far it still copies.
"""
import numpy as np


def plant_repeat(row, segment, start, distance):
    """Write segment at row[start:] and again at row[start + distance:] (in place); returns row."""
    k = len(segment)
    if distance < k:
        raise ValueError(f"distance {distance} is shorter than the segment ({k} tokens): the copies would overlap")
    if start < 0 or start + distance + k > len(row):
        raise ValueError(f"a segment of {k} at {start} repeated at distance {distance} does not fit in {len(row)} tokens")
    row[start:start + k] = segment
    row[start + distance:start + distance + k] = segment
    return row


def random_vocab(retrieval_vocab, vocab_size):
    """How many token ids random segments draw from: retrieval_vocab (a run's config key; 0 means all) but
    never the end-of-text token, the last id of a ropelab vocabulary."""
    return min(retrieval_vocab or vocab_size - 1, vocab_size - 1)


def random_segment(rng, length, vocab):
    """Uniform token ids 0 .. vocab-1 (callers keep the end-of-text id, the vocabulary's last, out)."""
    return rng.integers(0, vocab, size=length)


def copy_chunk_row(rng, n, vocab, longest):
    """n tokens of chunks of uniform length 2..longest: each chunk, once there is room, is with probability
    1/2 a copy of an earlier stretch of the row (uniform start, so every distance up to n is practised)
    and otherwise fresh random ids. Many repeats at many distances per row: no fixed offset predicts them,
    so the model has to match content (an induction head) rather than learn a positional shortcut."""
    row = np.empty(n, dtype=np.int64)
    at = 0
    while at < n:
        k = min(int(rng.integers(2, longest + 1)), n - at)
        if at >= k and rng.random() < 0.5:
            src = int(rng.integers(0, at - k + 1))
            row[at:at + k] = row[src:src + k]
        else:
            row[at:at + k] = random_segment(rng, k, vocab)
        at += k
    return row


def mix_copies(rows, rng, fraction, longest, vocab):
    """Replace the first round(fraction * B) rows of a [B, T+1] batch of text by copy_chunk_row rows (in place)."""
    for row in rows[:round(fraction * len(rows))]:
        row[:] = copy_chunk_row(rng, len(row), vocab, longest)
    return rows


def copy_rows(filler, rng, segment, distances, vocab):
    """Copy probe rows: filler [N, n] (one row per distance) with a random segment whose second copy ends
    the row, its first `distance` tokens earlier. The repeat's tokens 1..segment-1 are the targets at
    window positions n-segment .. n-2 (its first token cannot be known before it is seen)."""
    rows = np.array(filler, dtype=np.int64)  # a copy: the filler may be a read-only memmap
    n = rows.shape[1]
    for row, d in zip(rows, np.asarray(distances, dtype=np.int64).tolist()):
        plant_repeat(row, random_segment(rng, segment, vocab), n - segment - d, d)
    return rows


NEEDLE = " The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = " What is the pass key? The pass key is"
KEY_DIGITS = 5  # a uniform guess of the key is right with probability 10^-5: the chance level


def passkey_row(filler, encode, key, depth):
    """One passkey trial of len(filler) + 1 tokens (a window and its last target): held-out text with the
    needle (stating the key) inserted at `depth` (0: first, 1: just before the question), then the question
    and the key. Returns (row, number of key tokens at the row's end)."""
    if not 0 <= depth <= 1:
        raise ValueError(f"depth {depth!r} is outside [0, 1] (the fraction of the filler before the key)")
    needle, ask, answer = (encode(t) for t in (NEEDLE.format(key=key), QUESTION, f" {key}"))
    room = len(filler) + 1 - len(needle) - len(ask) - len(answer)  # filler tokens that fit around them
    if room < 0:
        raise ValueError(f"a passkey trial of {len(filler)} tokens is shorter than its needle, question and key "
                         f"({len(needle) + len(ask) + len(answer)} tokens); use a longer length")
    at = round(depth * room)
    row = np.concatenate([filler[:at], needle, filler[at:room], ask, answer]).astype(np.int64)
    return row, len(answer)
