"""The probes' rows: passkey trials in held-out text and copy trials at chosen distances, the same for every run on the
same data and options (their seeds), so that a study can pair them; shared by lab/probes.py and lab/pairs.py."""
import numpy as np

from common import UserError
from data.dataset import doc_windows
from data.synthetic import copy_rows


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
