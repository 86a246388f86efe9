"""
Intervals and decisions for a study: both the training seed and the sample of text vary, so a mean over
runs gets its interval from a two-way bootstrap over seeds and units of text (held-out documents: a resampled
document brings all its windows), and the contrasts that carry the conclusions are decided together with
Holm's correction, each by the bootstrap and by a paired t-test on the seed means, and where neither rejects,
tested for equivalence (TOST). docs/methodology.md says how they are used.
"""
import math
from functools import lru_cache

import numpy as np
from scipy import stats as sps

LEVEL = 0.95
RETRIEVES = 0.5  # top-1 on copies inside the training length above which a run counts as one that copies
ALPHA = 1 - LEVEL
REPLICATES = 10000  # the fewest: a percentile interval at 95% rests on 250 replicates in each tail
MAX_REPLICATES = 1_000_000  # a family that needs more (m > 2,500) gets a normal-approximation p (interval)
CHUNK = 1 << 14  # replicates drawn at a time: memory stays CHUNK x (seeds + clusters) counts


def documents(starts, bounds):
    """The held-out document of each unit: the row of bounds [n_docs, 2] (sorted starts, as the val split's
    *_docs.npy) whose document holds the unit's first token."""
    return np.searchsorted(np.asarray(bounds, dtype=np.int64)[:, 0], np.asarray(starts, dtype=np.int64), side="right") - 1


