"""The retrieval probes' generators, the rotation turn counts and the RoPE base bound, against hand computations."""
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from lab.trials import KEY_DIGITS, NEEDLE, QUESTION, passkey_row
from data.synthetic import copy_chunk_row, copy_rows, mix_copies, plant_repeat, random_vocab
from data.tokenizer import gpt2_tokenizer
from lab import probes
from lab.base_bound import smallest_base
from lab.bound import first_negative, trained_freq
from lab.probes import attention_entropy, attention_weights, pair_kind, recording_entropy, rotation_probe
from model import GPT, GPTConfig
from positions import PositionArgs, visible
from rope import apply_rope, rope_tables
from runtime import model_from_checkpoint


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


def test_copy_chunk_rows_repeat_earlier_stretches_at_every_distance():
    rng = np.random.default_rng(1)
    n, copied, distances = 256, [], []
    for _ in range(50):
        row = copy_chunk_row(rng, n, vocab=10**9, longest=16)  # fresh ids never collide: a repeat is a copy
        assert len(row) == n and row.min() >= 0 and row.max() < 10**9
        first, repeats = {}, 0
        for i, t in enumerate(row.tolist()):
            if t in first:
                distances.append(i - first[t])
                repeats += 1
            first.setdefault(t, i)
        copied.append(repeats / n)
    assert 0.35 < np.mean(copied) < 0.6  # half the chunks after the first are copies
    assert min(distances) < n // 8 and max(distances) > 7 * n // 8


def test_mix_copies_replaces_the_fraction_of_rows():
    rows = np.full((8, 65), 5000)
    mix_copies(rows, np.random.default_rng(1), fraction=0.5, longest=8, vocab=100)
    assert (rows[:4] < 100).all() and (rows[4:] == 5000).all()


# `python train.py lab/configs/retrieval_small.py --max_iters=16000` (seed 1337): its weights, config and iteration, the optimizer
# state dropped: a 2x64 RoPE model that copies inside its training length 64 (README, "The lab"; lab/pairs.py runs on it)
COPIER = Path(__file__).parent / "assets" / "copier.pt"


