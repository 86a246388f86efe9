"""lab/stats.py against cases worked out by hand and by enumerating every resample."""
import itertools
import math

import numpy as np
import pytest

from lab import stats
from lab.stats import blocks, both, bootstrap, documents, holm, interval, replicates, seed_test


def test_one_seed_two_windows_by_hand():
    # resampling the windows (0, 1) gives the means 0, 1/2, 1 with probabilities 1/4, 1/2, 1/4
    mean, reps = bootstrap([[0.0, 1.0]], n_boot=40000)
    assert mean == 0.5
    assert [np.mean(reps == x) for x in (0.0, 0.5, 1.0)] == pytest.approx([0.25, 0.5, 0.25], abs=0.01)
    r = interval([[0.0, 1.0]], n_boot=40000)
    assert (r["lo"], r["hi"], r["seeds"], r["units"]) == (0.0, 1.0, 1, 2)
    assert r["p"] == pytest.approx(0.5, abs=0.02)  # P(mean* <= 0) = 1/4, two-sided


def test_the_bootstrap_matches_every_resample_enumerated():
    # two seeds x two windows: the 16 equally likely (seeds, windows) draws, averaged explicitly
    v = np.array([[1.0, 2.0], [3.0, 5.0]])
    exact = [v[np.ix_(s, u)].mean() for s in itertools.product(range(2), repeat=2)
             for u in itertools.product(range(2), repeat=2)]
    _, reps = bootstrap(v, n_boot=64000)
    for x in set(exact):
        assert np.mean(np.isclose(reps, x)) == pytest.approx(exact.count(x) / 16, abs=0.01)


def test_proportion_intervals_stay_inside_0_1():
    # copy hits of 3 seeds x 4 trials: a t interval over the seed means (0.75, 0, 1) is about [-0.7, 1.9]
    r = interval([[1, 1, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1]])
    assert 0.0 <= r["lo"] < r["mean"] < r["hi"] <= 1.0


def test_a_clear_difference_is_significant_and_no_difference_is_not():
    rng = np.random.default_rng(0)
    assert interval(0.5 + rng.normal(0, 0.1, (5, 40)))["p"] < 0.001
    assert interval(rng.normal(0, 0.1, (5, 40)))["p"] > 0.05


def test_holm_by_hand():
    # sorted 0.005 <= 0.05/4 and 0.01 <= 0.05/3 are rejected; 0.03 > 0.05/2 stops the procedure, so 0.04 is kept
    assert holm([0.01, 0.04, 0.03, 0.005]) == [True, False, False, True]
    assert holm([0.01, 0.02, 0.03]) == [True, True, True]  # 0.0167, 0.025, 0.05
    assert holm([0.04, 0.001]) == [True, True]
    assert holm([0.02, 0.001], alpha=0.01) == [False, True]


def test_a_unit_belongs_to_the_document_that_holds_its_first_token():
    bounds = [[0, 10], [11, 30], [31, 40]]  # the val split's documents, an EOT between them
    assert documents([0, 5, 11, 29, 31, 39], bounds).tolist() == [0, 0, 1, 1, 2, 2]
    # blocks of 128 tokens from each document's first unit: 100 and 164 share one, 228 and 292 the next; doc 1 its own
    ids = blocks([100, 164, 228, 292, 500], [0, 0, 0, 0, 1], 128)
    assert ids[0] == ids[1] != ids[2] == ids[3] != ids[4] and len(set(ids.tolist())) == 3


def test_a_resampled_document_brings_all_its_windows():
    # one seed; document A holds three windows of 0, document B one window of 1 (mean 1/4). Drawing 2 documents:
    # AA -> 0, AB or BA -> (0+0+0+1)/4, BB -> 1, with probabilities 1/4, 1/2, 1/4; windows alone would give k/4,
    # k ~ Binomial(4, 1/4), so 1/2 and 3/4 too: those can only come from splitting a document
    v, docs = [[0.0, 0.0, 0.0, 1.0]], [0, 0, 0, 1]
    mean, reps = bootstrap(v, docs, n_boot=40000)
    assert mean == 0.25 and set(np.round(reps, 12)) == {0.0, 0.25, 1.0}
    assert [np.mean(np.isclose(reps, x)) for x in (0.0, 0.25, 1.0)] == pytest.approx([0.25, 0.5, 0.25], abs=0.01)
    _, by_window = bootstrap(v, n_boot=40000)
    assert np.mean(np.isclose(by_window, 0.5)) == pytest.approx(6 * 3**2 / 4**4, abs=0.01)  # C(4,2) (1/4)^2 (3/4)^2
    r = interval(v, docs)
    assert (r["units"], r["clusters"]) == (4, 2)


def test_the_two_way_cluster_bootstrap_matches_every_resample_enumerated():
    # two seeds x three windows in two documents ({0, 1}, {2}): 4 seed draws x 4 document draws, equally likely
    v = np.array([[1.0, 2.0, 4.0], [3.0, 5.0, 0.0]])
    docs = [[0, 1], [2]]
    exact = []
    for s in itertools.product(range(2), repeat=2):
        for g in itertools.product(range(2), repeat=2):
            w = [j for k in g for j in docs[k]]
            exact.append(v[np.ix_(s, w)].mean())
    _, reps = bootstrap(v, [0, 0, 1], n_boot=64000)
    for x in set(exact):
        assert np.mean(np.isclose(reps, x)) == pytest.approx(exact.count(x) / 16, abs=0.01)


