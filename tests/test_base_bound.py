"""lab/base_bound.py: Men et al.'s B_m, where it first fails, the smallest base and the command, against hand computations."""
import json
import math
import subprocess
import sys

import pytest

from lab.base_bound import base_bound, parse_args, smallest_base
from lab.bound import base_bound_curve, first_negative, trained_freq

BASE = 10000.0


def test_base_bound_curve_by_hand():
    assert base_bound_curve(128, BASE, 10)[0] == 64  # B_0 = d / 2
    # d = 4, base = 100: theta = [1, 100^(-1/2)] = [1, 0.1], B_10 = cos(10) + cos(1) = -0.2988
    assert base_bound_curve(4, 100.0, 10)[10].item() == pytest.approx(math.cos(10) + math.cos(1), abs=1e-12)
    # p-RoPE, half of the 2 pairs rotate: the unrotated low-frequency pair adds cos(0) = 1 at every distance
    assert base_bound_curve(4, 100.0, 10, fraction=0.5)[10].item() == pytest.approx(math.cos(10) + 1, abs=1e-12)


def test_smallest_base_is_a_scan_not_a_bisection():
    # d = 2: B_m = cos(m) whatever the base; cos(1) > 0 but cos(2) < 0
    assert smallest_base(2, 1) == 10.0
    with pytest.raises(ValueError, match="no base in"):
        smallest_base(2, 2, highest=1e4)
    # passing bases are not an interval: at d = 128, 3.5e5 keeps B_m >= 0 up to 16384 but 3.6e5 does not
    assert (base_bound_curve(128, 3.5e5, 16384) >= 0).all() and (base_bound_curve(128, 3.6e5, 16384) < 0).any()


@pytest.mark.parametrize("context_len, found, below, paper", [(16384, 3.5e5, 3.4e5, 3.1e5),
                                                             (32768, 6.3e5, 6.2e5, 6.4e5)])
def test_smallest_base_for_llama_head_dim(one_thread, context_len, found, below, paper):
    base = smallest_base(128, context_len)
    assert base == found
    assert (base_bound_curve(128, base, context_len)[1:] >= 0).all()
    assert (base_bound_curve(128, below, context_len)[1:] < 0).any()  # the grid value just below fails
    assert abs(base / paper - 1) < 0.15  # Men et al.'s Table 2, see below


def test_paper_table_values_fail_the_bound_as_defined():
    # Table 2 reads 16k -> 3.1e5 and 32k -> 6.4e5, but with B_m = sum cos(m base^(-2i/d)) both go negative before
    # the context length (so the scan returns 3.5e5 and 6.3e5): the table was not made exactly this way
    for m, base in [(12223, 3.1e5), (27685, 6.4e5)]:
        assert sum(math.cos(m * base ** (-2 * i / 128)) for i in range(64)) < -0.3


def test_base_bound_by_hand():
    # head dim 2: B_m = cos(m), first negative at m = 2 (cos 2 = -0.416)
    assert first_negative(trained_freq(2, 10.0), 10) == 2
    # head dim 4, base 100: B_m = cos(m) + cos(m / 10); B_2 = -0.416 + 0.980 = 0.564, B_3 = -0.990 + 0.955 = -0.035
    curve = base_bound_curve(4, 100.0, 3)
    assert curve.tolist() == pytest.approx([2.0, math.cos(1) + math.cos(0.1), 0.5639, -0.0347], abs=1e-4)
    assert first_negative(trained_freq(4, 100.0), 3) == 3 and first_negative(trained_freq(4, 100.0), 2) is None
    # the passing bases are not an interval: a base above the smallest passing one can fail
    low = smallest_base(8, 64)
    assert first_negative(trained_freq(8, low), 64) is None and first_negative(trained_freq(8, low * 0.9), 64) is not None


def test_base_bound_command_prints_the_smallest_base(tmp_path):
    out = subprocess.run([sys.executable, "lab/base_bound.py", "--head_dim", "32", "--lengths", "256",
                          "--bases", "500,1e4", "--out", str(tmp_path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "context 256: smallest base 2.2e+03" in out.stdout and "base 500: B_m < 0 first at m = 103" in out.stdout
    assert (tmp_path / "base_bound.png").exists() and (tmp_path / "base_bound.json").exists()


def test_copy_reads_each_study_and_draws_it_beside_its_base(tmp_path):
    # a study.json as lab/study.py writes it: the copy probe's none rows are kept, other probes and methods are not
    row = lambda probe, method, at, mean: dict(config="c", probe=probe, method=method, at=at, train_len=64,
                                               value=dict(mean=mean, lo=mean - 0.1, hi=mean + 0.1, p=0.0))
    for name, rows in [("s500", [row("copy", "none", 256, 0.1), row("copy", "none", 64, 0.9), row("copy", "yarn", 64, 0.5)]),
                       ("s1e6", [row("copy", "none", 64, 0.8), row("mqar", "none", 64, 0.7)])]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "study.json").write_text(json.dumps({"probe_rows": rows}))
    argv = ["--head_dim", "32", "--lengths", "512", "--bases", "500,1e6", "--out", str(tmp_path), "--copy", str(tmp_path / "s500")]
    with pytest.raises(ValueError, match="one study folder per base: 2 bases, got 1"):
        parse_args(argv)
    with pytest.raises(ValueError, match="no study.json there"):
        base_bound(parse_args(argv + [str(tmp_path)]))
    base_bound(parse_args(argv + [str(tmp_path / "s1e6")]))
    report = json.loads((tmp_path / "base_bound.json").read_text())
    assert report["copy_top1"] == {"500": [[64, 0.9, pytest.approx(0.8), 1.0], [256, 0.1, 0.0, pytest.approx(0.2)]],
                                   "1e+06": [[64, 0.8, pytest.approx(0.7), pytest.approx(0.9)]]}
    assert (tmp_path / "base_bound_copy.png").stat().st_size > 0


def test_the_grid_starts_at_lowest_and_has_two_significant_digits():
    # d = 2: B_m = cos(m) for any base, so every base passes up to m = 1 and the scan returns the first grid value
    assert smallest_base(2, 1, lowest=15.0) == 15.0 and smallest_base(2, 1, lowest=15.5) == 16.0
    assert smallest_base(2, 1, lowest=99.5) == 100.0 and smallest_base(2, 1, lowest=1234.0) == 1300.0
    with pytest.raises(ValueError, match=r"no base in \[20, 19\]"):
        smallest_base(2, 1, lowest=20.0, highest=19.0)


def test_base_bound_bad_input_is_one_line():
    out = subprocess.run([sys.executable, "lab/base_bound.py", "--head_dim", "33"], capture_output=True, text=True)
    assert out.returncode == 1 and "even head dimension" in out.stderr and len(out.stderr.strip().splitlines()) == 1
