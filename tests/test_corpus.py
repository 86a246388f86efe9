"""Preparing a corpus of JSONL / Parquet / .txt files with data/text/prepare.py (small files written here)."""
import gzip
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import data.writer
import data.text.prepare as text_prepare
from data.dataset import load_meta, load_split
from data.writer import is_prepared
from data.writer import val_by_hash
from data.text.prepare import default_name, prepare
from data.tokenizer import gpt2_tokenizer
from common import run_cli

ROOT = Path(__file__).resolve().parents[1]
VOCAB = 512
DATA_FILES = ["train.bin", "val.bin", "train_docs.npy", "val_docs.npy"]
WORDS = "the king queen lord doth thou art my good sir love night day come go speak hath not".split()


def sentence(rng):
    return " ".join(rng.choice(WORDS, rng.integers(3, 40)))


@pytest.fixture
def corpus(tmp_path):
    """A folder of JSONL, gzipped JSONL, Parquet and .txt files -> (folder, {key: text} of its documents)."""
    rng = np.random.default_rng(0)
    folder, expected = tmp_path / "corpus", {}
    folder.mkdir()
    lines = []
    for i in range(30):
        text = sentence(rng) + (" café 東京 🙂 <|endoftext|>" if i == 3 else "")
        lines.append(json.dumps({"id": i, "text": text, "extra": [1, 2]}))
        expected[f"a.jsonl:{i + 1}"] = text
    lines += [json.dumps({"id": 30, "text": ""}), json.dumps({"id": 31, "text": None}), ""]  # skipped
    (folder / "a.jsonl").write_text("\n".join(lines) + "\n")
    (folder / "sub").mkdir()
    with gzip.open(folder / "sub" / "b.jsonl.gz", "wt") as f:
        for i in range(10):
            text = sentence(rng)
            f.write(json.dumps({"text": text}) + "\n")
            expected[f"sub/b.jsonl.gz:{i + 1}"] = text
    texts = [sentence(rng) for _ in range(15)] + [None, ""]
    pq.write_table(pa.table({"id": list(range(17)), "text": texts}), folder / "c.parquet")
    expected.update({f"c.parquet:{i}": t for i, t in enumerate(texts) if t})
    (folder / "d.txt").write_text("a whole .txt file is one document\n")
    expected["d.txt"] = "a whole .txt file is one document\n"
    (folder / ".hidden.jsonl").write_text("not json: hidden files are ignored\n")
    (folder / "notes.md").write_text("not a corpus file")
    return folder, expected


def documents(out_dir, split):
    """The texts of a prepared split, decoded document by document, checking the EOT after each."""
    meta = load_meta(out_dir)
    enc = gpt2_tokenizer(meta["vocab_size"])
    tokens, bounds = load_split(out_dir, split)
    assert bounds[0, 0] == 0 and (bounds[1:, 0] == bounds[:-1, 1] + 1).all() and bounds[-1, 1] + 1 == len(tokens)
    assert (tokens[bounds[:, 1]] == enc.eot_token).all()
    return [enc.decode(tokens[a:b].tolist()) for a, b in bounds]


def test_documents_round_trip_split_by_hash_of_their_key(corpus, tmp_path):
    folder, expected = corpus
    out = prepare(folder, val_fraction=0.3, out_dir=tmp_path / "out")
    meta = load_meta(out)
    assert meta["vocab_size"] == 50257 and meta["source"]["text_field"] == "text"  # full GPT-2 for records
    train, val = documents(out, "train"), documents(out, "val")
    assert [meta["splits"][s]["documents"] for s in ("train", "val")] == [len(train), len(val)]
    assert sorted(train + val) == sorted(expected.values())  # every non-empty document, whole, once
    held_out = [t for key, t in expected.items() if val_by_hash(key, 0.3)]
    assert sorted(val) == sorted(held_out) and 0 < len(val) < len(expected)
    # a literal "<|endoftext|>" in the text is text, not an EOT: one EOT per document in all
    assert (load_split(out, "train")[0] == 50256).sum() == len(train)


def test_adding_a_file_prepares_again_and_moves_no_document(corpus, tmp_path):
    folder, _ = corpus
    out = prepare(folder, vocab_size=VOCAB, val_fraction=0.3, out_dir=tmp_path / "out")
    old = {s: documents(out, s) for s in ("train", "val")}
    old_source = load_meta(out)["source"]
    (folder / "e.jsonl").write_text("".join(json.dumps({"text": f"new document {i}"}) + "\n" for i in range(20)))
    prepare(folder, vocab_size=VOCAB, val_fraction=0.3, out_dir=out, overwrite=True)  # a changed source: on purpose
    assert load_meta(out)["source"]["sha256"] != old_source["sha256"]
    for split in ("train", "val"):
        new = documents(out, split)
        assert set(old[split]) < set(new)  # the hash rule needs no count: old documents stay where they were


