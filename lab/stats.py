"""
Intervals and decisions for a study: both the training seed and the sample of text vary, so a mean over
runs gets its interval from a two-way bootstrap over seeds and windows, and the contrasts that carry the
conclusions are decided together with Holm's correction. docs/methodology.md says how they are used.
"""
import numpy as np

LEVEL = 0.95


def bootstrap(values, n_boot=10000, seed=0):
    """Mean of values [seeds, units] (every seed scored on the same units, e.g. windows of held-out text)
    and the replicate means of a two-way bootstrap: each replicate resamples the seeds and the units with
    replacement. Its mean is then sum_ij c_i v_ij d_j / (S U) for the counts c, d of each seed and unit."""
    v = np.asarray(values, dtype=np.float64)
    S, U = v.shape
    rng = np.random.default_rng(seed)
    c = rng.multinomial(S, np.full(S, 1 / S), size=n_boot)
    d = rng.multinomial(U, np.full(U, 1 / U), size=n_boot)
    return float(v.mean()), np.einsum("bs,su,bu->b", c, v, d) / (S * U)


def interval(values, n_boot=10000, seed=0):
    """{mean, lo, hi, p, seeds, units}: the percentile interval at LEVEL of the bootstrap, which stays
    inside the range of the values (inside [0, 1] for proportions), and the two-sided bootstrap p-value
    of "the mean is 0" (for a paired difference: no difference)."""
    mean, reps = bootstrap(values, n_boot, seed)
    lo, hi = np.quantile(reps, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    p = min(1.0, 2 * min((reps <= 0).mean(), (reps >= 0).mean()))
    return dict(mean=mean, lo=float(lo), hi=float(hi), p=float(p), seeds=len(values), units=len(values[0]))


def holm(p_values, alpha=1 - LEVEL):
    """Holm's step-down decisions for a family of p-values: sorted ascending, the i-th (from 0) is rejected
    while every p-value up to it is <= alpha / (m - i); the family-wise error rate stays <= alpha."""
    order = np.argsort(p_values, kind="stable")
    reject = np.zeros(len(p_values), dtype=bool)
    for i, k in enumerate(order):
        if p_values[k] > alpha / (len(p_values) - i):
            break
        reject[k] = True
    return reject.tolist()
