"""Never lose data, round three: a refused command leaves everything as it was, resume checks what a run was trained
from, leftovers of a killed writer are removed, and bad input or a bad environment is one line (docs/reference.md,
"Errors and promises")."""
import errno
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

import common
import runfolder
import runtime
import train
from data.text.prepare import prepare
from eval import extrapolate
from lab import context, probes
from model import GPT, GPTConfig
from test_promises import error, tiny_run
from test_safety import log_iters, one_line
from test_train import args, run_main, weights

ROOT = Path(__file__).resolve().parents[1]


def snapshot(folder):
    return {p.name: p.read_bytes() for p in Path(folder).iterdir() if p.is_file() and p.name != ".lock"}


def other_corpus(tmp_path):
    """A second tiny corpus, of other words (another text than conftest's, the same vocabulary)."""
    folder = tmp_path / "other_texts"
    folder.mkdir()
    rng = np.random.default_rng(1)
    for i in range(4):
        (folder / f"d{i}.txt").write_text(" ".join(rng.choice("a b c d e f g h i j".split(), 3000)))
    return str(prepare(folder, vocab_size=512, out_dir=tmp_path / "other"))


# ----------------------------------------------------------------------------- a refused command changes nothing

def test_a_refused_overwrite_keeps_the_run_it_would_replace(dataset, tmp_path, monkeypatch):
    run = tmp_path / "run"
    train.main(args(dataset, run, max_iters=10))
    before = snapshot(run)
    wide = tmp_path / "wide"
    train.main(args(dataset, wide, n_embd=64, max_iters=2, eval_interval=2))
    for refused, why in ((dict(dataset=str(tmp_path / "nope")), "no prepared data"),
                         (dict(block_size=300000), "does not fit"),
                         (dict(init_from=str(wide)), "does not match")):
        one_line(run_main(args(refused.pop("dataset", dataset), run, overwrite=True, **refused)), why)
        assert snapshot(run) == before and not runfolder.replaced(run).exists(), refused
    # checked and started, then stopped before its first checkpoint: the old run comes back
    monkeypatch.setattr(train, "estimate_loss", lambda *a: {"train": float("nan"), "val": float("nan")})
    one_line(run_main(args(dataset, run, overwrite=True)), "not finite at iter 0")
    assert snapshot(run) == before
    monkeypatch.undo()
    train.main(args(dataset, run, max_iters=4, eval_interval=2, overwrite=True))  # on purpose: replaced
    assert weights(run)["iter_num"] == 4 and log_iters(run) == [0, 2, 4]
    assert not runfolder.replaced(run).exists()


def test_a_log_without_a_checkpoint_is_not_replaced_without_overwrite(dataset, tmp_path):
    tmp_path.joinpath("log.jsonl").write_text('{"iter": 0, "train": 6.0, "val": 6.0}\n')
    message = one_line(run_main(args(dataset, tmp_path)), "already holds a run (log.jsonl)", "--overwrite=True")
    assert "--init_from=resume" not in message and log_iters(tmp_path) == [0]
    train.main(args(dataset, tmp_path, overwrite=True))
    assert log_iters(tmp_path) == [0, 10]


# ----------------------------------------------------------------------------- provenance

def test_resume_with_other_data_or_settings_is_one_line_naming_what_differs(dataset, tmp_path):
    run = tmp_path / "run"
    train.main(args(dataset, run, max_iters=10))
    assert weights(run)["data"]["sha256"]["train.bin"] == json.loads(Path(dataset, "meta.json").read_text())["files"][
        "train.bin"]["sha256"]
    before = snapshot(run)
    other = other_corpus(tmp_path)
    one_line(run_main(args(other, run, max_iters=20, init_from="resume")), "trained otherwise", "dataset=", "other text",
             "fine-tune from it")
    one_line(run_main(args(dataset, run, max_iters=20, init_from="resume", learning_rate=0.01)),
             "learning_rate=0.002 (now 0.01)")
    one_line(run_main(args(dataset, run, max_iters=20, init_from="resume", seed=7)), "seed=1337 (now 7)")
    assert snapshot(run) == before  # the log does not mix two corpora
    train.main(args(dataset, run, max_iters=20, lr_decay_iters=40, init_from="resume", device="cpu", log_interval=2))
    assert weights(run)["iter_num"] == 20  # how long it trains and how it runs may change


# ----------------------------------------------------------------------------- leftovers

