"""
The prepared-dataset format, written by the data/<corpus>/prepare.py scripts and read here for
training batches and evaluation windows.

A prepared dataset directory holds:
  train.bin, val.bin            uint16 tokens: documents concatenated, each followed by one EOT
  train_docs.npy, val_docs.npy  int64 (n_docs, 2): [start, end) of each document's tokens (EOT excluded)
  meta.json                     tokenizer, splits, source, sizes + sha256 of every file above

meta.json is written last, so "meta.json present and every checksum matches" means
the output is complete; anything else is redone by the prepare scripts.
"""
import hashlib
import io
import json
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from data.tokenizer import gpt2_tokenizer
from runtime import write_atomic

SPLITS = ("train", "val")
# GPT-2 BPE cut to its first 2047 merges + EOT: the output layer is the costliest part of a small
# model on a CPU, and 2048 was ~2x faster than 8192 for the small configs (README)
VOCAB_SIZE = 2048


# -----------------------------------------------------------------------------
# writing

def split_documents(names, val_fraction=0.1, seed=0):
    """Split whole documents into (train, val) name lists: a document never straddles splits,
    so val measures generalisation to unseen texts. Deterministic given the names and seed."""
    names = sorted(names)  # sort first so the split doesn't depend on dict / filesystem order
    if len(names) < 2:
        raise ValueError(f"need at least 2 documents to make a train and a val split, got {len(names)}")
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction={val_fraction!r} is not allowed; use a number strictly between 0 and 1")
    order = np.random.default_rng(seed).permutation(len(names))
    n_val = min(max(round(len(names) * val_fraction), 1), len(names) - 1)  # >= 1 doc in each split
    val = sorted(names[i] for i in order[:n_val])
    train = sorted(names[i] for i in order[n_val:])
    return train, val


def _write_file(path, data: bytes):
    write_atomic(path, lambda f: f.write(data))
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _npy_bytes(arr):
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


def _tokenize_split(enc, docs, names, split):
    """Token ids of the split's documents (each followed by EOT) and their [start, end) bounds."""
    chunks, bounds, pos = [], [], 0
    for name in tqdm(names, desc=f"tokenizing {split}", unit="doc", leave=False):
        ids = enc.encode_ordinary(docs[name])  # ordinary: a literal "<|endoftext|>" in the text is just text
        bounds.append((pos, pos + len(ids)))
        chunks.append(np.asarray(ids, dtype=np.uint16))
        chunks.append(np.array([enc.eot_token], dtype=np.uint16))
        pos += len(ids) + 1
    return np.concatenate(chunks), np.array(bounds, dtype=np.int64).reshape(-1, 2)


def write_dataset(docs: dict[str, str], out_dir, vocab_size: int, val_fraction: float = 0.1, seed: int = 0,
                  source: dict | None = None) -> dict:
    """Tokenize {name: text} documents into out_dir (see module docstring); returns the meta dict."""
    enc = gpt2_tokenizer(vocab_size)  # validates vocab_size; ids < 50257 fit in uint16
    train_names, val_names = split_documents(docs, val_fraction, seed)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    # drop the old meta.json first: a crash below must not leave it vouching for a half-rewritten dir
    (out_dir / "meta.json").unlink(missing_ok=True)
    files, splits = {}, {}
    for split, names in (("train", train_names), ("val", val_names)):
        tokens, bounds = _tokenize_split(enc, docs, names, split)
        files[f"{split}.bin"] = _write_file(out_dir / f"{split}.bin", tokens.tobytes())
        files[f"{split}_docs.npy"] = _write_file(out_dir / f"{split}_docs.npy", _npy_bytes(bounds))
        splits[split] = {"tokens": int(len(tokens)), "documents": names}
        print(f"{split}: {len(names)} documents, {len(tokens):,} tokens -> {out_dir / f'{split}.bin'}")
    meta = {
        "tokenizer": "gpt2",
        "vocab_size": vocab_size,
        "eot_token": enc.eot_token,
        "splits": splits,
        "source": source,
        "files": files,
        "val_fraction": val_fraction,
        "seed": seed,
    }
    _write_file(out_dir / "meta.json", (json.dumps(meta, indent=2) + "\n").encode())
    return meta


# -----------------------------------------------------------------------------
# checking and reading

