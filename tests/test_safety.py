"""Issue 19: never lose a run, never train on bad data, every failure one line (train.py, runtime.py, data/, bench.py)."""
import json
import os
import re
import shutil

import numpy as np
import pytest
import torch

import bench
import data.dataset as dataset_module
import data.shakespeare.prepare as shakespeare
import train
from data.dataset import load_meta, prepare_command, shakespeare_vocab
from common import run_cli
from test_train import args, run_main, weights


def one_line(error, *parts):
    # short enough to read, besides the paths it names (a temporary folder's length varies from run to run)
    assert "\n" not in error and len(re.sub(r"/[^\s:;,()]+", "", error)) < 250, error
    assert all(p in error for p in parts), error
    return error


def log_iters(out_dir):
    return [json.loads(line)["iter"] for line in (out_dir / "log.jsonl").read_text().splitlines()]


@pytest.fixture
def copy(dataset, tmp_path):
    """A copy of the prepared tiny corpus, to damage."""
    return shutil.copytree(dataset, tmp_path / "tiny")


# ----------------------------------------------------------------------------- the run folder

def test_a_run_is_never_overwritten_by_accident(dataset, tmp_path):
    train.main(args(dataset, tmp_path, max_iters=10))
    before = (tmp_path / "ckpt.pt").read_bytes()
    one_line(run_main(args(dataset, tmp_path, max_iters=10)), "already holds a run", "--init_from=resume", "--overwrite=True")
    fine_tune = run_main(args(dataset, tmp_path, init_from=str(tmp_path / "ckpt.pt"), block_size=64))
    one_line(fine_tune, "already holds a run")
    assert (tmp_path / "ckpt.pt").read_bytes() == before and log_iters(tmp_path) == [0, 10]
    train.main(args(dataset, tmp_path, max_iters=5, overwrite=True))  # on purpose: replaced, its log started anew
    assert weights(tmp_path)["iter_num"] == 5 and log_iters(tmp_path) == [0, 5]
    assert sorted(p.name for p in tmp_path.parent.glob(f".{tmp_path.name}.*")) == [f".{tmp_path.name}.lock"]  # nothing aside


def test_resume_logs_each_iteration_once(dataset, tmp_path):
    train.main(args(dataset, tmp_path, max_iters=10, eval_interval=5))
    with open(tmp_path / "log.jsonl", "a") as f:  # evaluated after the checkpoint, then killed mid-line
        f.write('{"iter": 15, "train": 9.0, "val": 9.0}\n{"iter": 20, "tr')
    train.main(args(dataset, tmp_path, max_iters=20, eval_interval=5, init_from="resume"))
    assert log_iters(tmp_path) == [0, 5, 10, 15, 20]
    assert json.loads((tmp_path / "log.jsonl").read_text().splitlines()[3])["val"] != 9.0


