"""The prepared-dataset format's checked readers (docs/reference.md, "Data"; its writer: data/writer.py)."""
import json
from contextlib import suppress
from pathlib import Path

import numpy as np

from common import UserError, file_sha256, write_atomic

SPLITS = ("train", "val")
DATA_FILES = tuple(f"{s}{end}" for s in SPLITS for end in (".bin", "_docs.npy"))
# GPT-2 BPE's first 2047 merges + EOT: the output layer dominates a small model on a CPU (README)
VOCAB_SIZE = 2048
SHAKESPEARE = {"shakespeare": VOCAB_SIZE, "shakespeare_bytes": 257}  # and shakespeare_v<N>
VERIFY_ONCE_BYTES = 1 << 30  # a larger file is hashed once, then trusted while its size and mtime stay
UINT16_IDS = 1 << 16  # a vocabulary of up to this many ids is stored as uint16, else as uint32 (Llama 3)


def shakespeare_vocab(name):  # data/<name>'s vocabulary where data/shakespeare/prepare.py writes it
    v = name.removeprefix("shakespeare_v")
    return SHAKESPEARE.get(name) or (int(v) if v != name and v.isdecimal() else None)


def builtin(name):  # the data/<folder>/prepare.py of a corpus train.py prepares on first use
    return "shakespeare" if shakespeare_vocab(name) else "sympy" if name == "sympy" else None


def prepare_command(data_dir):
    name = Path(data_dir).name
    if name == "recent":
        return "python data/recent/prepare.py --tokenizer MODEL_DIR"
    if not (corpus := builtin(name)):
        return f"python data/text/prepare.py <source> --name {name}"
    vocab = shakespeare_vocab(name)  # shakespeare's vocabulary is an option; sympy's is fixed
    options = {VOCAB_SIZE: "", 257: " --bytes"}.get(vocab, f" --vocab_size {vocab}") if vocab else ""
    return f"python data/{corpus}/prepare.py{options}"


def check_tokenizer(data_dir, identity, what, model, fix):
    """data_dir's text refused unless `identity` (a tokenizer.json, or "gpt2") wrote it (its ids)."""
    if (theirs := load_meta(data_dir)["tokenizer"]) != identity:
        ours = "tokenizer.json" if isinstance(identity, dict) else f"tokenizer ({identity})"
        raise UserError(f"{what} was tokenized with {theirs}, not {model}'s {ours}: its ids would mean other "
                        f"tokens; {fix}")


def load_meta(data_dir, verify=True):
    """meta.json, and (verify) every data file checked against its size and sha256 (once if large)."""
    folder, fix = Path(data_dir), f"re-prepare it: {prepare_command(data_dir)}"
    where = folder / "meta.json"
    if not where.is_file():
        raise FileNotFoundError(f"no prepared data in {data_dir} (missing meta.json); "
                                f"run: {prepare_command(data_dir)}")
    try:
        meta = json.loads(where.read_text())
        files = {name: (meta["files"][name]["bytes"], meta["files"][name]["sha256"]) for name in DATA_FILES}
    except (ValueError, KeyError, TypeError) as e:  # not JSON, or a meta.json without the files' checksums
        raise UserError(f"{where} is damaged ({type(e).__name__}: {str(e)[:60]}); {fix}") from None
    vocab, eot, dtype = meta.get("vocab_size"), meta.get("eot_token"), meta.get("dtype", "uint16")
    # GPT-2's EOT id is the largest id written; a pretrained model's tokenizer puts its own anywhere
    ids = not isinstance(vocab, bool) and isinstance(vocab, int) and isinstance(eot, int) and 0 <= eot < vocab
    if not ids or meta.get("tokenizer", "gpt2") == "gpt2" and eot != vocab - 1:
        raise UserError(f"{where} is damaged: vocab_size {vocab!r} does not fit its ids (eot_token "
                        f"{eot!r} is an id below it, vocab_size - 1 with GPT-2's BPE); {fix}")
    if dtype not in ("uint16", "uint32") or np.iinfo(dtype).max < vocab - 1:
        raise UserError(f"{where} is damaged: dtype {dtype!r} does not hold vocab_size {vocab:,}'s "
                        f"ids (uint16 up to {UINT16_IDS:,} ids, else uint32); {fix}")
    stamp, stamps, fresh = folder / "verified.json", {}, {}
    with suppress(OSError, ValueError, TypeError):
        stamps = dict(json.loads(stamp.read_text()))
    for name, (size, sha) in files.items():
        path = folder / name
        actual = path.stat() if path.is_file() else None
        if not actual or actual.st_size != size:
            raise UserError(f"{path} " + (f"has {actual.st_size} bytes, meta.json says {size}"
                                          if actual else "is missing") + f"; {fix}")
        key = [size, actual.st_mtime_ns, sha]
        if verify and not (size > VERIFY_ONCE_BYTES and stamps.get(name) == key) and file_sha256(path) != sha:
            raise UserError(f"{path} is damaged: its sha256 is not meta.json's; {fix}")
        fresh.update({name: key} if verify and size > VERIFY_ONCE_BYTES else {})
    if fresh and fresh != stamps:
        with suppress(OSError):  # a read-only data folder is verified each time
            write_atomic(stamp, lambda f: f.write(json.dumps(fresh).encode()))
    return meta