def test_documents_widen_the_interval_where_their_windows_agree_and_narrow_it_where_they_do_not():
    # 4 documents x 10 windows. Windows that repeat their document's value are 4 draws, not 40: the document
    # interval is wider. Documents of the same mean, windows varying inside each: every document draw gives
    # that mean, so the document interval has no width, while resampling windows scatters it.
    docs = np.repeat(np.arange(4), 10)
    alike = np.repeat([0.0, 1.0, 2.0, 3.0], 10)[None]
    width = {g is None: interval(alike, g)["hi"] - interval(alike, g)["lo"] for g in (None, docs)}
    assert width[False] > 2 * width[True]  # documents (False) against windows (True)
    inside = np.tile(np.linspace(-1, 1, 10), 4)[None]
    assert interval(inside, docs)["hi"] - interval(inside, docs)["lo"] == pytest.approx(0, abs=1e-12)
    assert interval(inside)["hi"] - interval(inside)["lo"] > 0.3


def test_the_seed_level_t_test_by_hand():
    # seed means 1, 2, 3: t = 2 / (1 / sqrt 3) with 2 degrees of freedom, where P(|T| > t) = 1 - t / sqrt(t^2 + 2)
    r = seed_test([[0.0, 2.0], [2.0, 2.0], [4.0, 2.0]])
    assert r["t"] == pytest.approx(2 * math.sqrt(3)) and r["df"] == 2
    assert r["p"] == pytest.approx(1 - math.sqrt(12 / 14))
    # two seeds, means 1 and 3: t = 2, 1 degree of freedom (Cauchy): p = 1 - (2 / pi) atan 2
    assert seed_test([[1.0], [3.0]])["p"] == pytest.approx(1 - 2 / math.pi * math.atan(2))
    assert seed_test([[1.0, 2.0]]) is None  # one seed: no test
    assert seed_test([[0.5], [0.5]])["p"] == 0.0 and seed_test([[0.0], [0.0]])["p"] == 1.0


def test_equivalence_two_one_sided_tests_by_hand():
    # seed means 0.001, 0.002, 0.003 against a margin of 0.01: se = 0.001 / sqrt 3, the nearer bound +0.01 decides;
    # with 2 degrees of freedom P(T > x) = (1 - x / sqrt(x^2 + 2)) / 2
    def tail(x):
        return (1 - x / math.sqrt(x * x + 2)) / 2
    se = 0.001 / math.sqrt(3)
    r = seed_test([[0.001], [0.002], [0.003]], margin=0.01)
    assert r["p_tost"] == pytest.approx(max(tail((0.002 + 0.01) / se), tail((0.01 - 0.002) / se)))
    assert r["p_tost"] == pytest.approx(tail(0.008 / se)) and 0.002 < r["p_tost"] < 0.003
    assert seed_test([[0.001], [0.002], [0.003]], margin=0.001)["p_tost"] > 0.5  # the mean lies past the margin
    # the bootstrap's: one seed, windows 0 and 0.02 give means 0, 0.01, 0.02 (1/4, 1/2, 1/4); margin 0.015:
    # P(mean* <= -0.015) = 0, P(mean* >= 0.015) = 1/4
    assert interval([[0.0, 0.02]], n_boot=40000, margin=0.015)["p_tost"] == pytest.approx(0.25, abs=0.01)


def test_the_replicates_reach_a_tenth_of_the_smallest_holm_threshold():
    # the two-sided p moves in steps of 2 / n_boot; Holm's first threshold is 0.05 / m
    assert replicates(1) == 10000 and replicates(80) == 32000 and replicates(336) == 134400
    for m in (1, 7, 80, 120, 336, 1000):
        assert 2 / replicates(m) <= 0.05 / m / 10
    assert 2 / (replicates(336) - 1000) > 0.05 / 336 / 10  # not many more than needed


def test_past_the_largest_bootstrap_the_p_is_the_normal_approximation(monkeypatch):
    monkeypatch.setattr(stats, "MAX_REPLICATES", 4000)
    v = 0.1 + np.random.default_rng(0).normal(0, 0.3, (4, 20))
    r = interval(v, n_boot=8000)
    _, reps = bootstrap(v, n_boot=4000)
    z = v.mean() / reps.std()
    assert r["p_method"] == "normal" and r["p"] == pytest.approx(2 * (1 - 0.5 * (1 + math.erf(z / math.sqrt(2)))))
    assert interval(v, n_boot=4000)["p_method"] == "bootstrap"


def test_a_contrast_is_decided_only_where_both_tests_reject_under_holm():
    # bootstrap p's reject the first two; the seed-level p's only the first and third; a missing seed test rejects nothing
    assert both([0.001, 0.001, 0.5], [0.001, 0.5, 0.001]) == [True, False, False]
    assert both([0.0, 0.0], [None, 0.0]) == [False, True]


def test_the_ratio_of_two_gains_resamples_both_alike():
    rng = np.random.default_rng(1)
    den = rng.uniform(0.1, 0.3, (3, 12))  # the ceiling's gain per seed and window, all positive
    r = stats.ratio_interval(0.25 * den, den, groups=np.repeat(np.arange(4), 3))
    # a method that recovers a quarter of the gain on every unit: every replicate's ratio is 0.25 exactly, which it
    # would not be if the numerator and denominator were resampled independently
    assert (r["mean"], r["lo"], r["hi"]) == pytest.approx((0.25, 0.25, 0.25)) and r["gain"] == pytest.approx(den.mean())
    noisy = stats.ratio_interval(0.25 * den + rng.normal(0, 0.05, den.shape), den)
    assert noisy["lo"] < noisy["mean"] < noisy["hi"] and noisy["hi"] - noisy["lo"] > 0.05
    # a gain that vanishes: no share, and an interval that says so
    gone = stats.ratio_interval(den, den - 0.5)
    assert gone["mean"] is None and gone["lo"] == gone["hi"] == math.inf
