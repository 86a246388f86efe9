"""lab/protocols.py and eval/score.py's exact crop: each published protocol on tiny runs, against forwards and
formulas computed here."""
import json
import math

import numpy as np
import pytest
import torch
from torch.nn import functional as F

import train
from common import UserError
from lab.crop import score_cropped
from lab import protocols, swap
from model import GPT, GPTConfig
from rope import rope_frequencies
from tests.conftest import held_out_corpus
from tests.test_wandb import offline_runs, wandb_dir  # noqa: F401  (a fixture)

L = 16


def test_exact_crop_predicts_each_target_from_its_own_last_tokens():
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=8, vocab_size=50, n_layer=1, n_head=2, n_embd=16)).eval()
    rows = np.random.default_rng(0).integers(0, 50, size=(3, 21))
    nll, hit = score_cropped(model, rows, last=15, context=8)
    for j, t in enumerate(range(6, 21)):  # the last 15 targets: rows[:, t] from rows[:, max(0, t - 8):t]
        with torch.no_grad():
            logits, _ = model(torch.from_numpy(rows[:, max(0, t - 8):t]))
        expected = F.cross_entropy(logits[:, -1], torch.from_numpy(rows[:, t]), reduction="none").numpy()
        assert nll[:, j] == pytest.approx(expected, abs=1e-5)
        assert (hit[:, j] == (logits[:, -1].argmax(-1).numpy() == rows[:, t])).all()


def test_ntk_mixed_is_bojones_formula():
    # ntk_patch.py: inv_freq = base^(-2i/d) * exp(-a j^b), j = i + 1, a = ln k / (d/2)^b; the slowest pair / k exactly
    d, k, b = 32, 12.0, 0.75
    factors = swap.ntk_mixed_factors(d, k, b)
    assert factors[-1] == pytest.approx(k) and factors[0] == pytest.approx(math.exp(math.log(k) / 16 ** 0.75))
    scaling = {"rope_type": "longrope", "short_factor": factors, "long_factor": factors, "attention_factor": 1.0,
               "original_max_position_embeddings": 64}
    inv_freq, attention = rope_frequencies(d, 10000.0, scaling, 256)
    a = math.log(k) / (d / 2) ** b
    by_hand = [10000.0 ** (-2 * i / d) * math.exp(-a * (i + 1) ** b) for i in range(d // 2)]
    assert inv_freq.tolist() == pytest.approx(by_hand, rel=1e-6) and attention == 1.0


def test_logn_rows_scale_the_queries_past_L_and_nothing_else():
    how = swap.method("rerope:window=4+logn", 16, 16, 64, 32, None)
    assert how.extend == (4, None) and how.logn_len == 16
    assert swap.method("rerope:window=4", 16, 16, 64, 32, None).logn_len is None


def test_strided_crop_scores_each_target_from_its_block_window():
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=8, vocab_size=50, n_layer=1, n_head=2, n_embd=16)).eval()
    rows = np.random.default_rng(1).integers(0, 50, size=(2, 24))
    nll, _ = score_cropped(model, rows, last=12, context=8, stride=3)
    for j, t in enumerate(range(11, 23)):  # target index t (rows[:, t + 1]); blocks end at 23, 20, 17, 14 (t + 1 <= end)
        end = next(e for e in (14, 17, 20, 23) if t < e)
        with torch.no_grad():
            logits, _ = model(torch.from_numpy(rows[:, end - 8:t + 1]))  # the window's tokens up to the target
        expected = F.cross_entropy(logits[:, -1], torch.from_numpy(rows[:, t + 1]), reduction="none").numpy()
        assert nll[:, j] == pytest.approx(expected, abs=1e-5)
    assert (score_cropped(model, rows, 12, 8, 1)[0] == score_cropped(model, rows, 12, 8)[0]).all()


def test_the_swapped_prefix_comes_from_another_document():
    rng = np.random.default_rng(0)
    docs = [0, 0, 1, 2, 2, 2]
    for _ in range(20):
        donor = swap.donors(docs, rng)
        assert all(docs[d] != docs[i] for i, d in enumerate(donor))
    assert swap.donors([5, 5], rng) == [None, None]


def test_the_swap_replaces_only_tokens_beyond_every_final_targets_crop_window():
    L, eot = 4, 99
    rows = np.arange(2 * (4 * L + 1)).reshape(2, 4 * L + 1)
    donor = rows[::-1] + 1000
    swapped = swap.swap_prefix(rows, donor, L, eot)
    # x_0 .. x_(k-2)L replaced (2L + 1 of 4L + 1 tokens: the donor's, then end-of-text), the rest untouched
    assert (swapped[:, :2 * L] == donor[:, :2 * L]).all() and (swapped[:, 2 * L] == eot).all()
    assert (swapped[:, 2 * L + 1:] == rows[:, 2 * L + 1:]).all()
    first_target = 3 * L + 1  # its crop window: the L tokens before it, x_2L+1 .. x_3L
    assert first_target - L == 2 * L + 1
    at3 = swap.swap_prefix(rows[:, L:], donor[:, L:], L, eot)  # a 3L input: its x_0 .. x_L replaced
    assert (at3[:, L] == eot).all() and (at3[:, L + 1:] == rows[:, 2 * L + 1:]).all()
    assert (at3 == swapped[:, L:]).all()  # the 4L row's suffix is the 3L swap: one swapped row serves both


