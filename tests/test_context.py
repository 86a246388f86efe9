"""lab/context.py: the fixed-target context sweep, on tiny trained runs, against forwards computed here."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.nn import functional as F

import train
from data.dataset import doc_windows, load_split
from lab import context
from runtime import load_run
from positions import PositionArgs

L, M = 32, 4  # training length of the tiny runs; default targets L // 8
CONTEXTS = [8, 16, 32, 64, 128]  # 0.25x .. 4x


def trained(tmp_path_factory, dataset, name, **kw):
    out_dir = tmp_path_factory.mktemp("runs") / name
    cfg = dict(dataset=dataset, out_dir=str(out_dir), batch_size=8, block_size=L, n_layer=1, n_head=2, n_embd=32,
               max_iters=30, lr_decay_iters=30, warmup_iters=2, learning_rate=3e-3, eval_interval=30, eval_iters=1,
               log_interval=30, wandb_log=False, device="cpu", **kw)
    train.main([f"--{k}={v}" for k, v in cfg.items()])
    return out_dir


def edited(run_dir, folder, edit):
    """A copy of a run with its weights edited in place by edit(state_dict)."""
    ckpt = torch.load(run_dir / "ckpt.pt", weights_only=True)
    edit(ckpt["model"])
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(ckpt, folder / "ckpt.pt")
    return folder


@pytest.fixture(scope="module")
def rope_run(tmp_path_factory, dataset):
    # sharpen attention (q and k rows x 8), as tests/test_eval.py does: positions then change the loss
    def sharpen(sd):
        sd["transformer.h.0.attn.c_attn.weight"][:2 * 32] *= 8
    run_dir = trained(tmp_path_factory, dataset, "rope")
    return edited(run_dir, tmp_path_factory.mktemp("sharp") / "rope", sharpen)


@pytest.fixture(scope="module")
def learned_run(tmp_path_factory, dataset):
    return trained(tmp_path_factory, dataset, "learned", pos_emb="learned")


def sweep(run_dir, out, *argv):
    context.main([str(run_dir), "--out", str(out), "--units", "4", "--contexts", "0.25,0.5,1,2,4", *argv])
    return json.loads((Path(out) / "context.json").read_text())


@pytest.fixture(scope="module")
def report(rope_run, tmp_path_factory):
    return sweep(rope_run, tmp_path_factory.mktemp("ctx"))


def by(report, method):
    return {r["context"]: r for r in report["results"] if r["method"] == method}


def units_of(report, run_dir):
    _, _, data_dir, _ = load_run(run_dir)
    tokens, docs = load_split(data_dir, "val")
    C = max(report["contexts"])
    # the units are the definition's: doc_windows over the held-out documents with the seed
    assert report["starts"] == doc_windows(docs, C + 1, report["units"], np.random.default_rng(report["seed"])).tolist()
    return np.stack([tokens[s:s + C + 1] for s in report["starts"]]).astype(np.int64)


def plain_loss(model, units, c, m):
    """Per unit: one plain forward over its last c input tokens, cross-entropy of the last m predictions."""
    x, y = torch.from_numpy(units[:, -c - 1:-1]), torch.from_numpy(units[:, -c:])
    with torch.no_grad():
        logits, _ = model(x)
    return F.cross_entropy(logits[:, -m:].transpose(1, 2), y[:, -m:], reduction="none").mean(1).numpy()


def test_none_is_a_plain_forward_over_the_last_c_tokens(rope_run, report):
    model, _, _, _ = load_run(rope_run)
    units = units_of(report, rope_run)
    assert report["contexts"] == CONTEXTS and report["units"] == 4 and report["targets"] == M
    for c, r in by(report, "none").items():
        assert r["per_unit"] == pytest.approx(plain_loss(model, units, c, M).tolist(), abs=2e-6), c
        assert r["loss"] == pytest.approx(np.mean(r["per_unit"]), abs=1e-6) and r["ppl"] == pytest.approx(np.exp(r["loss"]))
    # more context changes the numbers (else the equalities above could hold vacuously)
    assert np.abs(np.subtract(by(report, "none")[4 * L]["per_unit"], by(report, "none")[L // 4]["per_unit"])).max() > 1e-4


def exact_crop_loss(model, units, c, m):
    """Per unit: each of the last m targets of its last c + 1 tokens from its own last L tokens, one forward each."""
    rows, losses = units[:, -(c + 1):], []
    for t in range(c - m + 1, c + 1):  # target rows[:, t], its context rows[:, max(0, t - L):t]
        x, y = torch.from_numpy(rows[:, max(0, t - L):t]), torch.from_numpy(rows[:, t])
        with torch.no_grad():
            logits, _ = model(x)
        losses.append(F.cross_entropy(logits[:, -1], y, reduction="none").numpy())
    return np.mean(losses, axis=0)


def test_crop_is_exact_truncation_and_whole_L_the_whole_window_reading(rope_run, report):
    model, _, _, _ = load_run(rope_run)
    units = units_of(report, rope_run)
    crop, none, whole = by(report, "crop"), by(report, "none"), by(report, "whole-L")
    for c in CONTEXTS:
        assert crop[c]["per_unit"] == pytest.approx(exact_crop_loss(model, units, c, M).tolist(), abs=2e-6), c
        assert crop[c]["context_range"] == [min(c - M + 1, L), min(c, L)]
        assert whole[c]["per_unit"] == pytest.approx(plain_loss(model, units, min(c, L), M).tolist(), abs=2e-6), c
        if c <= L:
            assert crop[c]["per_unit"] == none[c]["per_unit"] and crop[c]["diff_crop"] is None
    assert none[4 * L]["diff_crop"] == pytest.approx(none[4 * L]["loss"] - crop[4 * L]["loss"], abs=1e-6)
    assert none[4 * L]["diff_crop"] != pytest.approx(0, abs=1e-4)  # past L, the two really differ


def test_with_L_targets_crop_is_not_the_whole_window(rope_run, tmp_path):
    rep = sweep(rope_run, tmp_path, "--targets", str(L), "--methods", "none,crop,whole-L", "--contexts", "1,2")
    crop, whole = by(rep, "crop"), by(rep, "whole-L")
    assert crop[2 * L]["context_range"] == [L, L] and whole[2 * L]["context_range"] == [1, L]
    assert abs(crop[2 * L]["loss"] - whole[2 * L]["loss"]) > 1e-4


def test_the_targets_are_the_same_at_every_context(rope_run, report, tmp_path):
    for r in report["results"]:
        c, cap = r["context"], L if r["method"] in ("crop", "whole-L") else r["context"]
        assert r["context_range"] == ([min(c - M + 1, cap), min(c, cap)] if r["method"] == "crop"
                                      else [min(c, cap) - M + 1, min(c, cap)])
        assert r["multiple"] == r["context"] / L and r["available"] and r["reason"] is None
    # a model that only looks at the current token (attention and MLP outputs zeroed): its loss on a target
    # does not depend on the context at all, so every method at every context gives the same numbers iff
    # the targets are the same, and those numbers are a table lookup computed here
    def unigram(sd):
        for k in sd:
            if k.endswith("c_proj.weight"):
                sd[k].zero_()
    run_dir = edited(rope_run, tmp_path / "unigram", unigram)
    rep = sweep(run_dir, tmp_path / "out", "--targets", "6")
    model, _, _, _ = load_run(run_dir)
    units = units_of(rep, run_dir)
    with torch.no_grad():
        logp = F.log_softmax(model.lm_head(model.transformer.ln_f(model.transformer.wte.weight)), dim=-1).double()
    expected = (-logp[torch.from_numpy(units[:, -7:-1]), torch.from_numpy(units[:, -6:])]).mean(1).numpy()
    for r in rep["results"]:
        assert r["per_unit"] == pytest.approx(expected.tolist(), abs=2e-6), (r["method"], r["context"])


def test_a_learned_table_cannot_go_past_its_length_but_crop_can(learned_run, tmp_path, capsys):
    rep = sweep(learned_run, tmp_path, "--methods", "none,crop,pi")
    assert "pi do not apply; evaluating none, crop" in capsys.readouterr().out
    none, crop = by(rep, "none"), by(rep, "crop")
    for c in CONTEXTS:
        assert crop[c]["available"] and crop[c]["loss"] > 0
        assert none[c]["available"] == (c <= L)
        if c > L:
            assert "learned position table has 32 entries" in none[c]["reason"]
            assert none[c]["loss"] is None and none[c]["per_unit"] is None and none[c]["diff_crop"] is None


def error_of(argv):
    with pytest.raises(SystemExit) as e:
        context.main(argv)
    message = str(e.value)
    assert message.startswith("context.py: error: ") and "\n" not in message
    return message


def test_bad_input_is_a_one_line_error(rope_run, learned_run, tmp_path):
    run = [str(rope_run), "--out", str(tmp_path)]
    assert "context 3 tokens is shorter than the 4 targets" in error_of([*run, "--contexts", "0.1,1"])
    assert "context 16 tokens is shorter than the 20 targets" in error_of([*run, "--contexts", "0.5,1", "--targets", "20"])
    assert "unknown --methods rope2; allowed: none, crop" in error_of([*run, "--methods", "none,rope2"])
    assert "--units must be >= 1, got 0" in error_of([*run, "--units", "0"])
    assert "--contexts must be positive" in error_of([*run, "--contexts", "1,-2"])
    assert "is not a comma-separated list of numbers" in error_of([*run, "--contexts", "1,two"])
    assert "--contexts 1000 is 32,000 tokens, and the longest held-out document has" in error_of([*run, "--contexts", "1,1000"])
    assert "nothing to evaluate: none at 64 tokens: a learned position table" in error_of(
        [str(learned_run), "--out", str(tmp_path), "--methods", "none", "--contexts", "2,4"])
    assert not list(tmp_path.iterdir())  # nothing written by a failed sweep


def test_the_outputs(report, rope_run, tmp_path, capsys):
    out = tmp_path / "o"
    rep = sweep(rope_run, out, "--methods", "crop,none,yarn")
    printed = capsys.readouterr().out
    assert f"-> {out}/context.{{json,csv,png}}" in printed and "yarn" in printed.split("loss (NLL)")[-1]
    png = (out / "context.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 5000
    lines = (out / "context.csv").read_text().splitlines()
    assert lines[0] == ",".join(context.CSV_FIELDS) and len(lines) == 1 + 3 * len(CONTEXTS)
    assert {"run", "pos_emb", "train_len", "context_len", "units", "targets", "seed", "contexts", "options",
            "seconds", "results"} <= set(rep) and (rep["pos_emb"], rep["train_len"], rep["context_len"]) == ("rope", L, L)
    assert rep["options"][:2] == ["--out", str(out)]
    assert by(rep, "yarn")[2 * L]["per_unit"] == by(report, "yarn")[2 * L]["per_unit"]  # same units, same seed


def test_the_factor_stays_fixed_while_the_context_grows(rope_run, report, tmp_path):
    # default: every context at the largest context's factor (4L here: 4), so PI at c <= L is not `none`
    model, _, _, _ = load_run(rope_run)
    units, pi, none = units_of(report, rope_run), by(report, "pi"), by(report, "none")
    assert report["factor"] == "max" and {r["factor"] for r in pi.values()} == {4.0}
    for c in (L // 4, L, 4 * L):  # against a forward with PI's factor 4 given here
        x, y = torch.from_numpy(units[:, -c - 1:-1]), torch.from_numpy(units[:, -c:])
        with torch.no_grad():
            logits, _ = model(x, method=PositionArgs(rope_scaling={"rope_type": "linear", "factor": 4.0}))
        expected = F.cross_entropy(logits[:, -M:].transpose(1, 2), y[:, -M:], reduction="none").mean(1).numpy()
        assert pi[c]["per_unit"] == pytest.approx(expected.tolist(), abs=2e-6), c
    assert np.abs(np.subtract(pi[L]["per_unit"], none[L]["per_unit"])).max() > 1e-4
    assert none[L]["factor"] is None and context.factor_at("yarn", L // 4, 4 * L, L, "max") == 4.0
    assert context.factor_at("dynamic-ntk", L // 4, 4 * L, L, "max") == 1.0  # its scale follows the length by itself
    # grow: each context its own factor (the confounded sweep); PI at c <= L is then `none`, and at 4L the same as max
    grown = sweep(rope_run, tmp_path / "grow", "--factor", "grow", "--methods", "none,pi")
    assert [by(grown, "pi")[c]["factor"] for c in CONTEXTS] == [1.0, 1.0, 1.0, 2.0, 4.0]
    assert by(grown, "pi")[L]["per_unit"] == by(grown, "none")[L]["per_unit"]
    assert by(grown, "pi")[4 * L]["per_unit"] == pi[4 * L]["per_unit"]
    fixed = sweep(rope_run, tmp_path / "two", "--factor", "2", "--methods", "pi")
    assert {r["factor"] for r in fixed["results"]} == {2.0} and fixed["factor"] == 2.0
    assert by(fixed, "pi")[2 * L]["per_unit"] == by(grown, "pi")[2 * L]["per_unit"]
    assert "--factor must be >= 1" in error_of([str(rope_run), "--out", str(tmp_path), "--factor", "0.5"])


def test_several_runs_averaged_on_the_same_targets(rope_run, learned_run, tmp_path, tmp_path_factory):
    # two seeds of one config (copies of the run under seed names, one with its weights changed) and their means
    seeds = [edited(rope_run, tmp_path / f"rope_seed{k}", lambda sd, k=k: sd["lm_head.weight"].mul_(1 + k))
             for k in (0, 1)]
    argv = ["--units", "4", "--contexts", "0.5,1,2", "--methods", "none,crop"]
    context.main([*map(str, seeds), "--out", str(tmp_path / "mean"), *argv])
    each = [json.loads((s / "context.json").read_text()) for s in seeds]  # each run's sweep in its own folder
    avg = json.loads((tmp_path / "mean" / "context_mean.json").read_text())["means"]
    assert list(avg) == ["rope"]  # the seeds of one config: one row per method
    for method in ("none", "crop"):
        for c in (16, 32, 64):
            losses = [by(rep, method)[c]["loss"] for rep in each]
            mean, se, n = avg["rope"][method][str(c)]
            assert n == 2 and losses[0] != losses[1]  # the weights differ, so the mean is not one run's loss
            assert mean == pytest.approx(sum(losses) / 2) and se == pytest.approx(abs(losses[0] - losses[1]) / 2)
    md = (tmp_path / "mean" / "context_mean.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| rope | none | 2 |"))
    drop = avg["rope"]["none"]["32"][0] - avg["rope"]["none"]["16"][0]
    assert row.split(" | ")[-1].startswith(f"{drop:+.3f}")  # the change per doubling, 16 -> 32 first
    assert "several runs need --out" in error_of([*map(str, seeds), *argv])
    # runs that scored other targets (another training length gives units of another length) are refused
    other = dict(each[1], run="rope_L16_seed0", starts=[s + 1 for s in each[1]["starts"]])
    with pytest.raises(context.UserError, match="run rope_L16_seed0 scored other targets than rope"):
        context.means([each[0], other])