def load_split(data_dir, split):
    """(memmap of the split's tokens, int64 (n_docs, 2) document bounds); load_meta verifies."""
    if split not in SPLITS:
        raise UserError(f"split={split!r} is not allowed; use one of {SPLITS}")
    # no "dtype" in meta.json: uint16
    dtype, folder = np.dtype(load_meta(data_dir, verify=False).get("dtype", "uint16")), Path(data_dir)
    docs = np.load(folder / f"{split}_docs.npy")
    # held-out text only has no train split; numpy maps no empty file
    if (folder / f"{split}.bin").stat().st_size == 0:
        return np.zeros(0, dtype), docs
    return np.memmap(folder / f"{split}.bin", dtype=dtype, mode="r"), docs


def held_out(docs, which):
    """All held-out documents, or the dev (even-numbered) or test (odd) half, by whole file."""
    chosen = {"all": docs, "dev": docs[0::2], "test": docs[1::2]}[which]
    if not len(chosen):
        raise UserError(f"--docs {which}: the held-out split has {len(docs)} document(s), none of them "
                        f"{which}; use --docs all, or a corpus with at least 2 held-out documents")
    return chosen


def get_rows(tokens, batch_size, block_size, rng):
    """nanoGPT's random windows, int64 [B, T+1] (inputs row[:-1], targets row[1:]), crossing EOTs."""
    # high is exclusive: the last target is the last token
    ix = rng.integers(0, len(tokens) - block_size, size=batch_size)
    return np.stack([tokens[i:i + block_size + 1] for i in ix]).astype(np.int64)


def doc_windows(docs, length, n_windows, rng):
    """Sorted starts of the windows start + k*length inside each document: all, or n_windows drawn of them."""
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


def in_tokens(multiples, option, train_len, docs):
    """--option's multiples of train_len in tokens, each a window inside a held-out document."""
    longest = int((docs[:, 1] - docs[:, 0]).max()) if len(docs) else 0
    for m in multiples:
        if round(m * train_len) < 1:
            raise UserError(f"--{option} {m:g} is under one token at training length {train_len}; "
                            "use a larger multiple")
        if round(m * train_len) >= longest:
            raise UserError(f"--{option} {m:g} is {m * train_len:,.6g} tokens, and the longest held-out "
                            f"document has {longest:,}: use --{option} below {(longest - 1) / train_len:.4g} "
                            f"(multiples of the training length {train_len})")
    return [round(m * train_len) for m in multiples]