def test_exact_crop_is_bit_identical_on_both_arms_and_the_1L_null_is_zero():
    torch.manual_seed(0)
    L = 8
    model = GPT(GPTConfig(block_size=L, vocab_size=60, n_layer=2, n_head=2, n_embd=16)).eval()
    units = np.random.default_rng(2).integers(0, 59, size=(4, 8 * L + 1))  # room for the own-document control
    out = protocols.bojone(model, units, L, 8, swap.donors([0, 0, 1, 1], np.random.default_rng(0)), 59,
                           specs=["none", "yarn"])
    for arm in ("swapped", "own document"):
        assert (out["same"]["crop"] == out[arm]["crop"]).all()
        for spec in ("none", "yarn"):
            assert (out["same"][f"{spec}@1L"] == out[arm][f"{spec}@1L"]).all()
            assert not np.allclose(out["same"][f"{spec}@4L"], out[arm][f"{spec}@4L"])  # the swap is read
    short = protocols.bojone(model, units[:, -(4 * L + 1):], L, 8, [1, 0, 3, 2], 59, specs=["none"])
    assert "own document" not in short  # no earlier text of the unit's own to draw on


def test_the_own_document_prefix_is_the_units_earlier_text_and_keeps_the_rest():
    L = 4
    units = np.arange(2 * (8 * L + 1)).reshape(2, -1)
    rows = units[:, -(4 * L + 1):]
    own = swap.swap_prefix(rows, units, L)
    assert (own[:, :2 * L + 1] == units[:, :2 * L + 1]).all()  # x_0 .. x_2L: 4L further back, no end-of-text
    assert (own[:, 2 * L + 1:] == rows[:, 2 * L + 1:]).all()  # every final target's crop window kept
    foreign = swap.swap_prefix(rows, rows[::-1], L, eot=-1)
    assert (foreign[:, 2 * L] == -1).all() and (foreign[:, :2 * L] == rows[::-1, :2 * L]).all()


@pytest.fixture(scope="module")
def rung(tmp_path_factory):
    data = held_out_corpus(tmp_path_factory, 3)
    folder = tmp_path_factory.mktemp("rung") / "L16"
    common = dict(dataset=str(data), batch_size=8, n_layer=1, n_head=2, n_embd=32, max_iters=6, warmup_iters=1,
                  eval_interval=6, eval_iters=1, log_interval=6, wandb_log=False, device="cpu", seed=0)
    train.main([f"--{k}={v}" for k, v in dict(common, out_dir=folder / "code_small_seed0", block_size=L).items()])
    train.main([f"--{k}={v}" for k, v in dict(common, out_dir=folder / "code_yarn4x_seed0", block_size=4 * L,
                                                     init_from=folder / "code_small_seed0", lr_decay_iters=6).items()]
               + [f"--rope_scaling={{'rope_type': 'yarn', 'factor': 4.0, 'original_max_position_embeddings': {L}}}"])
    train.main([f"--{k}={v}" for k, v in dict(common, out_dir=folder / "code_yarn2x_seed0", block_size=2 * L,
                                                     init_from=folder / "code_small_seed0", lr_decay_iters=6).items()]
               + [f"--rope_scaling={{'rope_type': 'yarn', 'factor': 2.0, 'original_max_position_embeddings': {L}}}"])
    return folder


def unigram(run):
    """The run with attention and MLP outputs zeroed: every target's loss depends on the token before it only."""
    ckpt = torch.load(run / "ckpt.pt", weights_only=True)
    for k in ckpt["model"]:
        if k.endswith("c_proj.weight"):
            ckpt["model"][k].zero_()
    torch.save(ckpt, run / "ckpt.pt")


