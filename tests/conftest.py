"""Fixtures shared by the test files."""
import numpy as np
import pytest
import torch

from data.text.prepare import prepare

WORDS = "the king queen lord doth thou art my good sir love night day come go speak hath not".split()


@pytest.fixture(scope="session")
def dataset(tmp_path_factory):
    """A tiny prepared corpus: 6 documents of random words -> 1 held-out document of ~6.8k tokens,
    enough for evaluation windows up to 16x a training length of 32."""
    folder = tmp_path_factory.mktemp("texts")
    rng = np.random.default_rng(0)
    for i in range(6):
        (folder / f"doc{i}.txt").write_text(" ".join(rng.choice(WORDS, 3000)))
    return str(prepare(folder, vocab_size=512, out_dir=tmp_path_factory.mktemp("data") / "tiny"))


def held_out_corpus(tmp_path_factory, seed):
    """A tiny prepared corpus of 16 documents of random words, 4 of them held out (2 dev, 2 test)."""
    folder, rng = tmp_path_factory.mktemp("texts"), np.random.default_rng(seed)
    for i in range(16):
        (folder / f"doc{i:02d}.txt").write_text(" ".join(rng.choice(WORDS, 800)))
    return prepare(folder, vocab_size=300, val_fraction=0.25, out_dir=tmp_path_factory.mktemp("data") / "tiny4")


@pytest.fixture
def plays(tmp_path, monkeypatch):
    """data/shakespeare/prepare.py writing under tmp_path from six small offline "plays" of ~2k characters."""
    from data.shakespeare import prepare as shakespeare
    monkeypatch.setattr(shakespeare, "DATA_DIR", tmp_path / "shakespeare")
    monkeypatch.setattr(shakespeare, "download", lambda: None)
    monkeypatch.setattr(shakespeare, "read_texts", lambda _: {f"play{i}": f"play {i}: to be or not to be " * 80
                                                              for i in range(6)})
    return shakespeare


@pytest.fixture
def one_thread():
    # many tiny torch ops (token-by-token decoding, the base scan): on a 2-core machine that is also
    # training, OpenMP hand-offs between busy cores cost far more than the work itself
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
