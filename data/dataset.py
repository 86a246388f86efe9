"""
The prepared-dataset format, written by the data/<corpus>/prepare.py scripts and read here for
training batches and evaluation windows.

A prepared dataset directory holds:
  train.bin, val.bin            uint16 tokens: documents concatenated, each followed by one EOT
  train_docs.npy, val_docs.npy  int64 (n_docs, 2): [start, end) of each document's tokens (EOT excluded)
  meta.json                     tokenizer, splits (tokens, documents, and their names for a corpus of
                                named files), source, sizes + sha256 of every file above

meta.json is written last, so "meta.json present and every checksum matches" means
the output is complete; anything else is redone by the prepare scripts.
"""
import hashlib
import io
import json
import os
import time
from array import array
from collections import deque
from concurrent.futures import ThreadPoolExecutor
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
# the datasets data/shakespeare/prepare.py writes (into data/<name>/), by vocabulary size
SHAKESPEARE = {"shakespeare": VOCAB_SIZE, "shakespeare_bytes": 257}
CHUNK_CHARS = 1 << 20  # documents go to the tokenizer threads in chunks of about this many characters


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


def val_by_hash(key: str, val_fraction: float, seed: int = 0) -> bool:
    """Whether the document with this key is held out: a hash of (seed, key) against val_fraction.

    For streamed corpora, whose document count is unknown until the end: each document is placed as it
    is read, about val_fraction of them land in val, and which ones does not depend on the order, the
    number of documents or the number of workers (adding a file moves no other document)."""
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction={val_fraction!r} is not allowed; use a number strictly between 0 and 1")
    digest = hashlib.blake2b(f"{seed}:{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") < val_fraction * 2**64


def _npy_bytes(arr):
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


def _write_synced(path, data: bytes):
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _chunks(docs, chunk_chars):
    """Consecutive lists of (split, name, text) documents of about chunk_chars characters each."""
    chunk, size = [], 0
    for doc in docs:
        chunk.append(doc)
        size += len(doc[2])
        if size >= chunk_chars:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def _tokenize_chunk(enc, chunk):
    # encode_ordinary: a literal "<|endoftext|>" in the text is just text; ids < 50257 fit in uint16
    return [(split, name, np.asarray(enc.encode_ordinary(text), dtype=np.uint16)) for split, name, text in chunk]


def _tokenized(enc, docs, workers):
    """[(split, name, tokens)] chunk after chunk, in input order, tokenized by `workers` threads (tiktoken
    releases the GIL while it encodes, so threads run in parallel without pickling any text). At most
    2 * workers chunks are in flight: memory stays bounded whatever the size of the corpus."""
    with ThreadPoolExecutor(workers) as pool:
        pending = deque()
        for chunk in _chunks(docs, CHUNK_CHARS):
            pending.append(pool.submit(_tokenize_chunk, enc, chunk))
            if len(pending) >= 2 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def _append_tokens(enc, docs, bin_paths, workers, keep_names):
    """Write each (split, name, text) document's tokens and one EOT to its split's file, as they come.
    Returns per split: tokens written, their sha256, the flat [start, end, ...] bounds and the names."""
    eot = np.array([enc.eot_token], dtype=np.uint16).tobytes()
    stats = {s: {"tokens": 0, "sha256": hashlib.sha256(), "bounds": array("q"), "names": []} for s in SPLITS}
    with open(bin_paths["train"], "wb") as train, open(bin_paths["val"], "wb") as val, \
            tqdm(desc="tokenizing", unit="tok", unit_scale=True, disable=None) as bar:  # no bar if not a TTY
        files = {"train": train, "val": val}
        for chunk in _tokenized(enc, docs, workers):
            for split, name, ids in chunk:
                data, st = ids.tobytes() + eot, stats[split]
                files[split].write(data)
                st["sha256"].update(data)
                st["bounds"].extend((st["tokens"], st["tokens"] + len(ids)))  # 16 bytes a document
                st["tokens"] += len(ids) + 1
                if keep_names:
                    st["names"].append(name)
                bar.update(len(ids) + 1)
        for f in files.values():
            f.flush()
            os.fsync(f.fileno())
    return stats


