"""Never lose data, round five (the smaller cases): a measuring child's failure is its parent's, never a hang; a
kept conversion is read again only for the folder it came from; a stand-in for nanoGPT is refused, not timed; an
end-of-text id outside the tokenizer, a YaRN protocol without long documents and a run folder whose name is not
UTF-8 are one line or handled before anything is lost; a probe's options are checked only for the probes asked."""
import json
import os
import re
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

import train
from common import UserError
from data.text.prepare import prepare
from lab import probes, protocols

ROOT = Path(__file__).resolve().parents[1]
WORDS = "the king queen lord doth thou art my good sir love night day come go speak hath not".split()
L = 32


@contextmanager
def at_most(seconds):
    """A hang becomes a failure: SIGALRM raises after `seconds`."""
    def hung(*_):
        raise TimeoutError(f"still waiting after {seconds} s")
    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def tiny_train(data, out_dir, block_size=L):
    train.main([f"--{k}={v}" for k, v in dict(
        dataset=data, out_dir=out_dir, batch_size=4, block_size=block_size, n_layer=1, n_head=2, n_embd=16,
        max_iters=2, warmup_iters=1, eval_interval=2, eval_iters=1, log_interval=2, wandb_log=False,
        device="cpu").items()])
    return Path(out_dir)


@pytest.fixture(scope="module")
def short_docs(tmp_path_factory):
    """16 documents of 40 words (130 to 150 tokens), 4 held out: shorter than 5L and than the copy probe's default
    distances, longer than a passkey trial of 3L."""
    folder, rng = tmp_path_factory.mktemp("texts"), np.random.default_rng(0)
    for i in range(16):
        (folder / f"doc{i:02d}.txt").write_text(" ".join(rng.choice(WORDS, 40)))
    return str(prepare(folder, vocab_size=300, val_fraction=0.25, out_dir=tmp_path_factory.mktemp("data") / "short"))


@pytest.fixture(scope="module")
def run(short_docs, tmp_path_factory):
    return tiny_train(short_docs, tmp_path_factory.mktemp("runs") / "run")


# ----------------------------------------------------------------------------- lab/read_cost.py

def fails(how):
    def measure():
        if how == "user":
            raise UserError("--lengths 7: the child's one line")
        if how == "bug":
            return 1 // 0
        if how == "exit":
            os._exit(3)
        os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's out-of-memory killer does
    return measure


@pytest.mark.parametrize("how, error, message", [
    ("user", UserError, "--lengths 7: the child's one line"), ("bug", RuntimeError, "ZeroDivisionError"),
    ("exit", RuntimeError, "exit code 3"), ("killed", MemoryError, "SIGKILL")])
def test_a_measuring_child_that_fails_is_the_parents_error_not_a_hang(how, error, message):
    from lab.measure import in_child
    with at_most(60), pytest.raises(error, match=re.escape(message)):
        in_child(fails(how))


