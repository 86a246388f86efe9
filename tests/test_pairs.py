"""lab/pairs.py: which frequency pairs carry copying; the variants against hand-computed frequencies and against the
probes' own methods on the stored copier, and the command's outputs and errors."""
import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from lab import pairs, probes, trials
from model import GPT, GPTConfig
from rope import frequencies
from runtime import model_from_checkpoint
from tests.test_probes import COPIER

THETA = 10000.0 ** (-np.arange(0, 32, 2) / 32)  # head dim 32, base 1e4: theta_i = base^(-2i/d), fastest first


def test_variants_interpolate_only_the_pairs_named():
    model, s = GPT(GPTConfig(block_size=64, vocab_size=16, n_layer=1, n_head=2, n_embd=64)), 4.0
    named = pairs.variants(16, s, 64)
    assert len(named) == 17 + 15 + 1
    for name, expected in (("fastest 0", THETA), ("fastest 16", THETA / s),
                           ("fastest 3", np.r_[THETA[:3] / s, THETA[3:]]), ("slowest 5", np.r_[THETA[:11], THETA[11:] / s])):
        freq, attention = frequencies(model.config, named[name], 256)
        assert np.allclose(freq.double().numpy(), expected, rtol=1e-6) and attention == 1.0, name
    freq, attention = frequencies(model.config, named["yarn temperature only"], 256)
    assert np.allclose(freq.double().numpy(), THETA, rtol=1e-6) and attention == pytest.approx(0.1 * math.log(4) + 1)
    ntk_by_parts = pairs.yarn_variants(s, 64, [])["ntk-by-parts"]
    assert frequencies(model.config, ntk_by_parts, 256)[1] == 1.0


def test_the_sweep_ends_are_the_probes_none_and_pi_on_the_copier():
    # fastest 0 and fastest 16 go through LongRoPE's per-pair code, none and pi through the plain and linear paths:
    # on the same trials of the stored copier they must score alike, and yarn as the probes' yarn
    torch.manual_seed(0)
    model = model_from_checkpoint(torch.load(COPIER, weights_only=True)).eval()
    L = model.config.block_size
    tokens, docs = np.random.default_rng(0).integers(0, 256, 20_000), np.array([[0, 20_000]])
    args = dict(segment=16, seed=0, distances=[2.0], trials=12, methods=["none", "pi", "yarn"], train_len=L)
    top1 = {r["method"]: r["top1"] for r in probes.copy_probe(model, tokens, docs, args, 256)}
    rows, contrasts = pairs.measure([model, model], trials.copy_trials(tokens, docs, L, args, 256), L, 16, [(8.0, 1.0)])
    by = {r["variant"]: r for r in rows}
    assert by["fastest 0"]["top1"] == pytest.approx(top1["none"], abs=1e-9)
    assert by["fastest 16"]["top1"] == pytest.approx(top1["pi"], abs=1e-9)
    assert by["yarn"]["top1"] == pytest.approx(top1["yarn"], abs=1e-9)
    assert all(r["lo"] <= r["top1"] <= r["hi"] and 0 <= r["lo"] and r["hi"] <= 1 for r in rows)
    # head dim 32, base 1e4: B_m first < 0 at 474 (lab/base_bound.py), past this distance of 128
    assert by["fastest 0"]["bound_negative_at"] is None and len(contrasts) == 16
    assert all(c["decision"] in ("higher", "lower", "undecided") for c in contrasts)
    temperature, = (c for c in contrasts if c["contrast"] == "yarn - ntk-by-parts")  # paired: a difference of means
    assert temperature["diff"] == pytest.approx(by["yarn"]["top1"] - by["ntk-by-parts"]["top1"], abs=1e-9)


@pytest.mark.parametrize("args, message", [
    (["--distances", "1,2"], "above 1"),
    (["--betas", "1/32"], "beta_fast > beta_slow"),
    (["--betas", "32/x"], "is not a number"),
])
def test_pairs_bad_input_is_one_line(tmp_path, args, message):
    out = subprocess.run([sys.executable, "lab/pairs.py", str(tmp_path), "--out", str(tmp_path / "o"), *args],
                         capture_output=True, text=True)
    assert out.returncode == 1 and message in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_a_run_that_does_not_copy_is_refused_and_nothing_is_written(tmp_path_factory, dataset, tmp_path):
    from tests.test_eval import trained
    run_dir = trained(tmp_path_factory, dataset, "retrieval", retrieval_mix=0.5, retrieval_segment=4, retrieval_vocab=16)
    out = subprocess.run([sys.executable, "lab/pairs.py", str(run_dir), "--out", str(tmp_path / "o"), "--trials", "2",
                          "--segment", "4", "--distances", "2"], capture_output=True, text=True)
    assert out.returncode == 1 and "do not copy" in out.stderr and not (tmp_path / "o").exists()


def test_the_command_writes_its_table_and_figure_for_a_copier(tmp_path, plays):
    from config import load_config
    data = plays.prepare(vocab_size=257)  # a byte corpus of six small "plays"
    run = tmp_path / "copier"
    run.mkdir()
    config = dict(load_config(["lab/configs/retrieval_small.py"]), dataset=str(data))
    torch.save(dict(torch.load(COPIER, weights_only=True), config=config), run / "ckpt.pt")
    report = pairs.sweep(pairs.parse_args([str(run), "--out", str(tmp_path / "o"), "--trials", "4", "--distances", "2",
                                           "--betas", "4/1,8/1"]))
    assert report["inside_top1"][0] >= probes.RETRIEVES and len(report["results"]) == 33 + 2 + 2
    assert {p.name for p in (tmp_path / "o").iterdir()} == {"pairs.json", "pairs.csv", "pairs.md", "pairs.png"}
    md = (tmp_path / "o" / "pairs.md").read_text()
    assert "python lab/pairs.py" in md and "| fastest 0 |" in md and "| yarn beta 8/1 |" in md and "| yarn - ntk-by-parts |" in md


def test_runs_of_different_bases_are_refused(tmp_path, plays):
    # "the fastest j pairs" are other frequencies at another base: pooling such runs would average unlike variants
    ckpt = torch.load(COPIER, weights_only=True)
    config = dict(ckpt["config"], dataset=str(plays.prepare(vocab_size=257)))
    for name, base in (("a", 10000.0), ("b", 500.0)):
        (tmp_path / name).mkdir()
        torch.save(dict(ckpt, config=config, model_args=dict(ckpt["model_args"], rope_base=base)), tmp_path / name / "ckpt.pt")
    with pytest.raises(ValueError, match="head size and base"):
        pairs.load_runs([tmp_path / "a", tmp_path / "b"], "cpu")