def blocks(starts, docs, size):
    """A cluster per run of `size` tokens within a document, counted from the document's first unit: units of one
    block share it, units of different documents never do. The alternative to whole documents as the unit."""
    starts, docs = np.asarray(starts, dtype=np.int64), np.asarray(docs, dtype=np.int64)
    ids, inv = np.unique(docs, return_inverse=True)
    first = np.full(len(ids), np.iinfo(np.int64).max)
    np.minimum.at(first, inv, starts)
    return np.unique(np.stack([inv, (starts - first[inv]) // size], axis=1), axis=0, return_inverse=True)[1].reshape(-1)


def cluster_sums(values, groups):
    """(A [seeds, clusters], n [clusters]): per seed the sum of the values of each cluster's units, and the units
    each cluster holds. groups [units]: any label per unit; units with the same label are one cluster."""
    inv = np.unique(np.asarray(groups), return_inverse=True)[1].reshape(-1)
    onehot = (inv[:, None] == np.arange(inv.max() + 1)).astype(np.float64)
    return np.asarray(values, dtype=np.float64) @ onehot, onehot.sum(axis=0)


def bootstrap(values, groups=None, n_boot=REPLICATES, seed=0):
    """Mean of values [seeds, units] (every seed scored on the same units) and the replicate means of a two-way
    cluster bootstrap: each replicate resamples the seeds, and the clusters of units (groups: a label per unit, e.g.
    its document; None: every unit its own), with replacement; a cluster drawn brings all its units. For counts c of
    each seed and d of each cluster the replicate mean is sum_ik c_i A_ik d_k / (S * sum_k d_k n_k)."""
    v = np.asarray(values, dtype=np.float64)
    S, U = v.shape
    A, n = cluster_sums(v, np.arange(U) if groups is None else groups)
    c, d = counts(S, len(n), n_boot, seed)
    reps = np.empty(n_boot)
    for lo in range(0, n_boot, CHUNK):  # memory: a chunk of float counts at a time
        ck, dk = c[lo:lo + CHUNK].astype(np.float64), d[lo:lo + CHUNK].astype(np.float64)
        reps[lo:lo + CHUNK] = ((ck @ A) * dk).sum(axis=1) / (S * (dk @ n))
    return float(v.mean()), reps


@lru_cache(maxsize=8)  # a family has a shape per length and probe: more would be drawn again and again
def counts(S, D, n_boot, seed):
    """The resample counts of S seeds and D clusters [n_boot, S], [n_boot, D] (uint16, read-only): they depend on
    the shape alone, so every contrast of a family with the same shape shares them (drawing them is most of the cost)."""
    rng, cs, ds = np.random.default_rng(seed), [], []
    for lo in range(0, n_boot, CHUNK):
        b = min(CHUNK, n_boot - lo)
        cs.append(rng.multinomial(S, np.full(S, 1 / S), size=b).astype(np.uint16))
        ds.append(rng.multinomial(D, np.full(D, 1 / D), size=b).astype(np.uint16))
    c, d = np.concatenate(cs), np.concatenate(ds)
    c.flags.writeable = d.flags.writeable = False
    return c, d


def replicates(m, alpha=ALPHA):
    """Replicates for a family of m contrasts: the two-sided bootstrap p moves in steps of 2 / n_boot, and Holm's
    smallest threshold is alpha / m, so n_boot >= 20 m / alpha puts ten steps under it (and never below REPLICATES)."""
    return max(REPLICATES, math.ceil(20 * m / alpha - 1e-9))


def interval(values, groups=None, n_boot=REPLICATES, seed=0, margin=None):
    """{mean, lo, hi, p, seeds, units, clusters, p_method}: the percentile interval at LEVEL of the bootstrap, which
    stays inside the range of the values (inside [0, 1] for proportions), and the two-sided bootstrap p of "the mean
    is 0" (for a paired difference: no difference). Past MAX_REPLICATES the p (only) is the normal approximation of
    the replicates. margin: also p_tost, the bootstrap's two one-sided tests of |mean| >= margin."""
    mean, reps = bootstrap(values, groups, min(n_boot, MAX_REPLICATES), seed)
    lo, hi = np.quantile(reps, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    if n_boot <= MAX_REPLICATES:
        p, how = min(1.0, 2 * min((reps <= 0).mean(), (reps >= 0).mean())), "bootstrap"
    else:
        p, how = normal_p(mean, reps.std()), "normal"
    out = dict(mean=mean, lo=float(lo), hi=float(hi), p=float(p), seeds=len(values), units=len(values[0]),
               clusters=len(np.unique(groups)) if groups is not None else len(values[0]), p_method=how)
    if margin is not None:  # H0: mean <= -margin, and H0: mean >= margin; equivalence rejects both
        out["p_tost"] = float(max((reps <= -margin).mean(), (reps >= margin).mean()))
    return out


def ratio_interval(num, den, groups=None, n_boot=REPLICATES, seed=0):
    """{mean, lo, hi}: mean(num) / mean(den), both [seeds, units] on the same units, and its percentile interval from
    replicates that resample num and den alike (the same seed and cluster counts): the share of one paired gain that
    another recovers. A replicate whose denominator is not positive is a gain that vanished: the share is undefined
    there, and the interval says so by running to -inf or +inf."""
    mean_n, reps_n = bootstrap(num, groups, n_boot, seed)
    mean_d, reps_d = bootstrap(den, groups, n_boot, seed)
    shares = np.where(reps_d > 0, reps_n / np.where(reps_d > 0, reps_d, 1), np.sign(reps_n) * np.inf)
    # between two infinite replicates linear interpolation is inf - inf: take the replicate itself there
    how = "linear" if np.isfinite(shares).all() else "inverted_cdf"
    lo, hi = np.quantile(shares, [(1 - LEVEL) / 2, (1 + LEVEL) / 2], method=how)
    return dict(mean=mean_n / mean_d if mean_d > 0 else None, lo=float(lo), hi=float(hi), gain=mean_d)


def normal_p(mean, sd):
    return 1.0 if sd == 0 and mean == 0 else 0.0 if sd == 0 else float(2 * sps.norm.sf(abs(mean) / sd))


def seed_test(values, margin=None):
    """The paired t-test on the per-seed means of values [seeds, units] (each a seed's mean difference over the same
    units): {t, df, p} two-sided, and with a margin p_tost, the larger p of the one-sided tests of mean <= -margin and
    mean >= margin. Seeds are the independent draws of training, and the test's p goes as low as the data take it,
    unlike a sign test over n seeds (>= 1/2^(n-1)). None for fewer than 2 seeds."""
    means = np.asarray(values, dtype=np.float64).mean(axis=1)
    if len(means) < 2:
        return None
    n, mean, sd = len(means), float(means.mean()), float(means.std(ddof=1))
    if sd == 0:  # every seed gave the same mean: t is 0 or infinite
        return dict(t=0.0 if mean == 0 else math.copysign(math.inf, mean), df=n - 1, p=1.0 if mean == 0 else 0.0,
                    **({} if margin is None else dict(p_tost=0.0 if abs(mean) < margin else 1.0)))
    se = sd / math.sqrt(n)
    out = dict(t=mean / se, df=n - 1, p=float(2 * sps.t.sf(abs(mean) / se, n - 1)))
    if margin is not None:
        out["p_tost"] = float(max(sps.t.sf((mean + margin) / se, n - 1), sps.t.cdf((mean - margin) / se, n - 1)))
    return out


def holm(p_values, alpha=ALPHA):
    """Holm's step-down decisions for a family of p-values: sorted ascending, the i-th (from 0) is rejected
    while every p-value up to it is <= alpha / (m - i); the family-wise error rate stays <= alpha."""
    order = np.argsort(p_values, kind="stable")
    reject = np.zeros(len(p_values), dtype=bool)
    for i, k in enumerate(order):
        if p_values[k] > alpha / (len(p_values) - i):
            break
        reject[k] = True
    return reject.tolist()


def both(p_boot, p_seed, alpha=ALPHA):
    """Rejected where Holm rejects both the bootstrap's p and the seed-level p over the family (a missing seed-level
    p, fewer than 2 seeds: never). Each test alone keeps the family-wise error at alpha, so requiring both does too."""
    return [a and b for a, b in zip(holm(p_boot, alpha), holm([1.0 if p is None else p for p in p_seed], alpha))]