def test_crop_fails_the_copy_probe_past_the_training_length_on_a_model_that_copies():
    model = model_from_checkpoint(torch.load(COPIER, weights_only=True)).eval()
    L = model.config.block_size
    tokens = np.random.default_rng(0).integers(0, 256, 20_000)  # random byte filler: one long document
    args = dict(segment=16, seed=0, distances=[0.5, 2.0], trials=30, methods=["none", "crop", "yarn"], train_len=L)
    top1 = {(r["method"], r["distance"]): r["top1"] for r in probes.copy_probe(model, tokens, np.array([[0, len(tokens)]]), args, 256)}
    assert top1["none", L // 2] > 0.8 and top1["crop", L // 2] == top1["none", L // 2]  # inside L crop changes nothing
    assert top1["crop", 2 * L] < 0.05  # the first copy is outside crop's window: chance is 1/256
    assert top1["yarn", 2 * L] > 0.5  # ... while the model itself can still reach it


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
    report = rotation_probe(model, dict(lengths=[4], methods=["none", "pi", "yarn"], train_len=256))
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
    # B_m on the frequencies used: head dim 32, base 1e4 first fails at 474 (lab/base_bound.py), inside 1024;
    # PI at factor 4 divides every frequency by 4, so B_m(m) = B_(m/4) of the trained ones: first failing at 4 * 474
    m = next(m for m in range(1, 4000) if sum(math.cos(m * t) for t in theta) < 0)
    assert (m, by["none"]["bound_negative_at"], by["pi"]["bound_negative_at"]) == (474, 474, None)


def test_p_rope_pairs_that_do_not_rotate_do_not_turn_in_the_rotation_probe():
    # rope_fraction 0.5: only the 8 highest-frequency of the 16 pairs rotate; the other 8 never turn, under
    # any method (before, the probe rebuilt the frequencies without rope_fraction and showed them turning)
    model = GPT(GPTConfig(block_size=256, vocab_size=16, n_layer=1, n_head=2, n_embd=64, rope_fraction=0.5))
    theta = 10000.0 ** (-np.arange(0, 32, 2) / 32)
    for r in rotation_probe(model, dict(lengths=[4], methods=["none", "pi", "yarn"], train_len=256)):
        assert r["turns_train"][8:] == [0.0] * 8 and r["turns_eval"][8:] == [0.0] * 8
        assert r["kind"][8:] == ["unrotated"] * 8 and r["ratio"][8:] == [None] * 8
        assert np.allclose(r["turns_train"][:8], 256 * theta[:8] / (2 * math.pi), rtol=1e-6)


def test_pairs_scale_only_the_pairs_given_a_factor():
    # the method pairs (LongRoPE's per-pair factors): the 8 fastest pairs kept, the 8 slowest divided by 4
    model = GPT(GPTConfig(block_size=256, vocab_size=16, n_layer=1, n_head=2, n_embd=64))
    factors = [1.0] * 8 + [4.0] * 8
    (r,) = rotation_probe(model, dict(lengths=[4], methods=["pairs"], train_len=256, pair_factors=factors))
    theta = 10000.0 ** (-np.arange(0, 32, 2) / 32)
    assert np.allclose(r["turns_eval"], 1024 * theta / np.array(factors) / (2 * math.pi), rtol=1e-6)
    assert r["kind"] == ["extrapolated"] * 8 + ["interpolated"] * 8 and r["attention_factor"] == 1.0


@pytest.mark.parametrize("args, message", [
    (["--depths", "0,1.5"], "outside [0, 1]"),
    (["--distances", "0,2"], "positive multiples"),
    (["--probes", "copy,foo"], "unknown --probes foo"),
    (["--methods", "none,bogus"], "unknown --methods bogus"),
])
def test_probes_bad_input_is_one_line(tmp_path, args, message):
    out = subprocess.run([sys.executable, "lab/probes.py", str(tmp_path), *args], capture_output=True, text=True)
    assert out.returncode == 1 and message in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_attention_entropy_of_uniform_attention_is_log_of_the_keys_seen():
    # q = 0: every visible key gets the same weight, so query t (seeing t + 1 keys) has entropy log(t + 1);
    # a window of 3 caps it at log 3
    q, k = torch.zeros(2, 3, 6, 4), torch.randn(2, 3, 6, 4)
    def weights(window):
        return (q @ k.transpose(-1, -2)).masked_fill(~visible(6, 6, window, "cpu"), float("-inf")).softmax(-1)
    assert attention_entropy(weights(None)).tolist() == pytest.approx(np.log(np.arange(1, 7)), abs=1e-5)
    capped = attention_entropy(weights(3)).tolist()
    assert capped == pytest.approx(np.log([1, 2, 3, 3, 3, 3]), abs=1e-5)


def test_the_entropy_recorded_in_a_forward_matches_an_explicit_softmax():
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=16, vocab_size=32, n_layer=1, n_head=2, n_embd=16)).eval()
    idx = torch.randint(32, (1, 16))
    attn = model.transformer.h[0].attn
    with torch.no_grad(), recording_entropy(model) as records:
        model(idx)
        x = model.transformer.h[0].ln_1(model.transformer.wte(idx))
        q, k, _ = (t.view(1, 16, 2, 8).transpose(1, 2) for t in attn.c_attn(x).split(16, dim=2))
        cos, sin = rope_tables(model.config, None, 16, torch.arange(16))
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        p = ((q @ k.transpose(-2, -1)) / math.sqrt(8)).masked_fill(~visible(16, 16, None, "cpu"), float("-inf")).softmax(-1)
    expected = -(p * p.clamp_min(1e-30).log()).sum(-1).mean(dim=(0, 1))
    assert len(records[0]) == 1 and records[0][0].tolist() == pytest.approx(expected.tolist(), abs=1e-5)
    model(idx)
    assert len(records[0]) == 1  # the hooks are gone after the block


@pytest.mark.parametrize("method", [
    PositionArgs(extend=(4, None)), PositionArgs(extend=(4, 2)), PositionArgs(extend=(4, None), leak=2), PositionArgs(window=8, sinks=2),
    PositionArgs(rope_scaling={"rope_type": "dynamic", "factor": 1.0}, causal_dynamic=True), PositionArgs(logn_len=8)])