def file_sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def is_prepared(out_dir, vocab_size=None, source=None) -> bool:
    """True iff out_dir holds a complete, uncorrupted dataset (matching vocab_size / source if given)."""
    out_dir = Path(out_dir)
    try:
        meta = json.loads((out_dir / "meta.json").read_text())
        files = meta["files"]
        if vocab_size is not None and meta["vocab_size"] != vocab_size:
            return False
        # compare through JSON so e.g. tuples vs lists or int keys don't cause false mismatches
        if source is not None and meta["source"] != json.loads(json.dumps(source)):
            return False
        for split in SPLITS:
            if f"{split}.bin" not in files or f"{split}_docs.npy" not in files:
                return False
        for name, info in files.items():
            path = out_dir / name
            if not path.is_file() or path.stat().st_size != info["bytes"] or file_sha256(path) != info["sha256"]:
                return False
    except (OSError, ValueError, KeyError, TypeError):  # missing / unreadable / malformed meta.json
        return False
    return True


def prepare_command(data_dir) -> str:
    """The command that (re)creates data_dir, for error messages."""
    name = Path(data_dir).name
    if name == "shakespeare":
        return "python data/shakespeare/prepare.py"
    return f"python data/text/prepare.py <folder> --name {name}"


def load_meta(data_dir) -> dict:
    path = Path(data_dir) / "meta.json"
    if not path.is_file():
        raise FileNotFoundError(f"no prepared data in {data_dir} (missing meta.json); run: {prepare_command(data_dir)}")
    return json.loads(path.read_text())


def load_split(data_dir, split) -> tuple[np.memmap, np.ndarray]:
    """(uint16 memmap of the split's tokens, int64 (n_docs, 2) document bounds)."""
    if split not in SPLITS:
        raise ValueError(f"split={split!r} is not allowed; use one of {SPLITS}")
    meta = load_meta(data_dir)
    bin_path = Path(data_dir) / f"{split}.bin"
    # a cheap size check (no hashing) catches missing or truncated files before they give odd batches
    expected = meta["files"][f"{split}.bin"]["bytes"]
    actual = bin_path.stat().st_size if bin_path.is_file() else None
    if actual != expected:
        raise ValueError(f"{bin_path} has {actual} bytes, meta.json says {expected}; re-run: {prepare_command(data_dir)}")
    tokens = np.memmap(bin_path, dtype=np.uint16, mode="r")
    docs = np.load(Path(data_dir) / f"{split}_docs.npy")
    return tokens, docs


def get_batch(tokens, batch_size: int, block_size: int,
              rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """nanoGPT-style random windows: x = tokens[i:i+T], y = tokens[i+1:i+1+T], int64 CPU tensors (B, T).

    Windows may cross document boundaries (through the EOT), as in nanoGPT training."""
    if batch_size < 1 or block_size < 1:
        raise ValueError(f"batch_size={batch_size} and block_size={block_size} must both be >= 1")
    n = len(tokens)
    if n < block_size + 1:
        raise ValueError(f"split has {n} tokens, fewer than block_size+1={block_size + 1}; use a smaller block_size or more data")
    ix = rng.integers(0, n - block_size, size=batch_size)  # high is exclusive: the last y token is tokens[n-1]
    x = torch.from_numpy(np.stack([tokens[i:i + block_size] for i in ix]).astype(np.int64))
    y = torch.from_numpy(np.stack([tokens[i + 1:i + 1 + block_size] for i in ix]).astype(np.int64))
    return x, y


def doc_windows(docs: np.ndarray, length: int, n_windows: int, rng: np.random.Generator) -> np.ndarray:
    """Sorted start offsets of up to n_windows windows of `length` tokens, each inside one document.

    Candidates are the non-overlapping aligned windows [start + k*length, start + (k+1)*length) of every
    document long enough; n_windows of them are drawn without replacement, so the choice is spread
    over the documents (proportional to their length) and fixed by the rng. Returns all candidates
    if there are no more than n_windows."""
    if length < 1 or n_windows < 1:
        raise ValueError(f"length={length} and n_windows={n_windows} must both be >= 1")
    docs = np.asarray(docs, dtype=np.int64).reshape(-1, 2)
    doc_lens = docs[:, 1] - docs[:, 0]
    per_doc = doc_lens // length
    total = int(per_doc.sum())
    if total == 0:
        longest = int(doc_lens.max()) if len(doc_lens) else 0
        raise ValueError(f"no window of length {length} fits inside a document: the longest document has "
                         f"{longest} tokens, so 0 windows are available; use a length <= {longest}")
    # k-th window of each document: its start plus k*length, k counting from 0 within the document
    first = np.repeat(docs[:, 0], per_doc)
    k = np.arange(total) - np.repeat(np.cumsum(per_doc) - per_doc, per_doc)
    starts = first + k * length
    if total > n_windows:
        starts = starts[rng.choice(total, size=n_windows, replace=False)]
    return np.sort(starts)
