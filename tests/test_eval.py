"""eval/: score.py, extrapolate.py and compare.py on a tiny dataset and tiny trained models."""
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.nn import functional as F

import train
from data.dataset import held_out, load_split
from eval import compare, extrapolate
from common import UserError
from eval.methods import METHODS
from eval.report import ALWAYS_DRAWN, BEST_N, CSV_FIELDS, PLOT_BINS, STYLES, extrapolation_table, line_style, past_means, plotted, same_rows, signed
from eval.score import score_sliding, score_windows, sliding_windows
from runtime import load_run
from sample import KVCache
from positions import PositionArgs

ROOT = Path(__file__).resolve().parents[1]
L = 32  # training length of the tiny runs
ENTRY_FIELDS = ("method", "mode", "protocol", "eval_len", "factor", "stride", "positions", "loss", "ppl",
                "loss_beyond_train", "ppl_beyond_train", "stderr", "diff_none", "diff_none_stderr", "diff_crop",
                "diff_crop_stderr", "diff_none_inside", "helped_tokens", "per_unit", "n_units", "tokens", "available", "reason")
LOSS_FIELDS = ("loss", "ppl", "loss_beyond_train", "ppl_beyond_train", "stderr")


def trained(tmp_path_factory, dataset, name, **kw):
    out_dir = tmp_path_factory.mktemp("runs") / name
    cfg = dict(dict(dataset=dataset, out_dir=str(out_dir), batch_size=8, block_size=L, n_layer=1, n_head=2, n_embd=32,
                    max_iters=40, lr_decay_iters=40, warmup_iters=2, learning_rate=3e-3, eval_interval=40, eval_iters=1,
                    log_interval=40, wandb_log=False, device="cpu"), **kw)
    train.main([f"--{k}={v}" for k, v in cfg.items()])
    return out_dir


@pytest.fixture(scope="module")
def rope_run(tmp_path_factory, dataset):
    # a few iterations on random words leave attention almost uniform, so positions (and hence every
    # scaling method) would barely change the loss and the "equals none" tests could pass vacuously:
    # sharpen the attention by scaling the query and key weights
    out_dir = trained(tmp_path_factory, dataset, "rope")
    ckpt = torch.load(out_dir / "ckpt.pt", weights_only=True)
    ckpt["model"]["transformer.h.0.attn.c_attn.weight"][:2 * 32] *= 8  # rows of q and k (n_embd 32 each)
    torch.save(ckpt, out_dir / "ckpt.pt")
    return out_dir


@pytest.fixture(scope="module")
def learned_run(tmp_path_factory, dataset):
    return trained(tmp_path_factory, dataset, "learned", pos_emb="learned")


def run(run_dir, out, *argv):
    # 4 windows of the longest length 4L, and as many tokens at the shorter ones; dynamic-ntk in both modes
    chosen = argv[argv.index("--methods") + 1] if "--methods" in argv else "dynamic-ntk"
    modes = ["--dynamic_modes", "sequence,causal"] if "dynamic-ntk" in chosen.split(",") else []
    extrapolate.main([str(run_dir), "--out", str(out), "--tokens", str(16 * L), *modes, "--no-wandb", *argv])
    return json.loads((Path(out) / "extrapolation.json").read_text())


@pytest.fixture(scope="module")
def report(rope_run, tmp_path_factory):
    return run(rope_run, tmp_path_factory.mktemp("eval"), "--lengths", "1,2,4")


def by(report, method, mode=None, protocol="windows"):
    return {r["eval_len"]: r for r in report["results"]
            if r["method"] == method and r["mode"] == mode and r["protocol"] == protocol}


def windows_of(report, eval_len, protocol="windows"):
    return np.array(report["units"][f"{protocol} {eval_len}"])


def test_none_at_1x_is_the_plain_forward_loss(rope_run, report):
    model, _, data_dir, _ = load_run(rope_run)
    tokens, _ = load_split(data_dir, "val")
    rows = torch.tensor(np.stack([tokens[s:s + L + 1] for s in windows_of(report, L)]).astype(np.int64))
    with torch.no_grad():
        _, loss = model(rows[:, :-1], rows[:, 1:])
    assert by(report, "none")[L]["loss"] == pytest.approx(loss.item(), rel=1e-6)