def test_a_folder_of_another_tools_data_is_not_replaced_without_overwrite(corpus, tmp_path):
    folder, _ = corpus
    out = tmp_path / "nanogpt"  # a nanoGPT data folder: its own .bin files and meta.pkl, no meta.json
    out.mkdir()
    theirs = {"train.bin": b"\x01\x02" * 50, "val.bin": b"\x03\x04" * 10, "meta.pkl": b"a pickle"}
    for name, content in theirs.items():
        (out / name).write_bytes(content)
    with pytest.raises(ValueError, match=r"holds data files that no meta.json describes \(meta.pkl, train.bin, "
                                         r"val.bin\).*pass --overwrite"):
        prepare(folder, vocab_size=VOCAB, out_dir=out)
    assert {name: (out / name).read_bytes() for name in theirs} == theirs
    prepare(folder, vocab_size=VOCAB, out_dir=out, overwrite=True)  # on purpose: replaced
    assert is_prepared(out, vocab_size=VOCAB)


def test_second_run_is_a_noop(corpus, tmp_path, capsys):
    folder, _ = corpus
    out = prepare(folder, vocab_size=VOCAB, out_dir=tmp_path / "out")
    before = {f: (out / f).stat().st_mtime_ns for f in DATA_FILES + ["meta.json"]}
    prepare(folder, vocab_size=VOCAB, out_dir=out, workers=3)  # the number of workers changes nothing
    assert "already prepared" in capsys.readouterr().out
    assert {f: (out / f).stat().st_mtime_ns for f in before} == before
    prepare(folder, vocab_size=VOCAB, out_dir=out, val_fraction=0.5, overwrite=True)  # other options: prepared again
    with pytest.raises(ValueError, match=f"holds another corpus .vocab_size {VOCAB}, not 1024.*pass --overwrite"):
        prepare(folder, vocab_size=1024, out_dir=out)  # another vocabulary never rewrites data runs were trained on
    assert load_meta(out)["val_fraction"] == 0.5 and (out / "val.bin").stat().st_mtime_ns != before["val.bin"]


def test_parallel_workers_write_the_same_bytes(corpus, tmp_path, monkeypatch):
    folder, _ = corpus
    monkeypatch.setattr(data.writer, "CHUNK_CHARS", 100)  # many small chunks, many in flight at once
    monkeypatch.setattr(text_prepare, "PARQUET_BATCH_ROWS", 4)  # several Parquet batches
    one = prepare(folder, vocab_size=VOCAB, out_dir=tmp_path / "one", workers=1)
    four = prepare(folder, vocab_size=VOCAB, out_dir=tmp_path / "four", workers=4)
    for f in DATA_FILES + ["meta.json"]:
        assert (one / f).read_bytes() == (four / f).read_bytes(), f


def test_single_file_sources_and_default_names(corpus, tmp_path):
    folder, expected = corpus
    out = prepare(folder / "c.parquet", vocab_size=VOCAB, val_fraction=0.4, out_dir=tmp_path / "out")
    assert sorted(documents(out, "train") + documents(out, "val")) == sorted(
        t for k, t in expected.items() if k.startswith("c.parquet"))
    assert load_meta(out)["source"]["file"] == str(folder / "c.parquet")
    assert default_name(str(folder / "sub" / "b.jsonl.gz")) == "b" and default_name(str(folder)) == "corpus"
    assert default_name("hf:roneneldan/TinyStories") == "TinyStories"
    assert default_name("hf:HuggingFaceFW/fineweb-edu:sample-10BT") == "fineweb-edu_sample-10BT"


def test_txt_only_folder_keeps_small_vocab_exact_split_and_names(tmp_path):
    folder = tmp_path / "texts"
    folder.mkdir()
    for i in range(10):
        (folder / f"doc{i}.txt").write_text(f"document number {i}")
    out = prepare(folder, out_dir=tmp_path / "out")
    meta = load_meta(out)
    assert meta["vocab_size"] == 2048 and "text_field" not in meta["source"]
    assert meta["splits"]["val"]["documents"] == 1 and len(meta["splits"]["train"]["names"]) == 9


