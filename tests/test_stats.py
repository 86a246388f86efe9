"""lab/stats.py against cases worked out by hand and by enumerating every resample."""
import itertools

import numpy as np
import pytest

from lab.stats import bootstrap, holm, interval


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