def test_per_position_losses_average_to_the_loss(report):
    for r in report["results"]:
        if r["protocol"] != "windows":
            continue
        curve = np.array(r["loss_by_position"])
        assert len(curve) == r["eval_len"]
        assert curve.mean() == pytest.approx(r["loss"], abs=1e-6)
        if r["eval_len"] > L:
            assert curve[L:].mean() == pytest.approx(r["loss_beyond_train"], abs=1e-6)
            assert r["ppl_beyond_train"] == pytest.approx(np.exp(r["loss_beyond_train"]))
        else:
            assert r["loss_beyond_train"] is None and r["ppl_beyond_train"] is None


def test_every_method_at_factor_1_equals_none(rope_run, report, tmp_path):
    # at 1x (auto factor 1, dynamic unchanged up to the training length, crop's window the whole window,
    # log-n scaling 1, Self-Extend's group 1): every method and mode but ReRoPE, which clips distances from L/2 on
    for r in report["results"]:
        if r["eval_len"] == L and r["protocol"] == "windows" and r["method"] != "rerope":
            assert r["loss_by_position"] == pytest.approx(by(report, "none")[L]["loss_by_position"], abs=1e-5), r["method"]
    # a pinned factor 1 at every length (dynamic-ntk's scale follows the length, so not that one)
    pinned = run(rope_run, tmp_path, "--lengths", "2,4", "--factor", "1", "--methods", "none,pi,ntk,yarn")
    for method in ("pi", "ntk", "yarn"):
        for T, r in by(pinned, method).items():
            assert r["factor"] == 1 and r["loss_by_position"] == pytest.approx(by(pinned, "none")[T]["loss_by_position"], abs=1e-5)


def test_scaling_changes_the_loss_past_the_training_length(report):
    # the opposite of the test above: the methods are really applied (else it would pass vacuously)
    for method, mode in (("pi", None), ("ntk", None), ("yarn", None), ("dynamic-ntk", "sequence"), ("crop", None),
                         ("ntk-by-parts", None), ("llama3", None), ("logn", None), ("ntk+logn", None)):
        assert abs(by(report, method, mode)[4 * L]["loss"] - by(report, "none")[4 * L]["loss"]) > 1e-4, method


def test_pairs_with_one_factor_everywhere_is_pi_and_needs_a_factor_per_pair(rope_run, tmp_path):
    # 8 frequency pairs (head dim 16): the factor 2 on every pair is PI at 2x, no temperature
    rep = run(rope_run, tmp_path, "--lengths", "2", "--protocols", "windows", "--methods", "none,pi,pairs",
              "--pair_factors", ",".join(["2"] * 8))
    pairs, pi = by(rep, "pairs")[2 * L], by(rep, "pi")[2 * L]
    assert pairs["loss_by_position"] == pytest.approx(pi["loss_by_position"], abs=1e-6)
    assert pairs["loss"] != pytest.approx(by(rep, "none")[2 * L]["loss"], abs=1e-4)
    assert "--methods pairs needs --pair_factors" in error_of([str(rope_run), "--methods=pairs", "--check"])
    assert "this model has 8 frequency pairs" in error_of([str(rope_run), "--methods", "pairs", "--pair_factors", "2,2"])


def test_plain_dynamic_ntk_over_a_whole_window_is_ntk_at_the_length_ratio(report):
    # a = 1: base * (T/L)^(d/(d-2)) for a window of length T, which is NTK-aware with the auto factor T/L
    for T, r in by(report, "dynamic-ntk", "sequence").items():
        assert r["loss_by_position"] == pytest.approx(by(report, "ntk")[T]["loss_by_position"], abs=1e-6), T


