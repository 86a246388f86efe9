"""The retrieval probes' generators, the rotation turn counts and the RoPE base bound, against hand computations."""
import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from data.synthetic import KEY_DIGITS, NEEDLE, QUESTION, copy_rows, mix_repeats, passkey_row, plant_repeat, random_vocab
from data.tokenizer import gpt2_tokenizer
from eval.probes import pair_kind, rotation_probe
from model import GPT, GPTConfig
from rope import base_bound_curve, first_negative, smallest_base


def test_plant_repeat_is_an_exact_copy_at_the_distance():
    row = np.arange(100, 140)
    seg = np.array([1, 2, 3, 4])
    plant_repeat(row, seg, start=5, distance=20)
    assert (row[5:9] == seg).all() and (row[25:29] == seg).all()
    assert (row[9:25] == np.arange(109, 125)).all()  # the filler between them is untouched
    with pytest.raises(ValueError, match="overlap"):
        plant_repeat(row, seg, start=0, distance=3)
    with pytest.raises(ValueError, match="does not fit"):
        plant_repeat(row, seg, start=20, distance=20)  # a distance longer than the row allows


def test_copy_rows_end_each_row_with_the_repeat():
    rng = np.random.default_rng(0)
    filler = np.full((3, 50), 999)
    rows = copy_rows(filler, rng, segment=8, distances=[8, 20, 42], vocab=10)
    for row, d in zip(rows, [8, 20, 42]):
        assert (row[-8:] == row[-8 - d:-d]).all()  # second copy ends the row, the first d tokens earlier
        assert (row[-8:] < 10).all()
        assert (np.delete(row, np.r_[50 - 8 - d:50 - d, 42:50]) == 999).all()
    assert (filler == 999).all()  # the filler passed in is not modified
    with pytest.raises(ValueError, match="does not fit"):
        copy_rows(filler, rng, segment=8, distances=[43], vocab=10)


def test_mix_repeats_plants_the_fraction_at_distances_up_to_the_length():
    rng = np.random.default_rng(1)
    rows = np.full((8, 65), 5000)
    mix_repeats(rows, rng, fraction=0.5, segment=8, vocab=100)
    planted = (rows < 100).any(axis=1)
    assert planted.tolist() == [True] * 4 + [False] * 4
    for row in rows[:4]:
        where = np.flatnonzero(row < 100)
        assert len(where) == 16 and (row[where[:8]] == row[where[8:]]).all()


def test_random_vocab_never_includes_the_end_of_text_token():
    assert random_vocab(0, 2048) == 2047 and random_vocab(128, 2048) == 128 and random_vocab(5000, 2048) == 2047


def test_passkey_row_places_the_key_at_the_depth_and_asks_for_it_at_the_end():
    enc = gpt2_tokenizer(2048).encode_ordinary
    filler = np.full(300, 7)
    key = 48213
    needle, ask, answer = enc(NEEDLE.format(key=key)), enc(QUESTION), enc(f" {key}")
    for depth in (0, 0.5, 1):
        row, k = passkey_row(filler, enc, key, depth)
        assert len(row) == 301 and k == len(answer)
        assert row[-k:].tolist() == answer and row[-k - len(ask):-k].tolist() == ask
        room = 301 - len(needle) - len(ask) - len(answer)
        at = round(depth * room)
        assert row[at:at + len(needle)].tolist() == needle
        assert (row[:at] == 7).all()
    assert passkey_row(filler, enc, key, 1)[0][room + len(needle) - 1] != 7  # depth 1: needle just before the question
    with pytest.raises(ValueError, match="outside"):
        passkey_row(filler, enc, key, 1.5)
    with pytest.raises(ValueError, match="shorter than"):
        passkey_row(np.full(10, 7), enc, key, 0.5)  # a key longer than the filler
    assert KEY_DIGITS == len(str(key))


def test_turn_counts_match_the_closed_form():
    # pair i turns L * base^(-2i/d) / (2 pi) times over L; PI at factor s = T/L makes every pair turn exactly
    # as often over T as it did over L; YaRN keeps pairs with more than 32 turns and interpolates those below 1
    model = GPT(GPTConfig(block_size=256, vocab_size=16, n_layer=1, n_head=2, n_embd=64, rope_base=10000.0))
    report = rotation_probe(model, dict(lengths=[4], methods=["none", "pi", "yarn"]))
    theta = 10000.0 ** (-np.arange(0, 32, 2) / 32)
    by = {r["method"]: r for r in report}
    assert np.allclose(by["none"]["turns_train"], 256 * theta / (2 * math.pi), rtol=1e-6)
    assert np.allclose(by["none"]["turns_eval"], 1024 * theta / (2 * math.pi), rtol=1e-6)
    assert np.allclose(by["pi"]["turns_eval"], by["none"]["turns_train"], rtol=1e-6)
    assert set(by["pi"]["kind"]) == {"interpolated"} and set(by["none"]["kind"]) == {"extrapolated"}
    turns = 256 * theta / (2 * math.pi)
    kinds = by["yarn"]["kind"]
    assert all(k == "extrapolated" for k, t in zip(kinds, turns) if t > 32)
    assert all(k == "interpolated" for k, t in zip(kinds, turns) if t < 1)
    assert "blended" in kinds
    assert pair_kind(0.5, 2.0) == "interpolated" and pair_kind(0.7, 2.0) == "blended"


def test_base_bound_by_hand():
    # head dim 2: B_m = cos(m), first negative at m = 2 (cos 2 = -0.416)
    assert first_negative(2, 10.0, 10) == 2
    # head dim 4, base 100: B_m = cos(m) + cos(m / 10); B_2 = -0.416 + 0.980 = 0.564, B_3 = -0.990 + 0.955 = -0.035
    curve = base_bound_curve(4, 100.0, 3)
    assert curve.tolist() == pytest.approx([2.0, math.cos(1) + math.cos(0.1), 0.5639, -0.0347], abs=1e-4)
    assert first_negative(4, 100.0, 3) == 3 and first_negative(4, 100.0, 2) is None
    # the passing bases are not an interval: a base above the smallest passing one can fail
    low = smallest_base(8, 64)
    assert first_negative(8, low, 64) is None and first_negative(8, low * 0.9, 64) is not None


def test_base_bound_command_prints_the_smallest_base(tmp_path):
    out = subprocess.run([sys.executable, "eval/base_bound.py", "--head_dim", "32", "--lengths", "256",
                          "--bases", "500,1e4", "--out", str(tmp_path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "context 256: smallest base 2.2e+03" in out.stdout and "base 500: B_m < 0 first at m = 103" in out.stdout
    assert (tmp_path / "base_bound.png").exists() and (tmp_path / "base_bound.json").exists()


@pytest.mark.parametrize("args, message", [
    (["--depths", "0,1.5"], "outside [0, 1]"),
    (["--distances", "0,2"], "positive multiples"),
    (["--probes", "copy,foo"], "unknown --probes foo"),
    (["--methods", "none,bogus"], "unknown --methods bogus"),
])
def test_probes_bad_input_is_one_line(tmp_path, args, message):
    out = subprocess.run([sys.executable, "eval/probes.py", str(tmp_path), *args], capture_output=True, text=True)
    assert out.returncode == 1 and message in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_base_bound_bad_input_is_one_line():
    out = subprocess.run([sys.executable, "eval/base_bound.py", "--head_dim", "33"], capture_output=True, text=True)
    assert out.returncode == 1 and "even head dimension" in out.stderr and len(out.stderr.strip().splitlines()) == 1