def test_the_entropy_probe_reads_every_way_of_attending(method):
    # ReRoPE, Self-Extend, leaky ReRoPE and exact causal dynamic scaling attend without SDPA: the probe reads them too,
    # and the weights it reads are the ones the attention applies
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=8, vocab_size=32, n_layer=1, n_head=2, n_embd=16)).eval()
    seen = []
    with torch.no_grad(), recording_entropy(model) as records, model.transformer.h[0].attn.attend.register_forward_hook(
            lambda m, inputs, out: seen.append((inputs, out))):
        model(torch.randint(32, (1, 24)), method=method)
    assert len(records[0]) == 1
    entropy = records[0][0]
    assert entropy.shape == (24,) and abs(float(entropy[0])) < 1e-6
    assert (entropy <= torch.log(torch.arange(1.0, 25.0)) + 1e-5).all()  # query t sees at most t + 1 keys
    (q, k, v, *rest), out = seen[0]
    assert torch.allclose(attention_weights(q, k, v, *rest) @ v, out, atol=1e-5)


def test_probes_write_every_output_and_say_whether_the_run_copies(tmp_path_factory, dataset):
    from tests.test_eval import trained
    run_dir = trained(tmp_path_factory, dataset, "retrieval", retrieval_mix=0.5, retrieval_segment=4, retrieval_vocab=16)
    log = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]
    assert log[-1]["iter"] == 40 and 0 <= log[-1]["copy_top1"] <= 1  # the mixture's copy check is logged
    out = tmp_path_factory.mktemp("probes")
    report = probes.probes(probes.parse_args([str(run_dir), "--out", str(out), "--trials", "2", "--segment", "4",
                                             "--distances", "0.5,2", "--lengths", "2,4", "--depths", "0,1",
                                             "--methods", "none,crop,yarn", "--no-wandb"]))
    for name in ("probes.json", "probes.csv", "probe_copy.png", "probe_passkey.png", "probe_rotation.png", "probe_entropy.png"):
        assert (out / name).is_file()
    by = {p: [r for r in report["results"] if r["probe"] == p] for p in probes.PROBES}
    assert len(by["copy"]) == 2 * 3 and len(by["passkey"]) == 2 * 2 * 3 and len(by["entropy"]) == 2 * 3
    assert {r["distance"] for r in by["copy"]} == {16, 64} and report["random_vocab"] == 16
    inside = [r["top1"] for r in by["copy"] if r["method"] == "none" and r["distance"] == 16]
    assert report["retrieval"]["inside_top1"] == pytest.approx(inside[0])
    assert report["retrieval"]["retrieves"] == (inside[0] >= probes.RETRIEVES)
    assert all(r["trials"] == 2 and 0 <= r["exact"] <= 1 for r in by["passkey"])
    uniform = [r for r in by["entropy"] if r["method"] == "none" and r["eval_len"] == 64][0]
    assert all(0 <= e <= u + 1e-6 for e, u in zip(uniform["entropy"], uniform["uniform"]))  # below the uniform maximum


def test_a_learned_table_gets_only_crop_past_its_length(tmp_path_factory, dataset):
    from tests.test_eval import trained
    run_dir = trained(tmp_path_factory, dataset, "learned", pos_emb="learned")
    report = probes.probes(probes.parse_args([str(run_dir), "--out", str(tmp_path_factory.mktemp("p")), "--trials", "2",
                                             "--segment", "4", "--distances", "0.5,2", "--lengths", "2,4",
                                             "--depths", "0.5", "--probes", "copy,passkey", "--no-wandb"]))
    assert report["methods"] == ["none", "crop"]  # the RoPE methods do not apply
    for r in report["results"]:
        assert r["available"] == (r["eval_len"] <= 32 or r["method"] == "crop"), r