def test_out_dir_that_is_a_file_is_one_line(dataset, tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("keep me")
    one_line(run_main(args(dataset, readme)), f"out_dir {readme} is a file")
    assert readme.read_text() == "keep me"


# ----------------------------------------------------------------------------- prepared data

@pytest.mark.parametrize("damage, name", [
    ("zeros", "train.bin"), ("random", "train.bin"), ("random", "train_docs.npy"), ("missing", "val.bin"),
    ("no files", "meta.json"), ("not json", "meta.json")])
def test_damaged_data_is_one_line_naming_the_file_and_the_command(copy, tmp_path, damage, name):
    path = copy / name
    size = path.stat().st_size
    if damage == "zeros":
        path.write_bytes(bytes(size))
    elif damage == "random":
        path.write_bytes(np.random.default_rng(0).bytes(size))
    elif damage == "missing":
        path.unlink()
    elif damage == "no files":
        meta = json.loads(path.read_text())
        del meta["files"]
        path.write_text(json.dumps(meta))
    else:
        path.write_text('{"vocab_size": 512, ')
    fix = "re-prepare it: python data/text/prepare.py <source> --name tiny"
    one_line(run_main(args(str(copy), tmp_path / "out")), str(path), fix)
    with pytest.raises(ValueError, match="re-prepare it"):
        load_meta(copy)  # what the evaluation loads
    assert not (tmp_path / "out").exists()


def test_a_large_file_is_hashed_once_until_it_changes(copy, monkeypatch):
    monkeypatch.setattr(dataset_module, "VERIFY_ONCE_BYTES", 0)  # every file counts as large
    hashed = []
    sha256 = dataset_module.file_sha256
    monkeypatch.setattr(dataset_module, "file_sha256", lambda path: hashed.append(path.name) or sha256(path))
    load_meta(copy)
    assert len(hashed) == 4 and set(json.loads((copy / "verified.json").read_text())) == set(dataset_module.DATA_FILES)
    load_meta(copy)
    assert len(hashed) == 4  # remembered: size and mtime unchanged
    tokens = (copy / "train.bin").read_bytes()
    (copy / "train.bin").write_bytes(bytes(len(tokens)))  # same size, new mtime: hashed again, and caught
    os.utime(copy / "train.bin", ns=(1, 1))
    with pytest.raises(ValueError, match="train.bin is damaged"):
        load_meta(copy)


def test_block_size_longer_than_a_split_is_an_error_at_start(dataset, tmp_path):
    n_val = len(dataset_module.load_split(dataset, "val")[0])
    one_line(run_main(args(dataset, tmp_path / "out", block_size=n_val)), f"block_size={n_val}",
             f"does not fit in the val split of {dataset} ({n_val} tokens", f"use block_size <= {n_val - 1}")


def test_another_vocabulary_goes_to_its_own_folder(tmp_path, plays, capsys):
    default = shakespeare.prepare()
    before = {p.name: p.read_bytes() for p in default.iterdir()}
    other = shakespeare.prepare(vocab_size=300)
    assert other == tmp_path / "shakespeare_v300" and "--dataset=shakespeare_v300" in capsys.readouterr().out
    assert load_meta(other)["vocab_size"] == 300 and load_meta(default)["vocab_size"] == 2048
    assert {p.name: p.read_bytes() for p in default.iterdir()} == before  # the runs at 2048 still evaluate
    assert shakespeare.prepare(vocab_size=257) == tmp_path / "shakespeare_bytes"
    assert shakespeare.prepare("shakespeare_v300") == other  # as train.py --dataset=shakespeare_v300 does
    assert [shakespeare_vocab(n) for n in ("shakespeare", "shakespeare_bytes", "shakespeare_v300", "books")] == [
        2048, 257, 300, None]
    assert prepare_command(other) == "python data/shakespeare/prepare.py --vocab_size 300"


# ----------------------------------------------------------------------------- fine-tunes

def test_fine_tune_takes_the_original_length_from_origin(dataset, tmp_path, capsys):
    base, tuned = tmp_path / "base", tmp_path / "tuned"
    train.main(args(dataset, base, max_iters=10))
    yarn = {"rope_type": "yarn", "factor": 2.0}
    train.main(args(dataset, tuned, init_from=str(base), block_size=64, rope_scaling=yarn, max_iters=2, eval_interval=2))
    assert "original_max_position_embeddings=32" in capsys.readouterr().out
    ckpt = weights(tuned)
    assert ckpt["model_args"]["rope_scaling"] == ckpt["config"]["rope_scaling"] == {**yarn, "original_max_position_embeddings": 32}
    train.main(args(dataset, tuned, init_from="resume", block_size=64, rope_scaling=yarn, max_iters=4, eval_interval=2))
    assert weights(tuned)["iter_num"] == 4  # the resumed fine-tune is filled the same way, so it matches


# ----------------------------------------------------------------------------- small one-line errors

@pytest.mark.parametrize("option, why", [("--steps=0", "--steps must be >= 1, got 0"), ("--steps=-3", "got -3"),
                                         ("--steps=abc", "--steps 'abc' is not an integer"),
                                         ("--vocab_size=0", "--vocab_size must be >= 1"),
                                         ("--vocab_size=x", "--vocab_size 'x' is not an integer")])
def test_bench_counts_must_be_positive_integers(option, why):
    with pytest.raises(SystemExit) as e:
        run_cli("bench.py", bench.bench, ["--device=cpu", option])
    one_line(str(e.value), "bench.py: error: " + option.split("=")[0], why)


def test_cuda_on_a_cpu_only_torch_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", None)
    error = run_main(["--device=cuda", f"--out_dir={tmp_path / 'out'}", "--wandb_log=False"])
    one_line(error, "device='cuda' but this torch has no CUDA: ", "CPU-only build", "--device=cpu")


def test_a_config_file_may_import_modules(tmp_path):
    cfg = tmp_path / "c.py"
    cfg.write_text("import math\nimport os.path as _path\nn_layer = int(math.sqrt(16))\n")
    assert train.load_config([str(cfg)])["n_layer"] == 4
    cfg.write_text("from math import pi\n")
    one_line(run_main([str(cfg)]), "unknown config key 'pi'")


def test_a_corrupted_checkpoint_is_a_short_line(dataset, tmp_path):
    train.main(args(dataset, tmp_path, max_iters=10))
    torch.save({"model": tmp_path}, tmp_path / "ckpt.pt")  # a pickled Path: torch's weights-only refusal is a page
    error = one_line(run_main(args(dataset, tmp_path, init_from="resume")), "is corrupted or not a ropelab checkpoint")
    assert len(error.replace(str(tmp_path), "")) < 150  # under 200 with a path of 50
