"""The promises of docs/reference.md ("Errors and promises"): nothing replaced without --overwrite, outputs
guarded, numbers finite, one line per bad input (and no traceback), in every command that takes the input."""
import argparse
import json
import shutil
from pathlib import Path

import pytest
import torch

import data.shakespeare.prepare as shakespeare
import data.sympy.prepare as sympy_prepare
import data.text.prepare as text_prepare
import sample
import train
from config import load_config
from data.dataset import load_meta
from eval import compare, extrapolate
from lab import base_bound, context, curves, pairs, probes, study
from eval.report import json_csv
from model import GPT, GPTConfig
from common import json_text, open_locked, parse_number, parse_list, run_cli
from test_safety import log_iters, one_line
from test_train import args, run_main, weights

ROOT = Path(__file__).resolve().parents[1]
CONFIG = str(ROOT / "configs" / "rope_small.py")


def error(prog, fn, *a):
    """The one line run_cli exits with for fn(*a); a traceback (any other exception) fails the test."""
    with pytest.raises(SystemExit) as e:
        run_cli(prog, fn, *a)
    assert isinstance(e.value.code, str), e.value.code
    return one_line(e.value.code)


def interrupted(main, argv, capsys):
    """(exit code, stdout, stderr) of main(argv) stopped by a Ctrl-C; a KeyboardInterrupt traceback fails the test."""
    try:
        main(argv)
    except SystemExit as e:
        out, err = capsys.readouterr()
        return e.code, out, err
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C ended in a KeyboardInterrupt traceback")
    pytest.fail("not interrupted")


def texts(folder, word):
    folder.mkdir(parents=True)
    for i in range(4):
        (folder / f"d{i}.txt").write_text(f"{word} {i} " * 200)
    return folder


def files(folder):
    return {p.name: p.read_bytes() for p in Path(folder).iterdir() if p.is_file()}


def tiny_run(folder, dataset, **model_args):
    """An untrained ropelab run on the tiny corpus (no training needed to load, sample or refuse it)."""
    cfg = GPTConfig(vocab_size=512, block_size=32, n_layer=1, n_head=2, n_embd=32, **model_args)
    folder.mkdir(parents=True, exist_ok=True)
    torch.save({"model": GPT(cfg).state_dict(), "model_args": dict(vars(cfg)), "iter_num": 0,
                "config": {"dataset": dataset, "wandb_log": False}}, folder / "ckpt.pt")
    return folder


def fake_report(folder, run, ppl, **drop):
    """An extrapolation.json as compare.py reads it: one entry per length, ppl as given."""
    result = dict(protocol="windows", method="none", mode=None, eval_len=64, ppl=ppl, ppl_beyond_train=ppl, diff_crop=0.1)
    folder.mkdir(parents=True, exist_ok=True)
    report = dict(run=run, train_len=32, units={}, results=[{k: v for k, v in result.items() if k not in drop}])
    (folder / "extrapolation.json").write_text(json.dumps(report))
    return folder


# ----------------------------------------------------------------------------- nothing replaced without --overwrite

def test_a_prepared_corpus_is_never_replaced_by_other_inputs_without_overwrite(tmp_path, monkeypatch):
    a, b = texts(tmp_path / "a", "alpha"), texts(tmp_path / "b", "beta")
    out = text_prepare.prepare(a, vocab_size=300, out_dir=tmp_path / "corpus")
    before = files(out)
    one_line(error("prepare.py", text_prepare.prepare, b, None, "text", 300, 0.1, 1, out), "holds another corpus", "--overwrite")
    one_line(error("prepare.py", text_prepare.prepare, a, None, "text", 512, 0.1, 1, out), "vocab_size 300, not 512")
    assert files(out) == before  # runs trained on it still evaluate
    text_prepare.prepare(b, vocab_size=300, out_dir=out, overwrite=True)  # on purpose
    assert load_meta(out)["source"]["folder"] == str(b.resolve())
    monkeypatch.setattr(text_prepare, "DATA_ROOT", tmp_path)  # a built-in corpus's folder, reached by --out_dir
    one_line(error("prepare.py", text_prepare.prepare, a, None, "text", 300, 0.1, 1, tmp_path / "shakespeare"),
             "is a built-in corpus's folder")
    assert not (tmp_path / "shakespeare").exists()