def test_read_cost_refuses_lengths_and_methods_it_cannot_measure_before_measuring(run):
    from lab.read_cost import parse_args, read_cost
    for argv, message in ((["--lengths", "0"], "--lengths 0: use positive multiples"),
                          (["--lengths", "-1"], "--lengths -1: use positive multiples"),
                          (["--methods", "pairs"], "--methods pairs is not taken (it needs per-pair factors): its cost is yarn's")):
        with at_most(60), pytest.raises(UserError, match=re.escape(message)):
            read_cost(parse_args(["--model", str(run), "--device", "cpu", *argv]))
    for lengths, methods, message in (
            ("0.01", "none", "--lengths 0.01 is 0.32 tokens"),
            ("1e9", "none", "--lengths 1e+09 is 32,000,000,000 tokens, and none needs at least 36,621,094 MiB"),
            ("1e5", "crop,window", "--lengths 100000 is 3,200,000 tokens, and window needs at least 9,769,287 MiB")):
        with at_most(60), pytest.raises(UserError, match=re.escape(message)):
            read_cost(parse_args(["--model", str(run), "--device", "cpu", "--lengths", lengths, "--methods", methods]))
    done = subprocess.run([sys.executable, str(ROOT / "lab" / "read_cost.py"), "--model", str(run), "--lengths", "0"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and done.stderr.strip().splitlines() == [
        "read_cost.py: error: --lengths 0: use positive multiples of the trained length"]


# ----------------------------------------------------------------------------- lab/pythia.sh

@pytest.fixture(scope="module")
def two_alike(tmp_path_factory):
    """Two tiny GPT-NeoX folders both named m (a/m and b/m), other weights each."""
    hf_model = pytest.importorskip("test_pretrained").hf_model
    root = tmp_path_factory.mktemp("alike")
    (root / "a").mkdir()
    (root / "b").mkdir()
    hf_model(root / "a" / "m", "gpt_neox", max_position_embeddings=16)
    hf_model(root / "b" / "m", "gpt_neox", max_position_embeddings=16, hidden_size=32)
    return root


def pythia(*args):
    return subprocess.run(["bash", str(ROOT / "lab" / "pythia.sh"), *map(str, args)], capture_output=True, text=True,
                          timeout=600, env=dict(os.environ, METHODS="none,crop", UNITS="2", TOKENS="32", DOCS="all"))


def test_pythia_reads_a_kept_run_only_for_the_folder_it_was_converted_from(two_alike, tmp_path):
    from pretrained import convert
    texts = tmp_path / "texts"
    texts.mkdir()
    for i in range(4):
        (texts / f"doc{i}.txt").write_text(" ".join(WORDS * 10))
    done = pythia(texts, tmp_path / "both", two_alike / "a" / "m", two_alike / "b" / "m")
    assert done.returncode == 2 and done.stderr.splitlines() == [
        "pythia.sh: two model folders are named m: each one's run is OUT/<name>; give them different names (a link "
        "named otherwise will do)"]
    assert not (tmp_path / "both").exists()  # refused before anything is prepared or converted
    convert(two_alike / "a" / "m", tmp_path / "out" / "m")  # a first call's conversion, kept
    done = pythia(texts, tmp_path / "out", two_alike / "b" / "m")
    assert done.returncode == 1 and done.stderr.splitlines() == [
        f"pythia.sh: {tmp_path / 'out' / 'm'} holds a conversion of {(two_alike / 'a' / 'm').resolve()}, not of "
        f"{two_alike / 'b' / 'm'}: give another OUT, or remove that run to convert this model there"]
    kept = sorted(p.name for p in (tmp_path / "out").iterdir() if p.name != ".m.lock")  # the run's lock stays
    assert kept == ["m"]
    done = pythia(tmp_path / "no-texts", tmp_path / "out", two_alike / "a" / "m")  # its own folder: read again
    assert done.returncode == 1 and "holds a conversion" not in done.stderr and "no-texts not found" in done.stderr


# ----------------------------------------------------------------------------- bench.py --nanogpt --processes

def test_a_checkout_that_is_not_nanogpt_is_refused_not_timed(short_docs, tmp_path, monkeypatch):
    import bench
    for name in ("train.py", "model.py", "configurator.py"):  # nanoGPT's files by name, nothing in them
        (tmp_path / name).write_text("")
    monkeypatch.setattr(bench, "training_data", lambda *_: None)
    monkeypatch.setattr(bench, "data_dir", lambda _: Path(short_docs))
    with pytest.raises(UserError, match=re.escape(f"{tmp_path / 'train.py'} printed no 'iter 50: loss' line: "
                                                  "karpathy/nanoGPT's train.py prints one")):
        bench.processes_vs_nanogpt(tmp_path, 1)


# ----------------------------------------------------------------------------- data/text/prepare.py --tokenizer

@pytest.mark.parametrize("eos", [99_999, -1, 300])
def test_an_end_of_text_id_outside_the_tokenizer_is_one_line(tmp_path, eos):
    from tokenizers import Tokenizer, models, pre_tokenizers
    model = tmp_path / "model"
    model.mkdir()
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(["<unk>", *WORDS])}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(model / "tokenizer.json"))
    (model / "config.json").write_text(json.dumps({"eos_token_id": eos}))
    (tmp_path / "texts").mkdir()
    (tmp_path / "texts" / "a.txt").write_text(" ".join(WORDS))
    named = (re.escape(f"the end-of-text id {eos:,} is not a token of its tokenizer ({len(WORDS) + 1} ids)")
             + "|" + re.escape(f"eos_token_id {eos} is not allowed: a token id >= 0"))  # the schema's, for a negative
    with pytest.raises(UserError, match=named):
        prepare(tmp_path / "texts", out_dir=tmp_path / "data", tokenizer=model, workers=1)
    assert not (tmp_path / "data").exists()