def test_the_base_bound_note_names_where_the_bound_fails_and_counts_p_rope_unrotated_pairs():
    from lab.bound import base_bound_note
    # head dim 32, base 1e4: B_m first < 0 at m = 474 (lab/base_bound.py's table), inside 16 x 256
    assert "from distance 474" in base_bound_note(GPTConfig(vocab_size=10))
    assert "from distance 3478" in base_bound_note(GPTConfig(vocab_size=10, rope_base=1e6))
    assert base_bound_note(GPTConfig(vocab_size=10, rope_base=smallest_base(32, 4096))) is None
    # p-RoPE with half the pairs unrotated: each adds 1 to B_m, which then never falls below 0
    assert first_negative(trained_freq(32, 1e4, 0.5), 4096) is None
    assert base_bound_note(GPTConfig(vocab_size=10, rope_fraction=0.5)) is None


def probe_error(argv):
    with pytest.raises(SystemExit) as e:
        probes.main(argv)
    assert str(e.value).startswith("probes.py: error: ") and "\n" not in str(e.value)
    return str(e.value)


def test_probes_with_nothing_to_measure_are_one_line_errors_that_write_nothing(tmp_path_factory, dataset, tmp_path):
    # issue 19: asking for nothing that can be measured writes nothing (before, rotation on a learned run exited 0
    # with an empty probes.json, and entropy past the table failed while plotting)
    from tests.test_eval import trained
    run_dir = trained(tmp_path_factory, dataset, "learned", pos_emb="learned")
    (tmp_path / "probes.json").write_text("earlier")
    common = [str(run_dir), "--out", str(tmp_path), "--trials", "2", "--segment", "4", "--no-wandb"]
    assert "nothing to probe: the rotation probe needs RoPE, not pos_emb=learned" in probe_error([*common, "--probes", "rotation"])
    assert ("nothing to probe: none at 64 tokens: a learned position table has 32 entries"
            in probe_error([*common, "--probes", "entropy", "--lengths", "2,4"]))
    assert "pos_emb=learned: pi do not apply; use --methods none,crop,logn" in probe_error([*common, "--methods", "pi"])
    assert [p.name for p in tmp_path.iterdir()] == ["probes.json"] and (tmp_path / "probes.json").read_text() == "earlier"
    # beside a probe with something to show, one with nothing available gets no figure (and no plotting error)
    probes.probes(probes.parse_args([*common, "--probes", "copy,entropy", "--lengths", "2", "--distances", "0.5,2"]))
    assert {p.name for p in tmp_path.iterdir()} == {"probes.json", "probes.csv", "probe_copy.png"}


def test_a_copy_probe_without_a_distance_inside_the_training_length_says_n_a(tmp_path_factory, dataset, tmp_path, capsys):
    # before: a TypeError formatting inside_top1=None, after probes.json was already replaced
    from tests.test_eval import trained
    run_dir = trained(tmp_path_factory, dataset, "rope")
    for argv in (["--distances", "2"], ["--distances", "0.5", "--segment", "40"]):  # every window longer than L = 32
        report = probes.probes(probes.parse_args([str(run_dir), "--out", str(tmp_path), "--probes", "copy", "--trials", "2",
                                                 "--methods", "none,crop", "--no-wandb", *argv]))
        assert report["retrieval"] == dict(inside_top1=None, retrieves=False, threshold=probes.RETRIEVES)
        assert "top-1 n/a -> not checked" in capsys.readouterr().out and (tmp_path / "probe_copy.png").is_file()


def test_entropy_and_the_copy_check_count_inside_from_the_original_training_length(dataset):
    # a run fine-tuned at 64 from one trained at 16: "beyond train" is past 16, as in pairs.py and the losses
    from data.dataset import load_split
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=64, vocab_size=512, n_layer=1, n_head=2, n_embd=16)).eval()
    tokens, docs = load_split(dataset, "val")
    args = dict(seed=0, lengths=[4.0], train_len=16, methods=["none"], pair_factors=None)
    (entry,) = probes.entropy_probe(model, tokens, docs, args)
    assert entry["eval_len"] == 64 and entry["entropy_beyond_train"] == pytest.approx(np.mean(entry["entropy"][16:]), abs=1e-4)
    copies = [dict(method="none", available=True, eval_len=n, top1=t) for n, t in ((16, 0.9), (64, 0.1))]
    assert probes.retrieval_check(copies, 16)["inside_top1"] == 0.9
    assert probes.retrieval_check(copies, 16)["retrieves"] and probes.retrieval_check(copies, 16, text=True)["retrieves"] is None