def test_the_built_in_corpora_never_replace_another_corpus_without_overwrite(tmp_path, plays, monkeypatch):
    for name in ("shakespeare", "sympy"):
        text_prepare.prepare(texts(tmp_path / f"src_{name}", name), vocab_size=2048, out_dir=tmp_path / name)
    before = files(tmp_path / "shakespeare")
    one_line(error("prepare.py", shakespeare.prepare), "holds another corpus", "--overwrite")
    assert files(tmp_path / "shakespeare") == before
    monkeypatch.setattr(sympy_prepare, "DATA_DIR", tmp_path / "sympy")
    monkeypatch.setattr(sympy_prepare, "download", lambda: pytest.fail("downloaded before the check"))
    one_line(error("prepare.py", sympy_prepare.prepare), "holds another corpus", "--overwrite")
    assert load_meta(shakespeare.prepare(overwrite=True))["source"] == shakespeare.SOURCE


def test_options_that_would_be_ignored_are_refused(tmp_path):
    one_line(error("prepare.py", shakespeare.vocab, argparse.Namespace(bytes=True, vocab_size=4096)), "--bytes", "4096")
    for argv, message in ((["--pos_emb=none"], "pos_emb='none'"), (["--pos_emb=learned"], "pos_emb='learned'"),
                          (["--pos_emb=sinusoidal"], "pos_emb='sinusoidal'"), (["--max_iters=0"], "max_iters=0"),
                          (["--out_dir="], "out_dir='' (from --out_dir=) is empty")):
        scaling = ["--rope_scaling={'rope_type': 'linear', 'factor': 2.0}"] if "pos_emb" in argv[0] else []
        one_line(error("train.py", load_config, argv + scaling), message)
    run = fake_report(tmp_path / "run", "run", 5.0)
    for cli in (compare, curves, extrapolate, probes, context, pairs, study, base_bound):  # "": the current folder, never meant
        argv = {study: [CONFIG], base_bound: []}.get(cli, [str(run)])
        one_line(error(cli.__name__, cli.parse_args, [*argv, "--out", ""]), "--out is empty")
    one_line(error("prepare.py", text_prepare.prepare, run, None, "text", 300, 0.1, 1, ""), "--out_dir is empty")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


# ----------------------------------------------------------------------------- runs named alike

def test_runs_named_alike_are_keyed_by_their_paths_and_a_run_twice_is_refused(tmp_path, capsys):
    a, b = fake_report(tmp_path / "a" / "rope", "rope", 5.0), fake_report(tmp_path / "b" / "rope", "rope", 7.0)
    compare.main([str(a), str(b), "--out", str(tmp_path / "cmp"), "--metric", "ppl"])
    table = (tmp_path / "cmp" / "compare.md").read_text()
    assert f"| {a} / none | 5.00 |" in table and f"| {b} / none | 7.00 |" in table  # two rows, not one merged
    one_line(error("compare.py", compare.main, [str(a), f"{a}/", "--out", str(tmp_path / "cmp2")]), "given twice")
    for run in (a, b):
        (run / "log.jsonl").write_text('{"iter": 0, "val": 5.0}\n')
    capsys.readouterr()
    curves.main([str(a), str(b), "--out", str(tmp_path / "curves")])
    printed = capsys.readouterr().out
    assert f"{a}: iter 0" in printed and f"{b}: iter 0" in printed  # two lines, not one dropped
    one_line(error("pairs.py", pairs.parse_args, [str(a), str(a), "--out", str(tmp_path / "p")]), "given twice")
    elsewhere = tmp_path / "elsewhere" / "rope_small.py"
    elsewhere.parent.mkdir()
    shutil.copy(CONFIG, elsewhere)
    for configs in ([CONFIG, str(elsewhere)], [CONFIG, CONFIG]):  # one run trained, reported twice; data counted twice
        one_line(error("study.py", study.parse_args, [*configs, "--out", str(tmp_path / "s")]), "share the name 'rope_small'")