def test_every_protocol_runs_and_a_context_free_model_decomposes_to_zero(rung, tmp_path, wandb_dir):
    protocols.main([str(rung), "--seeds", "1", "--units", "6", "--docs", "test", "--no-wandb", "--out", str(tmp_path / "page")])
    page = (tmp_path / "page" / "shapes.md").read_text()
    for published in ("1.4996 / 1.4267 / 1.4001", "3.356", "20.07", "48.85 / 82.40", "own-document control",
                      "the s = 2 fine-tune at F = 2L", "the same, the s = 2 fine-tune"):
        assert published in page
    result = json.loads((rung / "code_small_seed0" / "protocols_test.json").read_text())
    half = result["yarn_half"]
    assert half["crop@2L"] == half["none@2L"] and half["crop@2.5L"] != half["none@2.5L"]  # crop to F = 2L reaches past F only
    assert half["crop-L@1L"] == half["none@1L"] and half["crop-L@2L"] != half["none@2L"]
    same = result["bojone"]["same"]
    assert not np.allclose(same["none@1L"], same["crop"])  # a trained model: the whole window is not crop
    for run in ("code_small_seed0", "code_yarn4x_seed0", "code_yarn2x_seed0"):
        unigram(rung / run)
    protocols.main([str(rung), "--seeds", "1", "--units", "6", "--docs", "test", "--out", str(tmp_path / "zero")])
    result = json.loads((rung / "code_small_seed0" / "protocols_test.json").read_text())  # new weights: computed again
    (logged,) = offline_runs(wandb_dir)
    assert logged["run"].job_type == "protocols"
    assert logged["summary"]["protocols/L16/bojone/handicap"] == pytest.approx(0, abs=1e-5)
    assert logged["summary"]["protocols/L16/bojone/rerope/reads_past_L_4L"] == pytest.approx(0, abs=1e-5)
    assert logged["summary"]["protocols/L16/bojone/rerope/splice_4L"] == pytest.approx(0, abs=1e-5)
    for arm in ("same", "swapped", "own document"):
        readings = result["bojone"][arm]
        for row, values in readings.items():
            assert values == pytest.approx(readings["crop"], abs=1e-5), (arm, row)
    for row, values in result["grid"].items():
        assert values == pytest.approx(result["grid"]["crop"], abs=1e-5), row
    su = result["su"]
    assert su["none@8L/repeated"] == pytest.approx(su["crop@8L/repeated"])
    assert su["rerope:window=8@8L/repeated"] == pytest.approx(su["crop@8L/repeated"])
    for k in (0.5, 1, 2, 2.5):
        assert result["yarn_half"][f"crop-L@{k:g}L"] == pytest.approx(result["yarn_half"][f"none@{k:g}L"], abs=1e-5)
    for row, values in result["press"].items():
        assert np.mean(values) == pytest.approx(np.mean(result["press"]["crop"]), abs=1e-5), row


def test_one_run_alone_reads_the_protocols_asked_for(rung, tmp_path):
    run = rung / "code_small_seed0"
    protocols.main([str(run), "--protocols", "bojone", "--units", "6", "--no-wandb", "--out", str(tmp_path / "one")])
    result = json.loads((run / "protocols_test_bojone.json").read_text())  # a subset's own cache
    assert set(result) == {"ids", "L", "units", "unit_docs", "bojone"} and result["ids"]["protocols"] == ["bojone"]
    assert set(result["bojone"]) == {"same", "swapped", "own document"}  # the control's text lies 4L further back
    page = (tmp_path / "one" / "shapes.md").read_text()
    assert "bojone/rerope's protocol" in page and "YaRN's protocol" not in page
    with pytest.raises(UserError, match="holds no checkpoint: train it first .* or convert a model folder"):
        protocols.main([str(tmp_path), "--no-wandb", "--out", str(tmp_path / "none")])
    lone = tmp_path / "L16"  # a rung without its fine-tunes: bojone's protocol reads the L model alone
    lone.mkdir()
    (lone / "code_small_seed0").symlink_to(run)
    protocols.main([str(lone), "--seeds", "1", "--protocols", "bojone", "--units", "6", "--no-wandb", "--out",
                    str(tmp_path / "lone")])
    with pytest.raises(UserError, match="code_yarn4x_seed0 holds no checkpoint"):
        protocols.main([str(lone), "--seeds", "1", "--protocols", "yarn", "--no-wandb", "--out", str(tmp_path / "y")])


def test_the_test_page_marks_the_setting_dev_chose_from_a_full_or_a_grid_only_reading(tmp_path):
    best = {f"rerope:window={L // 2}+logn", f"leaky-rerope:window={L // 4}"}

    def reading(seed):  # crop 1.0; dev's best setting of each method 1.1 at 2L and 4L, every other 1.5 or more
        grid = {"crop": [1.0, 1.0]}
        for s in protocols.grid(L):
            v = 1.1 if s in best else 1.5 + 0.01 * seed
            grid.update({f"{s}@2L": [v, v], f"{s}@4L": [v, v]})
        return dict(L=L, grid=grid)

    pairs = [(tmp_path / f"code_small_seed{k}", None) for k in range(2)]
    for small, _ in pairs:
        small.mkdir()
    (pairs[0][0] / "protocols_dev.json").write_text(json.dumps(reading(0)))
    assert protocols.chosen_on_dev(pairs) is None  # seed 1 has no dev reading: nothing is marked
    (pairs[1][0] / "protocols_dev_grid.json").write_text(json.dumps(reading(1)))
    assert protocols.chosen_on_dev(pairs) == best