def test_hugging_face_source_streams_rows(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a local folder: no network, whatever the machine
    pytest.importorskip("datasets")  # not a requirement: skipped where it is not installed
    (tmp_path / "hub").mkdir()
    texts = [f"row {i}: " + sentence(np.random.default_rng(i)) for i in range(40)]
    (tmp_path / "hub" / "train.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    out = prepare(f"hf:{tmp_path / 'hub'}", vocab_size=VOCAB, val_fraction=0.3, out_dir=tmp_path / "out")
    assert load_meta(out)["source"] == {"hf": str(tmp_path / "hub"), "split": "train", "text_field": "text"}
    assert sorted(documents(out, "val")) == sorted(t for i, t in enumerate(texts) if val_by_hash(str(i), 0.3))
    assert sorted(documents(out, "train") + documents(out, "val")) == sorted(texts)


# -----------------------------------------------------------------------------
# bad input: one line, nothing written

def error_line(capsys, fn, *args, **kwargs):
    """The one-line message run_cli exits with (as the CLI prints it)."""
    with pytest.raises(SystemExit) as e:
        run_cli("prepare.py", lambda: fn(*args, **kwargs))
    assert isinstance(e.value.code, str) and "\n" not in e.value.code
    return e.value.code


def test_parquet_without_the_text_field_is_one_line_on_stderr_and_writes_nothing(tmp_path):
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"id": [1, 2], "body": ["a", "b"]}), bad)
    out = tmp_path / "out"
    result = subprocess.run([sys.executable, str(ROOT / "data/text/prepare.py"), str(bad), "--out_dir", str(out)],
                            capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [f"prepare.py: error: {bad}: no 'text' column (it has: id, body); pass --text_field"]
    assert not out.exists()


@pytest.mark.parametrize("lines, message", [
    (['{"text": "fine"}', '{"id": 1, "body": "x"}'], r"a.jsonl:2: no 'text' field \(the record has: id, body\)"),
    (['{"text": "fine"}', '[1, 2]'], r"a.jsonl:2: no 'text' field \(the record has: a JSON list\)"),
    (['{"text": "fine"}', '{"text": 3}'], r"a.jsonl:2: field 'text' is a int, not text"),
    (['{"text": "fine"', ''], r"a.jsonl:1: not a JSON line"),
    (['{"text": ""}', '', '{"text": null}'], r"the corpus is empty \(no non-empty documents\)"),
    ([], r"the corpus is empty"),
])
def test_bad_jsonl_is_one_line_naming_the_file_and_writes_nothing(tmp_path, capsys, lines, message):
    (tmp_path / "a.jsonl").write_text("\n".join(lines))
    out = tmp_path / "out"
    assert re.search(message, error_line(capsys, prepare, tmp_path / "a.jsonl", out_dir=out))
    assert not out.exists()


def test_a_failure_half_way_keeps_the_previous_dataset(corpus, tmp_path, capsys):
    folder, _ = corpus
    out = prepare(folder, vocab_size=VOCAB, out_dir=tmp_path / "out")
    before = {f: (out / f).read_bytes() for f in DATA_FILES + ["meta.json"]}
    with open(folder / "a.jsonl", "a") as f:
        f.write('{"body": "the last line has no text field"}\n')
    assert "a.jsonl:34: no 'text' field" in error_line(capsys, prepare, folder, vocab_size=VOCAB, out_dir=out, overwrite=True)
    assert {f: (out / f).read_bytes() for f in before} == before and is_prepared(out)
    assert sorted(p.name for p in out.iterdir()) == sorted(before)  # no temp file left behind


def test_other_bad_inputs_are_one_line(corpus, tmp_path, capsys, monkeypatch):
    folder, _ = corpus
    out = tmp_path / "out"
    assert "need at least one in each" in error_line(capsys, prepare, folder, val_fraction=1e-6, out_dir=out)
    assert "column 'id' is int64, not text" in error_line(capsys, prepare, folder / "c.parquet", text_field="id", out_dir=out)
    assert "nope not found" in error_line(capsys, prepare, tmp_path / "nope", out_dir=out)
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.md").write_text("not a corpus file")
    assert "has no *.txt, *.jsonl" in error_line(capsys, prepare, tmp_path / "empty", out_dir=out)
    (tmp_path / "x.csv").write_text("a,b")
    assert "must be .jsonl, .jsonl.gz or .parquet" in error_line(capsys, prepare, tmp_path / "x.csv", out_dir=out)
    (tmp_path / "cut.jsonl.gz").write_bytes(gzip.compress(b'{"text": "a"}\n' * 1000)[:-20])
    assert "cut.jsonl.gz: not a readable gzip file" in error_line(capsys, prepare, tmp_path / "cut.jsonl.gz", out_dir=out)
    assert "workers=0" in error_line(capsys, prepare, folder, workers=0, out_dir=out)
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if not installed: no network is ever tried
    assert "pip install datasets" in error_line(capsys, prepare, "hf:roneneldan/TinyStories", out_dir=out)
    assert "hf:NAME or hf:NAME:CONFIG" in error_line(capsys, prepare, "hf:", name="x", out_dir=out)
    assert not out.exists()