# ----------------------------------------------------------------------------- outputs guarded

def test_a_second_writer_of_the_same_outputs_is_refused(tmp_path):
    run = fake_report(tmp_path / "run", "run", 5.0)
    compare.main([str(run), "--out", str(tmp_path / "cmp")])
    before = files(tmp_path / "cmp")
    with open_locked(tmp_path / "cmp" / ".compare.lock") as lock:  # another command is writing them
        lock.write("compare.py (process 4242)")
        lock.flush()
        one_line(error("compare.py", compare.main, [str(run), "--out", str(tmp_path / "cmp")]),
                 "in use by compare.py (process 4242)", ".compare.lock")
        assert files(tmp_path / "cmp") == {**before, ".compare.lock": b"compare.py (process 4242)"}
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    with open_locked(corpus / ".prepare.lock"):  # another prepare.py is writing a corpus there
        alpha = texts(tmp_path / "a", "alpha")
        one_line(error("prepare.py", text_prepare.prepare, alpha, None, "text", 300, 0.1, 1, corpus),
                 "in use by another command")
        assert [p.name for p in corpus.iterdir()] == [".prepare.lock"]


def test_an_output_folder_that_cannot_be_written_fails_before_the_computation(dataset, tmp_path, monkeypatch):
    run = tiny_run(tmp_path / "run", dataset)
    (tmp_path / "file").write_text("")
    monkeypatch.setattr(extrapolate, "run_grid", lambda *a: pytest.fail("computed before the output folder was checked"))
    monkeypatch.setattr(probes, "copy_probe", lambda *a: pytest.fail("computed before the output folder was checked"))
    for main, prog in ((extrapolate.main, "extrapolate.py"), (probes.main, "probes.py")):
        one_line(error(prog, main, [str(run), "--out", str(tmp_path / "file" / "out"), "--device", "cpu"]), "cannot be written")


def test_the_log_after_a_resume_is_its_checkpoints(dataset, tmp_path):
    train.main(args(dataset, tmp_path, eval_interval=5))
    with open(tmp_path / "log.jsonl", "a") as f:  # an evaluation past the checkpoint, a line cut by kill -9
        f.write('{"iter": 15, "train": 9.0, "val": 9.0}\n{"iter": 20\n')
    train.main(args(dataset, tmp_path, eval_interval=5, max_iters=15, init_from="resume"))
    assert log_iters(tmp_path) == [0, 5, 10, 15] and weights(tmp_path)["log"] == [
        json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]


# ----------------------------------------------------------------------------- numbers finite, JSON strict

def test_non_finite_numbers_are_refused_in_every_option_and_key(tmp_path):
    for argv, message in ((["--learning_rate=1e999"], "learning_rate=inf"), (["--min_lr=nan"], "min_lr"),
                          (["--grad_clip=1e999"], "not a finite number"), (["--beta1=1.5"], "use 0 <= beta1 < 1")):
        one_line(error("train.py", load_config, argv), message)
    one_line(error("x", parse_number, "inf", "factor", float, 1), "--factor 'inf' is not a finite number")
    one_line(error("x", parse_list, "1,inf", "lengths", float), "--lengths '1,inf': inf is not a finite number")
    one_line(error("x", parse_list, "nan", "lengths", float), "--lengths 'nan': nan is not a finite number")
    for cli, argv in ((extrapolate, ["--factor", "inf"]), (extrapolate, ["--lengths", "inf"]),
                      (extrapolate, ["--lengths", "nan"]), (probes, ["--distances", "inf"]),
                      (sample, ["--factor", "inf"]), (pairs, ["--distances", "inf", "--out", str(tmp_path)])):
        one_line(error(cli.__name__, cli.parse_args, ["RUN", *argv]), "is not a finite number")


def test_the_json_written_is_strict(tmp_path):
    def strict(text):
        return json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))
    assert strict(json_text({"a": float("inf"), "b": [float("nan"), 1.5]})) == {"a": None, "b": [None, 1.5]}
    written = json_csv("x", {"ppl": float("inf")}, [{"ppl": float("nan")}], ("ppl",))
    assert strict(written["x.json"]) == {"ppl": None} and "nan" not in written["x.csv"]  # an empty cell


