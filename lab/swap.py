"""What the lab's readings of published protocols share: a row's method as the sources ran it (Su's log-n,
NTK-RoPE-mixed with its k and b) and the swap that leaves exact crop untouched (docs/methodology.md, "Published
protocols, and what exact crop adds to them")."""
import dataclasses
import math

import numpy as np

from common import UserError, parse_number
from eval.methods import forward_args
from eval.score import score_rows

NTK_MIXED = (12.0, 0.75)  # bojone's ntk_patch.py: k and b


def ntk_mixed_factors(rotary_dim, k, b):
    """NTK-RoPE-mixed (Su 2023, bojone/rerope ntk_patch.py): pair j = 1 .. d/2 divided by exp(a j^b), a = ln k / (d/2)^b,
    so the fastest pair is nearly kept and the slowest divided by k; one factor per pair, fastest first."""
    a = math.log(k) / (rotary_dim / 2) ** b
    return [math.exp(a * j ** b) for j in range(1, rotary_dim // 2 + 1)]


def method(spec, L, run_len, length, rotary_dim, factor):
    """The positions.PositionArgs of a row: a method of eval/methods.py by its name and settings, '+logn' adding Su's log-n
    (queries past L scaled by log(n) / log L, as rerope_patch.py and ntk_patch.py do), 'ntk-mixed' the fixed form with
    its k and b as settings (ntk-mixed:k=8:b=0.625; bojone's 12 and 0.75 by default)."""
    name, logn = spec.removesuffix("+logn"), spec.endswith("+logn")
    if name.split(":")[0] == "ntk-mixed":
        k, b = mixed_settings(name)
        how = forward_args("pairs", length, L, run_len, ntk_mixed_factors(rotary_dim, k, b))
    else:
        how = forward_args(name, length, L, run_len, factor)
    return dataclasses.replace(how, logn_len=L) if logn else how


def final_nll(model, rows, spec, L, k, k_max, rotary_dim, dtype="auto"):
    """Per-row mean NLL of the final L targets of rows read with kL tokens of input, every factor fixed at k_max's (bojone's
    rows are not dynamic): one reading of bojone's protocol."""
    rows = rows[:, -(round(k * L) + 1):]
    how = method(spec, L, model.config.block_size, rows.shape[1] - 1, rotary_dim, float(k_max))
    return score_rows(model, rows, last=L, method=how, dtype=dtype)[0].mean(axis=1)


def mixed_settings(name):
    """(k, b) of 'ntk-mixed[:k=K][:b=B]', k >= 1 and b >= 0."""
    given = dict(s.partition("=")[::2] for s in name.split(":")[1:])
    if unknown := sorted(set(given) - {"k", "b"}):
        raise UserError(f"--methods {name}: ntk-mixed takes no setting {unknown[0]!r}; it takes k and b")
    return (parse_number(given.get("k", str(NTK_MIXED[0])), f"methods {name}: k", float, 1),
            parse_number(given.get("b", str(NTK_MIXED[1])), f"methods {name}: b", float, 0))


def donors(unit_docs, rng):
    """For each unit a random other unit from another document (seeded): the swapped prefix's source; None where
    every unit comes from one document."""
    docs = np.asarray(unit_docs)
    out = []
    for d in docs:
        others = np.flatnonzero(docs != d)
        out.append(int(rng.choice(others)) if len(others) else None)
    return out


def swap_prefix(rows, donor_rows, L, eot=None):
    """rows [N, kL + 1] with every token more than L before the first final target (x_0 .. x_(k-2)L, in no final
    target's exact-crop window) replaced by the donors' tokens, and the end-of-text token at the splice as between
    documents in training (eot None: none, the donor's own token: a donor from the same document). Exact crop of the
    final L targets reads none of them; a suffix of jL + 1 tokens has its x_0 .. x_(j-2)L replaced alike, so one
    swapped row serves every shorter input."""
    cut = rows.shape[1] - 1 - 2 * L  # (k - 2)L: the splice
    if cut < 0:
        return rows.copy()
    out = rows.copy()
    out[:, :cut + 1] = donor_rows[:, :cut + 1]
    if eot is not None:
        out[:, cut] = eot
    return out