# ----------------------------------------------------------------------------- a run folder not named in UTF-8

def test_a_run_folder_not_named_in_utf8_is_drawn_and_written(short_docs, tmp_path):
    from eval import extrapolate
    from eval.report import png, pyplot
    name = os.fsdecode(b"r\xff")  # Python's surrogate escape of the byte: what matplotlib could not draw
    run = tiny_train(short_docs, tmp_path / name)
    extrapolate.main([str(run), "--lengths", "1,2", "--methods", "none,crop", "--tokens", "64", "--no-wandb",
                      "--device", "cpu"])
    assert (run / "extrapolation.png").stat().st_size > 0
    assert json.loads((run / "extrapolation.json").read_text())["run"] == name
    plt = pyplot()  # a name as a tick label (lab/ladder.py's rungs) is set only when the figure is drawn
    fig, ax = plt.subplots()
    ax.set(xticks=[0], xticklabels=[name], title=name)
    assert png(fig).startswith(b"\x89PNG")


# ----------------------------------------------------------------------------- lab/protocols.py

def test_yarns_protocol_without_a_long_document_is_one_line_before_anything_is_scored(run, tmp_path):
    with pytest.raises(UserError, match=re.escape(
            f"{run}: no held-out document of --docs all has more than 5L = {5 * L} tokens (the longest has ")) as e:
        protocols.main([str(run), "--protocols", "bojone,yarn", "--docs", "all", "--no-wandb", "--out", str(tmp_path)])
    assert "YaRN's protocol reads each one's first 5L + 1: use a corpus with longer documents, or --protocols " \
           "without yarn" in str(e.value)
    assert not (run / "protocols_all.json").exists()


def test_protocols_advises_only_options_it_has(run, tmp_path):
    parser_options = {"--seeds", "--units", "--docs", "--protocols", "--out", "--device", "--wandb_log", "--no-wandb"}
    for chosen in ("yarn", "bojone", "su"):
        with pytest.raises(UserError) as e:
            protocols.main([str(run), "--protocols", chosen, "--docs", "all", "--no-wandb", "--out", str(tmp_path)])
        assert set(re.findall(r"--[a-z_-]+", str(e.value))) <= parser_options, str(e.value)


# ----------------------------------------------------------------------------- lab/probes.py

def test_only_the_probes_asked_for_have_their_options_checked(run, tmp_path):
    report = probes.probes(probes.parse_args([str(run), "--probes", "passkey", "--lengths", "3", "--depths", "0.5",
                                              "--trials", "2", "--methods", "none", "--no-wandb", "--out",
                                              str(tmp_path / "passkey")]))
    assert {r["probe"] for r in report["results"]} == {"passkey"}  # the copy probe's default distances: 16L > 147
    with pytest.raises(UserError, match=re.escape(f"--distances 8 is {8 * L} tokens, and the longest held-out")):
        probes.probes(probes.parse_args([str(run), "--probes", "copy", "--no-wandb", "--out", str(tmp_path / "c")]))
