"""Prepare the Python-source corpus: the non-test source files of the `sympy==1.13.3` wheel on PyPI, one document per
file, split by whole file into train and val. Code has long-range structure (a name defined near the top of a file is
used hundreds to thousands of tokens later), which Shakespeare at this scale does not reward.

    python data/sympy/prepare.py [--overwrite]

Writes data/sympy/ (vocabulary 2048). Every command prepares it on first use of --dataset=sympy.
"""
import posixpath
import zipfile
from pathlib import Path


from data.dataset import VOCAB_SIZE
from data.writer import claim_corpus, is_prepared, pip_download, write_dataset
from common import UserError, command_parser, run_cli

VAL_FRACTION, SEED = 0.1, 0
PACKAGE = "sympy==1.13.3"
WHEEL = "sympy-1.13.3-py3-none-any.whl"
WHEEL_SHA256 = "54612cf55a62755ee71824ce692986f23c88ffa77207b30c1368eda4a7060f73"
MIN_BYTES = 2048  # shorter files are mostly imports and __init__ lists: little context to use
N_FILES = 639
DATA_DIR = Path(__file__).resolve().parent
SOURCE = {"package": PACKAGE, "sha256": WHEEL_SHA256, "files": f"*.py >= {MIN_BYTES} bytes, no tests"}


def download(cache_dir=DATA_DIR / "cache") -> Path:
    """The verified wheel in cache_dir, fetched with pip unless already there."""
    return pip_download(PACKAGE, WHEEL, WHEEL_SHA256, cache_dir, "https://pypi.org/project/sympy/1.13.3/#files", binary=True)


def is_source(info):
    parts = info.filename.split("/")
    return (info.filename.endswith(".py") and parts[0] == "sympy" and info.file_size >= MIN_BYTES
            and not any(p in ("tests", "benchmarks") or p.startswith("test_") for p in parts))


def read_sources(wheel) -> dict:
    """{path in the wheel: source} of the non-test .py files of at least MIN_BYTES."""
    with zipfile.ZipFile(wheel) as z:
        docs = {posixpath.normpath(i.filename): z.read(i).decode("utf-8") for i in z.infolist() if is_source(i)}
    if len(docs) != N_FILES:
        raise UserError(f"expected {N_FILES} source files in {wheel}, found {len(docs)}")
    return docs


def prepare(name="sympy", overwrite=False) -> Path:
    """Download (if needed), tokenize and write data/sympy; a no-op if prepared, an error if another corpus is there
    (unless overwrite)."""
    out_dir = DATA_DIR.parent / name
    if is_prepared(out_dir, vocab_size=VOCAB_SIZE, source=SOURCE):
        print(f"{out_dir}: already prepared (vocab_size={VOCAB_SIZE})")
        return out_dir
    claim_corpus(out_dir, overwrite, source=SOURCE, vocab_size=VOCAB_SIZE, val_fraction=VAL_FRACTION)
    docs = read_sources(download())
    print(f"{len(docs)} documents, {sum(map(len, docs.values())):,} characters -> {out_dir}")
    write_dataset(docs, out_dir, VOCAB_SIZE, val_fraction=VAL_FRACTION, seed=SEED, source=SOURCE)
    return out_dir


if __name__ == "__main__":
    parser = command_parser(__doc__)
    parser.add_argument("--overwrite", action="store_true", help="replace another corpus prepared in data/sympy/")
    run_cli("prepare.py", lambda: prepare(overwrite=parser.parse_args().overwrite))