def test_a_diverged_training_writes_no_checkpoint_of_nan_weights(dataset, tmp_path, monkeypatch):
    real, evaluations = train.estimate_loss, iter(range(100))
    def diverged(*a):  # the first evaluation (iter 0) is fine, the next one has diverged
        losses = real(*a)
        return losses if next(evaluations) == 0 else {**losses, "val": float("nan")}
    monkeypatch.setattr(train, "estimate_loss", diverged)
    message = one_line(run_main(args(dataset, tmp_path, eval_interval=5)), "not finite at iter 5", "lower learning_rate")
    assert "val nan" in message and not (tmp_path / "ckpt.pt").exists()


# ----------------------------------------------------------------------------- one line, no traceback

def test_a_weights_only_checkpoint_resumed_is_one_line(dataset, tmp_path):
    (tmp_path / "run").mkdir()
    shutil.copy(ROOT / "tests" / "assets" / "copier.pt", tmp_path / "run" / "ckpt.pt")
    one_line(run_main(args(dataset, tmp_path / "run", init_from="resume")), "cannot be resumed", "optimizer",
             "--init_from=")


def test_a_meta_json_vocabulary_that_does_not_fit_its_ids_is_one_line(dataset, tmp_path):
    for name, vocab in (("small", 100), ("string", "512")):
        folder = Path(shutil.copytree(dataset, tmp_path / name))
        meta = json.loads((folder / "meta.json").read_text())
        (folder / "meta.json").write_text(json.dumps({**meta, "vocab_size": vocab}))
        one_line(error("train.py", load_meta, folder), f"vocab_size {vocab!r} does not fit its ids", "re-prepare")


def test_a_nanogpt_checkpoint_is_one_line_in_extrapolate_and_sample(dataset, tmp_path):
    run = tiny_run(tmp_path / "run", dataset)
    ckpt = torch.load(run / "ckpt.pt", weights_only=True)
    torch.save({**ckpt, "model_args": {**ckpt["model_args"], "bias": False}}, run / "ckpt.pt")
    one_line(error("extrapolate.py", extrapolate.main, [str(run), "--device", "cpu"]), "model_args bias", "nanoGPT")
    one_line(error("sample.py", sample.main, [str(run), "--device", "cpu"]), "model_args bias", "nanoGPT")


def test_a_report_without_protocol_is_one_line_in_compare(tmp_path):
    run = fake_report(tmp_path / "run", "run", 5.0, protocol=None)
    one_line(error("compare.py", compare.main, [str(run), "--out", str(tmp_path / "cmp")]), "missing protocol in its results")


def test_out_of_memory_says_what_to_lower(dataset, tmp_path, monkeypatch):
    def oom(*a):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
    monkeypatch.setattr(train, "lr_at", oom)
    one_line(run_main(args(dataset, tmp_path)), "out of memory", "lower --batch_size")


def test_ctrl_c_in_training_says_where_and_how_to_resume(dataset, tmp_path, monkeypatch, capsys):
    steps = iter(range(100))
    real = train.lr_at
    def ctrl_c(*a):  # the 8th iteration's start: iteration 7, after the checkpoint at 5
        if next(steps) == 7:
            raise KeyboardInterrupt
        return real(*a)
    monkeypatch.setattr(train, "lr_at", ctrl_c)
    code, _, err = interrupted(train.main, args(dataset, tmp_path, eval_interval=5), capsys)
    assert code == 130 and err.strip() == ("train.py: interrupted at iter 7; resume with --init_from=resume "
                                           "(from its checkpoint at iter 5)")
    assert not list(tmp_path.parent.glob(f".{tmp_path.name}.replaced"))
    train.main(args(dataset, tmp_path, eval_interval=5, init_from="resume"))
    assert log_iters(tmp_path) == [0, 5, 10]


