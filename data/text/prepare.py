"""
Prepare any folder of .txt files: one document per file, split by whole document into train and val.

    python data/text/prepare.py FOLDER [--name NAME] [--vocab_size N] [--val_fraction F]

Writes train.bin, val.bin, train_docs.npy, val_docs.npy, meta.json into data/NAME/
(NAME defaults to the folder's basename). A changed folder is prepared again.
"""
import hashlib
import sys
from pathlib import Path

# scripts run as `python data/text/prepare.py` get data/text/ as sys.path[0], not the repo root;
# put the root first so `import data.*` works from any working directory
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from data.dataset import VOCAB_SIZE, is_prepared, load_meta, write_dataset  # noqa: E402
from runtime import arg_parser, run_cli  # noqa: E402

SEED = 0
DATA_ROOT = Path(__file__).resolve().parents[1]  # data/


def read_folder(folder):
    """({relative path: text} of every *.txt under folder, sha256 over (relative path, content) of all)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"folder not found: {folder}")
    paths = sorted(p for p in folder.rglob("*.txt") if p.is_file())
    if len(paths) < 2:
        raise ValueError(f"{folder} has {len(paths)} .txt file(s); need at least 2 (one document per file) for train and val")
    docs, h = {}, hashlib.sha256()
    for path in paths:
        rel = path.relative_to(folder).as_posix()
        raw = path.read_bytes()
        # length-prefix both fields so different (path, content) lists can never hash alike
        for field in (rel.encode(), raw):
            h.update(len(field).to_bytes(8, "little"))
            h.update(field)
        try:
            docs[rel] = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{path} is not UTF-8 text ({e}); convert it or remove it from {folder}") from None
    return docs, h.hexdigest()


def prepare(folder, name=None, vocab_size=VOCAB_SIZE, val_fraction=0.1, out_dir=None) -> Path:
    """Tokenize folder into out_dir (default data/<name>); a no-op if already prepared from the same files."""
    folder = Path(folder).resolve()
    name = name or folder.name
    if not name or name in (".", "..") or "/" in name or "\\" in name:
        raise ValueError(f"name={name!r} is not allowed; use a plain directory name (output goes to data/<name>/)")
    if name == "shakespeare":
        raise ValueError("name 'shakespeare' is taken by data/shakespeare/prepare.py; pass another --name")
    out_dir = Path(out_dir) if out_dir is not None else DATA_ROOT / name
    docs, digest = read_folder(folder)
    source = {"folder": str(folder), "sha256": digest}
    if is_prepared(out_dir, vocab_size=vocab_size, source=source) and load_meta(out_dir)["val_fraction"] == val_fraction:
        print(f"{out_dir}: already prepared (vocab_size={vocab_size}, {len(docs)} files unchanged)")
        return out_dir
    print(f"{len(docs)} documents, {sum(map(len, docs.values())):,} characters from {folder}")
    write_dataset(docs, out_dir, vocab_size, val_fraction=val_fraction, seed=SEED, source=source)
    return out_dir


if __name__ == "__main__":
    parser = arg_parser(__doc__)
    parser.add_argument("folder", help="folder whose *.txt files (recursive) are the documents")
    parser.add_argument("--name", default=None, help="output goes to data/NAME/ (default: the folder's basename)")
    parser.add_argument("--vocab_size", type=int, default=VOCAB_SIZE, help=f"257..50257 (default {VOCAB_SIZE})")
    parser.add_argument("--val_fraction", type=float, default=0.1, help="fraction of documents held out (default 0.1)")

    def main():
        args = parser.parse_args()
        prepare(args.folder, name=args.name, vocab_size=args.vocab_size, val_fraction=args.val_fraction)
    run_cli("prepare.py", main)
