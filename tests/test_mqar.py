"""MQAR rows, the retrieval_task mixture (copy bit-identical to before), the mqar probe and the copy probe's text source."""
import csv
import hashlib
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from config import DEFAULTS, load_config
from data.dataset import get_rows
from data.synthetic import copy_rows, mix_copies, mix_mqar, mix_retrieval, mqar_batch, mqar_rows
from lab import probes, trials
from runtime import model_from_checkpoint
from tests.test_probes import COPIER


MARK = 10 ** 6  # a filler id no key or value can equal: what the rows leave of the filler shows


def check_mqar_row(row, mask, pairs, vocab):
    """The row's (query position, distance to its key) pairs, after checking every MQAR property of it."""
    keys, values = row[0:2 * pairs:2].tolist(), row[1:2 * pairs:2].tolist()
    assert len(set(keys)) == pairs and len(set(values)) == pairs  # distinct, as Zoology's
    assert all(0 <= k < vocab // 2 for k in keys) and all(vocab // 2 <= v < vocab for v in values)  # disjoint ranges
    queries = [i for i in range(2 * pairs, len(row)) if row[i] in keys]
    assert sorted(row[queries].tolist()) == sorted(keys)  # each key asked exactly once after the pairs
    for q in queries:
        assert row[q + 1] == values[keys.index(row[q])]  # the value paired with that key earlier
    assert np.flatnonzero(mask).tolist() == [q + 1 for q in queries]  # scored: exactly the values after the queries
    return [(q, q - 2 * keys.index(row[q])) for q in queries]


def test_mqar_rows_pair_keys_with_values_and_ask_them_at_the_given_positions():
    rng, pairs, vocab = np.random.default_rng(0), 5, 40
    filler = np.full((50, 60), MARK)
    at = [2 * pairs + np.sort(rng.choice(np.arange(0, 48, 2), pairs, replace=False)) for _ in range(50)]
    rows, mask = mqar_rows(filler, rng, pairs, vocab, at)
    assert (filler == MARK).all() and rows.shape == mask.shape == filler.shape  # the filler is copied, not written
    for row, m, where in zip(rows, mask, at):
        assert [q for q, _ in check_mqar_row(row, m, pairs, vocab)] == where.tolist()
        untouched = np.ones(len(row), bool)
        untouched[:2 * pairs], untouched[where], untouched[where + 1] = False, False, False
        assert (row[untouched] == MARK).all()
    assert len({tuple(r[:2 * pairs:2]) for r in rows}) == 50  # fresh keys per row
    for bad in ([[8, 12, 14, 16, 18]],  # inside the pairs
                [[10, 11, 14, 16, 18]],  # overlapping queries
                [[10, 12, 14, 16, 59]]):  # no room for the last value
        with pytest.raises(ValueError, match="queries at"):
            mqar_rows(np.full((1, 60), MARK), rng, pairs, vocab, bad)
    with pytest.raises(ValueError, match="vocab // 2"):
        mqar_rows(np.full((1, 60), MARK), rng, pairs, 8, [[10, 12, 14, 16, 18]])


def test_the_probe_layout_asks_every_pair_at_the_distance_on_average():
    # the mqar probe's rows: pairs at the start, the queries' block d tokens later, shuffled (in order it would be a copy)
    rng, pairs, d = np.random.default_rng(1), 4, 100
    rows, mask = mqar_rows(np.full((30, d + 2 * pairs), MARK), rng, pairs, 64, [d + 2 * np.arange(pairs)] * 30)
    orders = set()
    for row, m in zip(rows, mask):
        dist = [g for _, g in check_mqar_row(row, m, pairs, 64)]
        assert np.mean(dist) == d and all(abs(g - d) <= 2 * (pairs - 1) for g in dist)
        orders.add(tuple(dist))
    assert len(orders) > 5  # the order is shuffled


def test_training_mqar_rows_practise_every_distance_and_replace_the_fraction():
    rng, pairs, vocab, n = np.random.default_rng(2), 4, 32, 65
    rows, mask = mqar_batch(rng, 400, n, pairs, vocab)
    # distractors share the keys' distribution (Zoology), so a key may recur in the filler: check on the mask instead
    assert rows.min() >= 0 and rows.max() < vocab and mask.sum(axis=1).tolist() == [pairs] * 400
    q = [np.flatnonzero(m) - 1 for m in mask]
    distances = [p - 2 * row[:2 * pairs:2].tolist().index(row[p]) for row, ps in zip(rows, q) for p in ps]
    assert all(row[p + 1] == row[2 * row[:2 * pairs:2].tolist().index(row[p]) + 1] for row, ps in zip(rows, q) for p in ps)
    assert min(distances) <= 4 and max(distances) >= n - 4  # from just after the pairs to the end of the row
    assert 0.35 * n < np.mean(distances) < 0.65 * n  # uniform slots, not Zoology's short-gap power law
    batch = np.full((8, n), 5000)
    mix_mqar(batch, rng, fraction=0.5, pairs=pairs, vocab=vocab)
    assert (batch[:4] < vocab).all() and (batch[4:] == 5000).all() and mask.dtype == bool
    with pytest.raises(ValueError, match="need 16 tokens"):
        mqar_batch(rng, 1, 15, 4, vocab)


# sha256 of 3 training batches (get_rows then mix_copies, as train.py mixed them before retrieval_task existed) and of
# copy_rows' probe rows, computed with the code before this change
COPY_BATCHES = "66352892757eded9ab4975e02c2cff724a6501bc08c00761e5d0ff61372d4725"
COPY_ROWS = "30b14a983b6bb61a004e9f681099d6363bd2252ee594fca3bb7e68a33b66d773"


def batches(config):
    tokens, rng = np.arange(5000, dtype=np.uint16) % 300, np.random.default_rng(1337)
    out = []
    for _ in range(3):
        rows = get_rows(tokens, 16, 64, rng)
        mix_retrieval(rows, rng, config, 256)
        out.append(rows)
    return hashlib.sha256(np.stack(out).astype(np.int64).tobytes()).hexdigest()


def test_the_copy_task_gives_the_same_batches_as_before():
    copy = dict(DEFAULTS, retrieval_mix=0.5, retrieval_segment=16)
    assert copy["retrieval_task"] == "copy" and batches(copy) == COPY_BATCHES
    assert batches(dict(copy, retrieval_task="mqar")) != COPY_BATCHES
    rows = copy_rows(np.zeros((4, 81)), np.random.default_rng(0), 16, [16, 32, 48, 64], 256)
    assert hashlib.sha256(rows.tobytes()).hexdigest() == COPY_ROWS
    old = get_rows(np.arange(5000, dtype=np.uint16) % 300, 16, 64, np.random.default_rng(5))
    new = old.copy()
    mix_copies(old, np.random.default_rng(6), 0.5, 16, 256)
    mix_retrieval(new, np.random.default_rng(6), copy, 256)
    assert (old == new).all()


def test_copy_rows_plant_the_given_text_segments():
    segs = np.array([[7, 8, 9], [4, 5, 6]])
    rows = copy_rows(np.full((2, 20), MARK), np.random.default_rng(0), 3, [5, 9], 256, segs)
    assert rows[0, -3:].tolist() == rows[0, -8:-5].tolist() == [7, 8, 9]
    assert rows[1, -3:].tolist() == rows[1, -12:-9].tolist() == [4, 5, 6] and (rows[1, :-12] == MARK).all()


def test_text_copy_trials_plant_one_stretch_of_the_text_twice_d_tokens_apart():
    tokens = np.arange(10_000)  # every stretch of this "text" counts up by one: a planted stretch is recognisable
    args = dict(segment=8, seed=0, distances=[0.5, 2.0], trials=5, copy_source="text")
    for d, rows in trials.copy_trials(tokens, np.array([[0, len(tokens)]]), 64, args, 256):
        first = rows[:, 1:9]
        assert (rows[:, 1 + d:9 + d] == first).all() and (rows[:, -8:] == first).all()  # the repeat ends the row
        assert (np.diff(first, axis=1) == 1).all() and (first[:, 0] != rows[:, 0] + 1).any()  # text, not the filler's own


def test_an_unknown_retrieval_task_or_copy_source_is_a_one_line_error(tmp_path):
    with pytest.raises(ValueError, match="retrieval_task='foo' .* is not one of: copy, mqar"):
        load_config(["--retrieval_task=foo"])
    for cmd, message in ((["train.py", "--retrieval_task=foo"], "not one of: copy, mqar"),
                         (["lab/probes.py", str(tmp_path), "--copy_source", "bytes"], "not one of: random, text")):
        out = subprocess.run([sys.executable, *cmd], capture_output=True, text=True)
        assert out.returncode == 1 and message in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_the_copier_recalls_pairs_inside_its_length_and_crop_fails_past_it():
    model = model_from_checkpoint(torch.load(COPIER, weights_only=True)).eval()
    L = model.config.block_size
    # filler: random byte ids >= 128, never a key (keys < 128): a miss is the model's, not a distractor's
    tokens = np.random.default_rng(0).integers(128, 256, 20_000)
    args = dict(segment=8, seed=0, distances=[0.5, 2.0], trials=30, methods=["none", "crop", "yarn"], train_len=L)
    rs = list(probes.mqar_probe(model, tokens, np.array([[0, len(tokens)]]), args, 256))
    assert len(rs) == 2 * 3 and all(r["available"] and r["trials"] == 30 and len(r["hits"]) == 30 for r in rs)
    assert all(0 <= h <= 1 for r in rs for h in r["hits"])
    top1 = {(r["method"], r["distance"]): r["top1"] for r in rs}
    assert top1["none", L // 2] > 0.8 and top1["crop", L // 2] == top1["none", L // 2]  # inside L crop changes nothing
    assert top1["crop", 2 * L] < 0.1  # the pairs are outside crop's window: chance is 1/128
    assert top1["yarn", 2 * L] > 0.3  # ... while the model itself can still reach them
    text = list(probes.copy_probe(model, tokens, np.array([[0, len(tokens)]]), dict(args, copy_source="text"), 256))
    assert all(0 <= h <= 1 for r in text for h in r["hits"]) and len(text) == 2 * 3


def test_an_mqar_run_logs_its_accuracy_and_the_probe_writes_its_figure_and_rows(tmp_path_factory, dataset):
    from tests.test_eval import trained
    run_dir = trained(tmp_path_factory, dataset, "mqar", retrieval_mix=0.5, retrieval_segment=4, retrieval_vocab=16,
                      retrieval_task="mqar")
    log = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]
    assert 0 <= log[-1]["mqar_acc"] <= 1 and "copy_top1" not in log[-1]
    out = tmp_path_factory.mktemp("mqar_probe")
    report = probes.probes(probes.parse_args([str(run_dir), "--out", str(out), "--probes", "mqar,copy", "--trials", "2",
                                             "--segment", "4", "--distances", "0.5,2", "--methods", "none,crop",
                                             "--copy_source", "text", "--no-wandb"]))
    assert (out / "probe_mqar.png").is_file() and (out / "probe_copy.png").is_file() and report["copy_source"] == "text"
    # text is predictable without its first copy: no top-1 threshold judges copying, so the run is not called a copier
    assert report["retrieval"]["retrieves"] is None and report["retrieval"]["inside_top1"] is not None
    assert "not judged" in probes.copy_verdict(report["retrieval"])
    rows = [r for r in csv.DictReader((out / "probes.csv").open()) if r["probe"] == "mqar"]
    assert {(r["method"], r["distance"]) for r in rows} == {(m, d) for m in ("none", "crop") for d in ("16", "64")}