def test_sample_streams_its_text_and_keeps_it_on_ctrl_c(dataset, tmp_path, monkeypatch, capsys):
    run, real, steps = tiny_run(tmp_path / "run", dataset), sample.sample_next, iter(range(100))
    def stopping(*a):
        if next(steps) == 5:
            raise KeyboardInterrupt
        return real(*a)
    monkeypatch.setattr(sample, "sample_next", stopping)
    code, out, err = interrupted(sample.main, [str(run), "--prompt", "the king", "--max_new_tokens", "50", "--device",
                                               "cpu"], capsys)
    assert code == 130 and "interrupted after 5 of 50 new tokens" in err
    assert out.startswith("the king") and len(out) > len("the king") and out.endswith("---------------\n")


# ----------------------------------------------------------------------------- errors that name the option and what is allowed

def test_vague_errors_name_the_option_the_file_and_what_is_allowed(dataset, tmp_path):
    yarn = "--rope_scaling={'rope_type': 'yarn', 'factor': 4.0, 'original_max_position_embeddings': %s%s}"
    one_line(error("train.py", load_config, [yarn % (32, ", 'beta_fast': -1")]), "beta_fast must be a number > 0")
    one_line(error("train.py", load_config, [yarn % (0, "")]), "original_max_position_embeddings must be an integer >= 1")
    one_line(error("train.py", load_config, [str(ROOT / "configs")]), "is a folder")
    (tmp_path / "log.jsonl").write_text('{"iter": 0, "val": 5.0}\n{"iter": 5, "val"\n')
    one_line(error("curves.py", curves.main, [str(tmp_path), "--out", str(tmp_path / "c")]),
             f"{tmp_path / 'log.jsonl'}:2 is not a JSON line")
    (tmp_path / "prompt.txt").write_bytes(b"caf\xe9")
    run = tiny_run(tmp_path / "run", dataset)
    one_line(error("sample.py", sample.main, [str(run), "--prompt_file", str(tmp_path / "prompt.txt"), "--device", "cpu"]),
             f"--prompt_file {tmp_path / 'prompt.txt'} is not UTF-8")
    parsed = study.parse_args([CONFIG, "--train_args", "--max_iters=10", "--out", str(tmp_path / "s")])
    assert parsed["train_args"] == ["--max_iters=10"]
    one_line(error("study.py", study.parse_args, [CONFIG, "--train_args", "--out_dir=x", "--out", str(tmp_path / "s")]),
             "--train_args --out_dir=x", "the study owns")


def test_more_bad_inputs_a_new_user_tried_are_one_line(dataset, tmp_path, monkeypatch):
    one_line(error("train.py", load_config, ["--learning_rate=0.1", "--min_lr=0.5"]), "use min_lr <= learning_rate")
    one_line(error("prepare.py", shakespeare.vocab, argparse.Namespace(bytes=False, vocab_size=0)), "--vocab_size 0")
    run = tiny_run(tmp_path / "run", dataset)
    one_line(error("sample.py", sample.parse_args, [str(run), "--temperature", "inf"]), "--temperature inf")
    one_line(error("sample.py", sample.main, [str(run), "--prompt_file", str(tmp_path), "--device", "cpu"]),
             "--prompt_file", "is a folder")
    one_line(error("sample.py", sample.main, [str(run), "--prompt_file", str(tmp_path / "none.txt"), "--device", "cpu"]),
             f"--prompt_file {tmp_path / 'none.txt'} not found")
    with pytest.raises(SystemExit) as e:  # not an OverflowError (its numbers make the line long)
        context.main([str(run), "--contexts", "1e30", "--device", "cpu"])
    assert "--contexts below 214 (multiples of the training length 32)" in e.value.code and "\n" not in e.value.code
    def huge(*a):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: you tried ...")
    one_line(error("sample.py", huge), "out of memory", "--max_new_tokens")
    for bad, message in (("--dropout=1.0", "use 0 <= dropout < 1"), ("--rope_scaling={'rope_type': 'yarn', 'factor': 4.0, "
                         "'original_max_position_embeddings': 32, 'mscale': -100}", "mscale must be a number >= 0")):
        assert "rope_base" not in one_line(error("train.py", load_config, [bad]), message)