def test_a_killed_writers_temporary_files_are_removed_by_the_next_run(dataset, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    # a writer killed (its process ended), and one writing now (this process, another file in that folder)
    dead, live = run / f".ckpt.pt.{ended.stdout.strip()}.tmp", run / f".extrapolation.json.{os.getpid()}.tmp"
    for f in (dead, live):
        f.write_bytes(b"x" * 1000)
    train.main(args(dataset, run, max_iters=2, eval_interval=2))
    assert not dead.exists() and live.exists()
    corpus = Path(tmp_path / "corpus")
    texts = tmp_path / "texts"
    texts.mkdir()
    for i in range(3):
        (texts / f"d{i}.txt").write_text(f"word {i} " * 100)
    prepare(texts, vocab_size=512, out_dir=corpus)
    leftover = corpus / f".train.bin.{ended.stdout.strip()}.tmp"
    leftover.write_bytes(b"x" * 1000)
    prepare(texts, vocab_size=512, out_dir=corpus)  # the same inputs: nothing to prepare, but the leftover goes
    assert not leftover.exists()


# ----------------------------------------------------------------------------- bad input refused

def test_outputs_inside_the_repositorys_own_folders_are_refused(dataset, tmp_path):
    run = tiny_run(tmp_path / "run", dataset)
    for folder in ("configs/x", "eval", "lab/out", "tests/x", ".", "data/shakespeare", "data"):
        one_line(run_main(args(dataset, ROOT / folder)), "inside the repository's", "--out_dir")
        one_line(error("extrapolate.py", extrapolate.main, [str(run), "--out", str(ROOT / folder), "--device", "cpu"]),
                 "inside the repository's", "--out")
    assert not (ROOT / "configs" / "x").exists() and not (ROOT / "lab" / "out").exists()


def test_training_lengths_too_short_to_evaluate_are_refused_and_an_old_run_skips_those_methods(dataset, tmp_path):
    for bad in (1, 4):
        one_line(run_main(args(dataset, tmp_path / "r", block_size=bad)), f"block_size={bad} is too short",
                 "block_size >= 5")
    old = tmp_path / "old"  # trained before the refusal, at block_size 2
    cfg = GPTConfig(vocab_size=512, block_size=2, n_layer=1, n_head=2, n_embd=32)
    old.mkdir()
    torch.save({"model": GPT(cfg).state_dict(), "model_args": dict(vars(cfg)), "iter_num": 0,
                "config": {"dataset": dataset, "wandb_log": False}}, old / "ckpt.pt")
    report = extrapolate.main([str(old), "--lengths", "1,4", "--tokens", "64", "--device", "cpu", "--no-wandb"])
    why = {r["method"]: r["reason"] for r in report["results"] if not r["available"]}
    assert set(why) == {"sinks"} and "block_size >= 5" in why["sinks"]


def test_factors_that_would_overflow_the_math_are_refused(dataset, tmp_path):
    run = tiny_run(tmp_path / "run", dataset)
    for option in (["--factor", "1e308", "--methods", "ntk"], ["--dynamic_factor", "1e308"],
                   ["--methods", "pairs", "--pair_factors", ",".join(["1e308"] * 8)]):
        one_line(error("extrapolate.py", extrapolate.main, [str(run), *option, "--device", "cpu"]), "is too large",
                 "<= 1e+06")
    one_line(run_main(args(dataset, tmp_path / "r", rope_scaling={"rope_type": "ntk", "factor": 1e308})), "at most 1e+06")


# ----------------------------------------------------------------------------- vague errors, now precise

def test_lengths_past_the_held_out_text_are_a_short_line_in_multiples_of_the_training_length(dataset, tmp_path):
    run = tiny_run(tmp_path / "run", dataset)
    for prog, main, option in (("extrapolate.py", extrapolate.main, "--lengths"), ("probes.py", probes.main, "--distances"),
                               ("probes.py", probes.main, "--lengths"), ("context.py", context.main, "--contexts")):
        message = one_line(error(prog, main, [str(run), option, "1e300", "--device", "cpu"]), f"{option} below",
                           "multiples of the training length 32")
        assert len(message) < 200, message


def test_a_corpus_too_small_for_any_model_says_so(dataset, tmp_path, monkeypatch):
    split = runtime.load_split
    monkeypatch.setattr(runtime, "load_split", lambda folder, s: (split(folder, s)[0][:1 if s == "val" else None], None))
    message = one_line(run_main(args(dataset, tmp_path)), "val split", "1 tokens", "too few for any model")
    assert "<= 0" not in message


def test_a_read_only_corpus_folder_names_the_options_that_choose_another(tmp_path, plays, monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setattr(plays, "DATA_DIR", tmp_path / "file" / "shakespeare")  # the corpus folder cannot be made
    monkeypatch.setattr(runtime, "data_dir", lambda name: tmp_path / "file" / name)
    message = one_line(run_main(args("shakespeare", tmp_path / "run")), "cannot be written", "prepare.py --out_dir",
                       "train.py: --dataset=")
    assert "another --out " not in message and "another --out;" not in message


# ----------------------------------------------------------------------------- a bad environment

def test_a_full_disk_while_checkpointing_is_one_line_and_keeps_the_checkpoint(dataset, tmp_path, monkeypatch):
    train.main(args(dataset, tmp_path, max_iters=10))
    before = (tmp_path / "ckpt.pt").read_bytes()

    class Full(io.FileIO):  # the disk fills up while the checkpoint is written
        def write(self, data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(common, "open", lambda path, mode="r", *a: Full(path, "w") if ".ckpt.pt." in str(path)
                        else open(path, mode, *a), raising=False)
    message = one_line(run_main(args(dataset, tmp_path, max_iters=20, init_from="resume")), "No space left",
                       "cannot write", "kept")
    assert "at iter 10" in message and (tmp_path / "ckpt.pt").read_bytes() == before
    assert not list(tmp_path.glob(".ckpt.pt.*.tmp"))