def test_the_json_has_every_field_for_every_entry(report):
    assert {"train_len", "pos_emb", "run", "checkpoint_iter", "tokens_per_length", "seed", "stride", "bins",
            "seconds_by_method", "units", "results"} <= set(report)
    assert (report["train_len"], report["pos_emb"], report["run"], report["tokens_per_length"]) == (L, "rope", "rope", 16 * L)
    # 15 method (mode)s with windows, 14 with sliding (no causal mode there), at 3 lengths
    assert len(report["results"]) == (15 + 14) * 3 and report["crop_context"] == [L - L // 8 + 1, L]
    for r in report["results"]:
        assert set(ENTRY_FIELDS) <= set(r) and r["available"] and r["reason"] is None
        assert (r["mode"] in ("sequence", "causal")) == (r["method"] == "dynamic-ntk")
        assert r["n_units"] == len(windows_of(report, r["eval_len"], r["protocol"]))
        assert r["tokens"] >= 16 * L and (r["stride"] == r["eval_len"] // 2) == (r["protocol"] == "sliding")
    assert [r["n_units"] for r in by(report, "none").values()] == [16, 8, 4]
    yarn, dyn = by(report, "yarn")[2 * L], by(report, "dynamic-ntk", "causal")[4 * L]
    assert yarn["positions"] == {"rope_scaling": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": L}}
    assert dyn["factor"] == 1 and dyn["positions"] == {
        "rope_scaling": {"rope_type": "dynamic", "factor": 1.0, "original_max_position_embeddings": L}, "causal_dynamic": True}
    assert by(report, "ntk-by-parts")[4 * L]["positions"]["rope_scaling"]["attention_factor"] == 1.0
    assert by(report, "pi")[4 * L]["positions"] == {"rope_scaling": {"rope_type": "linear", "factor": 4.0}}
    assert by(report, "crop")[4 * L]["positions"] == {"crop": L} and by(report, "window")[4 * L]["positions"] == {"window": L}
    assert by(report, "sinks")[4 * L]["positions"] == {"window": L, "sinks": 4}
    assert by(report, "ntk+logn")[4 * L]["positions"] == {"rope_scaling": {"rope_type": "ntk", "factor": 4.0}, "logn_len": L}
    assert by(report, "none")[L]["positions"] == {} and by(report, "none")[L]["factor"] is None


def test_paired_differences_are_over_the_targets_past_L_on_the_same_windows(report):
    for protocol in ("windows", "sliding"):
        none, crop = by(report, "none", protocol=protocol), by(report, "crop", protocol=protocol)
        for T, r in by(report, "yarn", protocol=protocol).items():
            if T == L:  # no target past L
                assert r["diff_none"] is None and r["diff_crop"] is None and r["diff_none_inside"] is not None
                continue
            assert r["diff_none"] == pytest.approx(r["loss_beyond_train"] - none[T]["loss_beyond_train"], abs=1e-9)
            assert r["diff_crop"] == pytest.approx(r["loss_beyond_train"] - crop[T]["loss_beyond_train"], abs=1e-9)
            assert r["diff_none_stderr"] > 0 and len(r["per_unit"]["diff_crop"]) == r["n_units"]
            assert np.mean(r["per_unit"]["diff_crop"]) == pytest.approx(r["diff_crop"], abs=1e-6)
        assert none[4 * L]["diff_none"] is None and crop[4 * L]["diff_crop"] is None
    yarn, none = by(report, "yarn")[4 * L], by(report, "none")[4 * L]
    inside = np.mean(yarn["loss_by_position"][:L]) - np.mean(none["loss_by_position"][:L])
    assert yarn["diff_none_inside"] == pytest.approx(inside, abs=1e-5) and abs(inside) > 1e-4
    # the plotted per-bin difference: the same, bin by bin, past L
    past = [d for x, d in zip(yarn["curve"]["x"], yarn["curve"]["diff_none"]) if x >= L]
    assert np.mean(past) == pytest.approx(yarn["diff_none"], abs=1e-5)


def nll_of_last_token(model, context):
    """NLL of predicting context[-1] from the tokens before it, in one plain forward."""
    x = torch.tensor(context.astype(np.int64))
    with torch.no_grad():
        logits, _ = model(x[None, :-1])
    return F.cross_entropy(logits[0, -1:], x[-1:]).item()


def test_window_is_the_banded_mask_and_sinks_keep_the_first_tokens(rope_run, report):
    none, window = by(report, "none"), by(report, "window")
    assert window[4 * L]["loss_by_position"][:L] == pytest.approx(none[4 * L]["loss_by_position"][:L], abs=1e-5)
    assert window[4 * L]["loss_beyond_train"] != pytest.approx(none[4 * L]["loss_beyond_train"], abs=1e-3)
    # one layer: the banded mask is exactly "each token sees only its last L tokens"; RoPE's relative
    # positions make the offset of those tokens irrelevant
    model, _, data_dir, _ = load_run(rope_run)
    tokens, _ = load_split(data_dir, "val")
    starts, positions = windows_of(report, 4 * L), [L, 2 * L + 5, 4 * L - 1]
    expected = [np.mean([nll_of_last_token(model, tokens[s + p - L + 1:s + p + 2]) for s in starts]) for p in positions]
    assert [window[4 * L]["loss_by_position"][p] for p in positions] == pytest.approx(expected, abs=1e-4)
    # sinks: the first 4 tokens, then the last L - 4 (a StreamingLLM cache, one layer: a plain forward over it)
    sinks = [np.mean([nll_of_last_token(model, np.concatenate([tokens[s:s + 4], tokens[s + p - L + 5:s + p + 2]]))
                      for s in starts]) for p in positions]
    assert [by(report, "sinks")[4 * L]["loss_by_position"][p] for p in positions] == pytest.approx(sinks, abs=1e-4)


@pytest.fixture(scope="module", params=["rope", "learned", "sinusoidal", "alibi", "none"])
def any_run(request, tmp_path_factory, dataset):
    return trained(tmp_path_factory, dataset, request.param, pos_emb=request.param, n_layer=2)


@pytest.mark.parametrize("stride", [1, L // 8])
def test_crop_is_truncation_for_every_encoding(any_run, tmp_path, stride):
    # each target past L from its own last tokens at positions 0.., by an independent forward per target: exactly
    # the last L (stride 1), or with stride S the windows of L ending at L, L + S, ..., 2L, the first past the target
    rep = run(any_run, tmp_path, "--lengths", "1,2", "--protocols", "windows", "--methods", "none,crop",
              "--crop_stride", str(stride))
    crop = by(rep, "crop")[2 * L]
    assert rep["crop_context"] == [L - stride + 1, L] and crop["available"]
    model, _, data_dir, _ = load_run(any_run)
    tokens, _ = load_split(data_dir, "val")
    starts = windows_of(rep, 2 * L)

    def context_start(p):
        return max(0, min(2 * L, L + stride * math.ceil((p + 1 - L) / stride)) - L)
    for p in (1, L - 1, L, L + 2, 2 * L - 1):
        expected = np.mean([nll_of_last_token(model, tokens[s + context_start(p):s + p + 2]) for s in starts])
        assert crop["loss_by_position"][p] == pytest.approx(expected, abs=1e-4), p


def test_sliding_with_stride_equal_to_length_is_non_overlapping_windows(rope_run):
    model, _, data_dir, _ = load_run(rope_run)
    tokens, docs = load_split(data_dir, "val")
    s, T = int(docs[0, 0]), 2 * L
    nll, pos = score_sliding(model, tokens, s, 3 * T, T, T), extrapolate.window_positions(3 * T, "sliding", T, T)
    windows = score_windows(model, tokens, [s, s + T, s + 2 * T], T)
    assert nll == pytest.approx(windows.reshape(-1), abs=1e-6) and list(pos) == list(range(T)) * 3


@pytest.mark.parametrize("n, length, stride", [(100, 32, 16), (97, 32, 5), (64, 64, 7), (40, 32, 32)])
def test_sliding_scores_every_token_once_with_at_least_length_minus_stride_before_it(n, length, stride):
    plan = sliding_windows(n, length, stride)
    targets = [t for start, k in plan for t in range(start + length - k, start + length)]
    assert targets == list(range(n))  # every target once, in order
    for start, k in plan[1:]:
        assert start >= 0 and start + length <= n and length - k >= length - stride


def test_logn_equals_none_up_to_L(report):
    none, logn = by(report, "none")[4 * L], by(report, "logn")[4 * L]
    assert logn["loss_by_position"][:L] == pytest.approx(none["loss_by_position"][:L], abs=1e-6)
    ntk, both = by(report, "ntk")[4 * L], by(report, "ntk+logn")[4 * L]
    assert both["loss_by_position"][:L] == pytest.approx(ntk["loss_by_position"][:L], abs=1e-6)
    assert both["loss_beyond_train"] != pytest.approx(ntk["loss_beyond_train"], abs=1e-4)


def test_log_bins_and_the_benchmark_line(rope_run, tmp_path, capsys):
    rep = run(rope_run, tmp_path, "--lengths", "4", "--methods", "none,yarn", "--protocols", "windows", "--bins", "log")
    x = by(rep, "yarn")[4 * L]["curve"]["x"]
    assert x == sorted(x) and x[0] < 1 and x[-1] > 2 * L and len(x) > 10
    out = capsys.readouterr().out
    assert "2 evaluations in" in out and "yarn " in out and "none " in out
    assert set(rep["seconds_by_method"]) == {"none", "yarn"}


def test_windows_stay_inside_one_held_out_document(rope_run, report, tmp_path):
    _, docs = load_split(load_run(rope_run)[2], "val")
    far = run(rope_run, tmp_path, "--lengths", "8,16", "--methods", "none", "--tokens", "1000000")
    for rep in (report, far):
        for key, starts in rep["units"].items():
            protocol, T = key.split()
            entry = by(rep, "none", protocol=protocol)[int(T)]
            n = entry["tokens"] // entry["n_units"]  # a window, or a sliding stretch
            assert n == int(T) if protocol == "windows" else n >= min(2 * int(T), (docs[:, 1] - docs[:, 0]).max() - 1)
            inside = [(docs[:, 0] <= s) & (s + n + 1 <= docs[:, 1]) for s in starts]  # inputs + the shifted target
            assert all(row.any() for row in inside), key
            assert rep["unit_docs"][key] == [int(np.argmax(row)) for row in inside], key  # the document each unit lies in
    # fewer windows than the budget asks for: use what exists and say how many
    n = by(far, "none")[16 * L]["n_units"]
    assert n == len(far["units"][f"windows {16 * L}"]) == ((docs[:, 1] - docs[:, 0]) // (16 * L + 1)).sum()


def test_causal_dynamic_is_token_by_token_and_differs_from_sequence(rope_run):
    model, _, data_dir, _ = load_run(rope_run)
    tokens, docs = load_split(data_dir, "val")
    T, start = 3 * L, int(docs[0, 0])
    dynamic = {"rope_type": "dynamic", "factor": 1.0, "original_max_position_embeddings": L}
    causal = score_windows(model, tokens, [start], T, method=PositionArgs(rope_scaling=dynamic, causal_dynamic=True))[0]
    sequence = score_windows(model, tokens, [start], T, method=PositionArgs(rope_scaling=dynamic))[0]
    x = torch.tensor(tokens[start:start + T + 1].astype(np.int64))
    cache, reference = KVCache(model.config.n_layer), []
    with torch.no_grad():  # the reference: one token at a time, each step rotates with its own length
        for t in range(T):
            logits, _ = model(x[None, t:t + 1], cache=cache, method=PositionArgs(rope_scaling=dynamic))
            reference.append(F.cross_entropy(logits[0], x[t + 1:t + 2]).item())
    assert causal == pytest.approx(reference, abs=1e-4)
    assert np.abs(causal[L:] - sequence[L:]).max() > 1e-3
    assert model.config.rope_scaling is None  # the scaling was an argument: nothing to put back
    assert causal[:L] == pytest.approx(score_windows(model, tokens, [start], L)[0], abs=1e-5)


def test_none_evaluates_a_run_trained_with_a_scaling_as_trained(tmp_path_factory, dataset, tmp_path):
    trained_with = {"rope_type": "linear", "factor": 2.0}
    run_dir = trained(tmp_path_factory, dataset, "pi2", rope_scaling=trained_with)
    rep = run(run_dir, tmp_path, "--lengths", "1,2", "--methods", "none,pi", "--protocols", "windows")
    none, pi = by(rep, "none"), by(rep, "pi")
    assert none[L]["positions"] == {} and none[L]["factor"] is None
    assert pi[2 * L]["positions"]["rope_scaling"] == {"rope_type": "linear", "factor": 2.0}
    # PI at 2x replaces the trained factor 2 with the same factor 2: the same numbers as none
    assert pi[2 * L]["loss_by_position"] == pytest.approx(none[2 * L]["loss_by_position"], abs=1e-6)
    assert pi[L]["loss"] != pytest.approx(none[L]["loss"], abs=1e-6)  # factor 1 undoes the trained scaling


def test_a_learned_table_is_not_available_past_its_size(learned_run, tmp_path, capsys):
    rep = run(learned_run, tmp_path, "--lengths", "1,2", "--methods", "none,pi,yarn,logn")
    assert "pi, yarn do not apply; evaluating none, logn" in capsys.readouterr().out
    assert [(r["protocol"], r["method"], r["eval_len"]) for r in rep["results"]] == [
        (p, m, T) for p in ("windows", "sliding") for T in (L, 2 * L) for m in ("none", "logn")]
    at_1x, at_2x = by(rep, "none")[L], by(rep, "none")[2 * L]
    assert at_1x["available"] and at_1x["loss"] > 0 and at_1x["reason"] is None
    assert not at_2x["available"] and "learned position table has 32 entries" in at_2x["reason"]
    assert all(at_2x[k] is None for k in LOSS_FIELDS)
    assert (tmp_path / "extrapolation.png").stat().st_size > 0 and "n/a" in extrapolation_table(rep)


def error_of(argv):
    with pytest.raises(SystemExit) as e:
        extrapolate.main(argv)
    message = str(e.value)
    assert message.startswith("extrapolate.py: error: ") and "\n" not in message
    return message


def test_bad_input_is_a_one_line_error(rope_run, dataset, tmp_path):
    assert "no checkpoint at" in error_of([str(tmp_path / "nope")])
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "ckpt.pt").write_bytes(b"not a checkpoint")
    assert "is corrupted or not a ropelab checkpoint" in error_of([str(tmp_path / "bad")])
    assert ("unknown --methods rope2; allowed: none, crop, window, sinks, pi, ntk, dynamic-ntk, yarn, ntk-by-parts, llama3, logn, ntk+logn"
            in error_of([str(rope_run), "--methods", "pi,rope2"]))
    assert "--factor must be >= 1, got 0.5" in error_of([str(rope_run), "--factor", "0.5"])
    assert "--lengths 1000 is 32,000 tokens, and the longest held-out document has" in error_of([str(rope_run), "--lengths", "1,1000"])
    assert "unknown --protocols strided; allowed: windows, sliding" in error_of([str(rope_run), "--protocols", "strided"])
    assert "--stride must be >= 1, got 0" in error_of([str(rope_run), "--stride", "0"])
    assert "--stride 64 is longer than the evaluation length 32" in error_of([str(rope_run), "--lengths", "1", "--stride", "64"])
    assert "argument --bins: invalid choice: 'square' (choose from 'linear', 'log')" in error_of([str(rope_run), "--bins", "square"])
    assert "unknown --dynamic_modes exact" in error_of([str(rope_run), "--dynamic_modes", "exact"])
    assert "--lengths 0.01 is under one token at training length 32" in error_of([str(rope_run), "--lengths", "0.01"])
    # common.pick_device's one line, said once (extrapolate.py does not check the name again)
    assert "device='tpu' is not one of: auto, cpu, cuda, cuda:N, mps" in error_of([str(rope_run), "--device", "tpu"])


def test_data_missing_or_of_another_vocabulary_is_a_one_line_error(rope_run, dataset, tmp_path):
    ckpt = torch.load(rope_run / "ckpt.pt", weights_only=True)
    data = Path(shutil.copytree(dataset, tmp_path / "other"))
    meta = json.loads((data / "meta.json").read_text())
    (data / "meta.json").write_text(json.dumps({**meta, "vocab_size": 1024, "eot_token": 1023}))
    for name, dataset_dir in (("mismatch", data), ("nodata", tmp_path / "gone")):
        torch.save({**ckpt, "config": {**ckpt["config"], "dataset": str(dataset_dir)}}, tmp_path / f"{name}.pt")
    assert "has vocab_size 1024 but checkpoint" in error_of([str(tmp_path / "mismatch.pt")])
    assert "no prepared data" in error_of([str(tmp_path / "nodata.pt")])


def test_cli_exits_nonzero_with_one_line(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "eval" / "extrapolate.py"), str(tmp_path / "nope")],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines() == [f"extrapolate.py: error: no checkpoint at {tmp_path / 'nope'}; "
                                                "train one first: python train.py configs/rope_small.py"]


def test_outputs_csv_png_and_table(report, rope_run, tmp_path):
    out = tmp_path / "o"
    run(rope_run, out, "--lengths", "1,2", "--methods", "none,dynamic-ntk", "--dynamic_modes", "causal")
    csv_rows = (out / "extrapolation.csv").read_text().splitlines()
    # windows: none, dynamic (causal); sliding: none, dynamic (sequence): x 2 lengths
    assert csv_rows[0] == ",".join(CSV_FIELDS) and len(csv_rows) == 1 + 8
    assert (out / "extrapolation.png").stat().st_size > 10_000
    assert "dynamic-ntk (causal)" in extrapolation_table(report) and "2x=64" in extrapolation_table(report)


def test_compare_two_runs(report, rope_run, learned_run, tmp_path, capsys):
    run(learned_run, learned_run, "--lengths", "1,2,4")
    rope_dir = tmp_path / "rope"
    rope_dir.mkdir()
    (rope_dir / "extrapolation.json").write_text(json.dumps(report))
    capsys.readouterr()
    compare.main([str(rope_dir), str(learned_run), "--out", str(tmp_path / "past")])  # by default: loss minus crop past L
    past = (tmp_path / "past" / "compare.md").read_text()
    assert past.startswith("loss minus crop past L") and "| 2x (64) | 4x (128) |" in past and "| rope / crop | 0 (crop) |" in past
    capsys.readouterr()
    compare.main([str(rope_dir), str(learned_run), "--out", str(tmp_path / "cmp"), "--metric", "ppl"])
    md = (tmp_path / "cmp" / "compare.md").read_text()
    assert md == capsys.readouterr().out.split("-> ")[0]
    rows = [line.split(" | ")[0].lstrip("| ") for line in md.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert rows == ["rope / none", "rope / crop", "rope / window", "rope / sinks", "rope / pi", "rope / ntk", "rope / dynamic-ntk (sequence)",
                    "rope / dynamic-ntk (causal)", "rope / yarn", "rope / ntk-by-parts", "rope / llama3", "rope / logn",
                    "rope / ntk+logn", "rope / self-extend", "rope / rerope", "learned / none", "learned / crop", "learned / logn"]
    assert "| learned / none | " in md and md.count("n/a") == 4  # learned none and logn at 2x and 4x
    assert (tmp_path / "cmp" / "compare.png").stat().st_size > 10_000
    with pytest.raises(SystemExit) as e:
        compare.main([str(tmp_path / "nothing"), "--out", str(tmp_path / "cmp2")])
    assert str(e.value) == (f"compare.py: error: no {tmp_path / 'nothing' / 'extrapolation.json'}; "
                            f"evaluate the run first: python eval/extrapolate.py {tmp_path / 'nothing'}")


def test_a_fine_tuned_run_is_scored_from_its_original_length(rope_run, dataset, tmp_path_factory):
    tuned = tmp_path_factory.mktemp("ft") / "tuned"
    cfg = dict(dataset=dataset, out_dir=str(tuned), init_from=str(rope_run), batch_size=4, block_size=2 * L, n_layer=1,
               n_head=2, n_embd=32, rope_scaling={"rope_type": "linear", "factor": 2.0}, max_iters=2, eval_interval=2,
               eval_iters=1, warmup_iters=1, wandb_log=False, device="cpu")
    train.main([f"--{k}={v}" for k, v in cfg.items()])
    report = run(tuned, tmp_path_factory.mktemp("ft_eval"), "--lengths", "1,2,4", "--methods", "none,crop,pi",
                 "--protocols", "windows")
    assert (report["train_len"], report["context_len"]) == (L, 2 * L)
    by = {(r["method"], r["eval_len"]): r for r in report["results"]}
    assert by["pi", 4 * L]["factor"] == 4 and report["crop_context"] == [2 * L - 2 * L // 8 + 1, 2 * L]
    assert by["crop", 2 * L]["loss"] == pytest.approx(by["none", 2 * L]["loss"], abs=1e-6)  # nothing cropped up to 2L
    from lab import probes  # its copy distances are multiples of the original length too: the zero-shot run's trials
    rep = probes.probes(probes.parse_args([str(tuned), "--out", str(tmp_path_factory.mktemp("ft_probes")), "--probes",
                                           "copy", "--distances", "0.5,4", "--methods", "none,crop", "--trials", "2",
                                           "--segment", "4", "--no-wandb"]))
    assert (rep["train_len"], rep["context_len"]) == (L, 2 * L)
    assert {r["distance"] for r in rep["results"]} == {L // 2, 4 * L}


def outputs_of(folder, names):
    return {name: (folder / name).read_bytes() for name in names}


def test_a_run_that_fails_or_has_nothing_to_do_leaves_earlier_outputs_as_they_were(learned_run, rope_run, tmp_path,
                                                                                   monkeypatch):
    # issue 19: every command computes (and draws) before it writes; each failure is one line, exit 1
    names = ("extrapolation.json", "extrapolation.csv", "extrapolation.png")
    run(learned_run, tmp_path, "--lengths", "1", "--methods", "none", "--protocols", "windows")
    before = outputs_of(tmp_path, names)
    common = [str(learned_run), "--out", str(tmp_path), "--no-wandb"]
    assert ("pos_emb=learned: pi do not apply; use --methods none,crop,logn"
            in error_of([*common, "--lengths", "4", "--methods", "pi"]))
    assert ("nothing to evaluate: none at 128 tokens: a learned position table has 32 entries"
            in error_of([*common, "--lengths", "4", "--methods", "none,logn"]))
    assert "--protocols sliding alone draws no extrapolation.png" in error_of([*common, "--protocols", "sliding"])

    def broken(*args):
        raise OSError("the figure failed")
    monkeypatch.setattr("eval.report.extrapolation_plot", broken)  # a failure after the numbers, while drawing
    assert error_of([str(rope_run), "--out", str(tmp_path), "--lengths", "1", "--methods", "none", "--no-wandb"]).endswith(
        "the figure failed")
    assert outputs_of(tmp_path, names) == before and sorted(p.name for p in tmp_path.iterdir()) == sorted(names)


def test_compare_refuses_a_run_with_nothing_to_compare(report, tmp_path):
    for name, results in (("empty", []), ("windows_only", [r for r in report["results"] if r["protocol"] == "windows"])):
        (tmp_path / name).mkdir()
        (tmp_path / name / "extrapolation.json").write_text(json.dumps(dict(report, results=results)))
    for argv, message in (([tmp_path / "windows_only", tmp_path / "empty"], f"{tmp_path / 'empty' / 'extrapolation.json'} has "
                           f"no windows results; re-run eval/extrapolate.py {tmp_path / 'empty'}"),
                          ([tmp_path / "windows_only", "--protocol", "sliding"], "has no sliding results")):
        with pytest.raises(SystemExit) as e:
            compare.main([*map(str, argv), "--out", str(tmp_path / "cmp")])
        assert str(e.value).startswith("compare.py: error: ") and message in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "cmp").exists()  # nothing written


def test_curves_of_an_empty_log_is_one_line_and_writes_nothing(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "log.jsonl").write_text("\n")
    proc = subprocess.run([sys.executable, str(ROOT / "lab" / "curves.py"), str(tmp_path / "run")], capture_output=True,
                          text=True, cwd=tmp_path)  # into the default folder, out/curves
    assert proc.returncode == 1 and proc.stderr.strip().splitlines() == [
        f"curves.py: error: {tmp_path / 'run' / 'log.jsonl'} is empty: no evaluation logged yet; train.py appends one "
        "every eval_interval iterations"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # nor the folders made for it (out/curves)


def test_the_figure_draws_a_handful_of_methods_against_crop_in_bins_that_grow_with_the_length(report):
    x = {T: r["crop_curve"]["x"] for T, r in by(report, "yarn").items()}
    assert len(x[2 * L]) == len(x[4 * L]) == PLOT_BINS and x[4 * L][1] - x[4 * L][0] == 2 * (x[2 * L][1] - x[2 * L][0])
    for T, r in by(report, "pi").items():  # equal bins: their mean is the mean over every target
        crop = by(report, "crop")[T]
        assert np.mean(r["crop_curve"]["diff_crop"]) == pytest.approx(r["loss"] - crop["loss"], abs=1e-5)
    windows = [r for r in report["results"] if r["protocol"] == "windows"]
    drawn, means = plotted(windows, None, L), past_means(windows, L)
    others = sorted((k for k in means if k.split(" (")[0] not in ALWAYS_DRAWN and k != "dynamic-ntk (sequence)"), key=means.get)
    assert drawn == ["none", "pi", "ntk", "yarn", *others[:BEST_N]]  # and the others this run has nearest crop
    assert plotted(windows, ["logn", "crop"], L) == ["logn"]  # crop is the zero line
    assert same_rows(report["results"]) == {"dynamic-ntk (sequence)": "ntk"}  # one forward, two names: drawn once


def test_every_method_has_its_own_colour_and_marker_in_every_figure_and_no_difference_reads_minus_zero():
    assert list(STYLES) == list(METHODS)  # one table, keyed by name: pi is orange in every command's figure
    for i in range(2):
        assert len({style[i] for style in STYLES.values()}) == len(STYLES)
    assert line_style("crop")["ls"] == "--" and line_style("dynamic-ntk (sequence)")["ls"] == "-"
    assert line_style("yarn:beta_fast=4") == dict(line_style("yarn"), ls="--")  # a variant: its method's colour, dashed
    assert (signed(-0.0001), signed(-0.0123), signed(0.5), signed(None)) == ("0.000", "-0.012", "+0.500", "n/a")


def test_dev_and_test_are_the_even_and_odd_held_out_documents():
    docs = np.array([[0, 10], [10, 25], [25, 31], [31, 50], [50, 52]])
    dev, test = held_out(docs, "dev"), held_out(docs, "test")
    assert dev.tolist() == [[0, 10], [25, 31], [50, 52]] and test.tolist() == [[10, 25], [31, 50]]
    assert held_out(docs, "all") is docs
    with pytest.raises(UserError, match="none of them test"):
        held_out(docs[:1], "test")


def test_crop_l_is_crop_before_a_fine_tune_and_leaky_rerope_reports_its_k(rope_run, tmp_path, capsys):
    rep = run(rope_run, tmp_path, "--docs", "dev", "--lengths", "2", "--methods", "none,crop,crop-L,leaky-rerope",
              "--protocols", "windows", "--crop_stride", "8")
    assert f"crop-L: each past {L} from its last {L - 7}..{L}" in capsys.readouterr().out  # the header says crop-L's context
    by = {r["method"]: r for r in rep["results"]}
    assert rep["docs"] == "dev" and by["crop-L"]["per_unit"]["loss"] == by["crop"]["per_unit"]["loss"]  # trained at L: one truncation
    assert by["leaky-rerope"]["positions"]["leak"] == 4  # 64 tokens, L 32, w 16: 16 + 47 / k <= 31 needs k >= 3.13
    assert by["leaky-rerope"]["loss"] != by["none"]["loss"]