def write_documents(docs, out_dir, vocab_size: int, source: dict | None = None, val_fraction: float = 0.1,
                    seed: int = 0, workers: int = 1, keep_names: bool = False) -> dict:
    """Tokenize a stream of (split, name, text) documents into out_dir (see module docstring); returns meta.

    Only the document bounds are held in memory: tokens go to temp files as they come. When the whole
    stream is written, the old meta.json is removed, the temp files are renamed into place and the new
    meta.json is written, so an error or a crash half-way leaves the previous dataset, or nothing, never
    a folder that is_prepared() accepts. keep_names records the documents' names in meta.json (for a
    corpus of named files, not a stream of millions of records)."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers={workers!r} is not allowed; use an integer >= 1")
    enc = gpt2_tokenizer(vocab_size)  # validates vocab_size; ids < 50257 fit in uint16
    out_dir = Path(out_dir)
    created = not out_dir.exists()
    out_dir.mkdir(parents=True, exist_ok=True)
    names = [f"{s}.bin" for s in SPLITS] + [f"{s}_docs.npy" for s in SPLITS]
    tmp = {name: out_dir / f".{name}.{os.getpid()}.tmp" for name in names}  # same folder: renames are atomic
    try:
        start = time.time()
        stats = _append_tokens(enc, docs, {s: tmp[f"{s}.bin"] for s in SPLITS}, workers, keep_names)
        seconds = time.time() - start
        n_docs = {s: len(stats[s]["bounds"]) // 2 for s in SPLITS}
        if 0 in n_docs.values():
            raise ValueError(f"{n_docs['train']} train and {n_docs['val']} val documents: need at least one in each; "
                             f"use more documents or a val_fraction (now {val_fraction}) nearer 0.5")
        files = {}
        for s in SPLITS:
            files[f"{s}.bin"] = {"bytes": 2 * stats[s]["tokens"], "sha256": stats[s]["sha256"].hexdigest()}
            bounds = np.frombuffer(stats[s]["bounds"], dtype=np.int64).reshape(-1, 2)
            files[f"{s}_docs.npy"] = _write_synced(tmp[f"{s}_docs.npy"], _npy_bytes(bounds))
        # drop the old meta.json first: while the files are swapped, nothing may vouch for the folder
        (out_dir / "meta.json").unlink(missing_ok=True)
        for name, path in tmp.items():
            os.replace(path, out_dir / name)
    except BaseException:
        for path in tmp.values():
            path.unlink(missing_ok=True)
        if created and not any(out_dir.iterdir()):
            out_dir.rmdir()
        raise
    splits = {}
    for s in SPLITS:
        splits[s] = {"tokens": stats[s]["tokens"], "documents": n_docs[s]}
        if keep_names:
            splits[s]["names"] = stats[s]["names"]
        print(f"{s}: {n_docs[s]:,} documents, {stats[s]['tokens']:,} tokens -> {out_dir / f'{s}.bin'}")
    total = sum(st["tokens"] for st in stats.values())
    print(f"tokenized {total:,} tokens in {seconds:.1f} s ({total / max(seconds, 1e-9):,.0f} tokens/s, workers={workers})")
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
    write_atomic(out_dir / "meta.json", lambda f: f.write((json.dumps(meta, indent=2) + "\n").encode()))
    return meta


def write_dataset(docs: dict[str, str], out_dir, vocab_size: int, val_fraction: float = 0.1, seed: int = 0,
                  source: dict | None = None, workers: int = 1) -> dict:
    """Tokenize {name: text} documents (a small corpus, in memory) into out_dir, split exactly by
    split_documents; names are recorded in meta.json. Returns the meta dict."""
    train, val = split_documents(docs, val_fraction, seed)
    stream = [("train", name, docs[name]) for name in train] + [("val", name, docs[name]) for name in val]
    return write_documents(stream, out_dir, vocab_size, source, val_fraction, seed, workers, keep_names=True)


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
    if name in SHAKESPEARE:
        return "python data/shakespeare/prepare.py" + (" --bytes" if name == "shakespeare_bytes" else "")
    return f"python data/text/prepare.py <source> --name {name}"


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


def get_rows(tokens, batch_size: int, block_size: int, rng: np.random.Generator) -> np.ndarray:
    """nanoGPT-style random windows of block_size+1 tokens, int64 [B, T+1]: a row's inputs are row[:-1]
    and its targets row[1:]. Windows may cross document boundaries (through the EOT), as in nanoGPT training."""
    if batch_size < 1 or block_size < 1:
        raise ValueError(f"batch_size={batch_size} and block_size={block_size} must both be >= 1")
    n = len(tokens)
    if n < block_size + 1:
        raise ValueError(f"split has {n} tokens, fewer than block_size+1={block_size + 1}; use a smaller block_size or more data")
    ix = rng.integers(0, n - block_size, size=batch_size)  # high is exclusive: the last target is tokens[n-1]
    return np.stack([tokens[i:i + block_size + 1] for i in ix]).astype(np.int64)


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
