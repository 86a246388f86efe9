"""Prepare any corpus: a folder of .txt files, JSONL or Parquet files, or a Hugging Face dataset, streamed,
tokenized in parallel and split by whole document into train and val.

    python data/text/prepare.py SOURCE [--name NAME] [--out_dir DIR] [--text_field text]
                                [--vocab_size N | --tokenizer MODEL_DIR] [--val_fraction F] [--workers N]
                                [--overwrite]

SOURCE's forms, the split, the format, the guarantees and the errors: docs/reference.md ("Preparing any corpus").
"""
import gzip
import hashlib
import json
import os
import zlib
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm


from data.dataset import VOCAB_SIZE, builtin
from data.writer import claim_corpus, is_prepared, val_by_hash, write_dataset, write_documents
from data.tokenizer import GPT2_VOCAB_SIZE, folder_tokenizer
from common import UserError, command_parser, run_cli

SEED = 0
DATA_ROOT = Path(__file__).resolve().parents[1]  # data/
SUFFIXES = (".txt", ".jsonl", ".jsonl.gz", ".parquet")
HF = "hf:"
PARQUET_BATCH_ROWS = 1024  # rows read at a time: memory stays bounded by a batch, not by the file


def suffix(path):
    return next((s for s in SUFFIXES if path.name.endswith(s)), None)


def list_files(path):
    """(root, sorted corpus files): the files under a folder, or a single JSONL / Parquet file."""
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and suffix(p)
                       and not any(part.startswith(".") for part in p.relative_to(path).parts))
        if not files:
            raise UserError(f"{path} has no {', '.join('*' + s for s in SUFFIXES)} files")
        return path, files
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found; SOURCE is a folder, a .jsonl, .jsonl.gz or .parquet file, or hf:NAME[:CONFIG]")
    if suffix(path) in (None, ".txt"):
        raise UserError(f"{path}: a file SOURCE must be .jsonl, .jsonl.gz or .parquet "
                         f"(for .txt documents, pass the folder that holds them)")
    return path.parent, [path]


def fingerprint(root, files):
    """sha256 of each file's path, size and content, length-prefixed so no two lists hash alike (mtimes miss changes)."""
    h = hashlib.sha256()
    with tqdm(total=sum(p.stat().st_size for p in files), desc="hashing", unit="B", unit_scale=True,
              disable=None, leave=False) as bar:
        for path in files:
            rel = path.relative_to(root).as_posix().encode()
            h.update(len(rel).to_bytes(8, "little") + rel + path.stat().st_size.to_bytes(8, "little"))
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
                    bar.update(len(block))
    return h.hexdigest()


def read_text(path):
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{path} is not UTF-8 text ({e}); convert it or remove it") from None


def field_text(record, field, where):
    """The text of one JSONL or Hugging Face record ("" for a null)."""
    if not isinstance(record, dict) or field not in record:
        has = ", ".join(map(str, record)) if isinstance(record, dict) else f"a JSON {type(record).__name__}"
        raise UserError(f"{where}: no {field!r} field (the record has: {has or 'no fields'}); pass --text_field")
    text = record[field]
    if text is not None and not isinstance(text, str):
        raise UserError(f"{where}: field {field!r} is a {type(text).__name__}, not text")
    return text or ""


def jsonl_texts(path, rel, field):
    try:
        with (gzip.open if path.name.endswith(".gz") else open)(path, "rb") as f:
            for lineno, line in enumerate(f, 1):
                if line.strip():
                    try:
                        record = json.loads(line)
                    except ValueError as e:  # bad JSON or bad UTF-8
                        raise UserError(f"{path}:{lineno}: not a JSON line ({e})") from None
                    yield f"{rel}:{lineno}", field_text(record, field, f"{path}:{lineno}")
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:  # a truncated or corrupt .gz
        raise UserError(f"{path}: not a readable gzip file ({type(e).__name__}: {e})") from None


def check_parquet(files, field):
    """Fail before anything is written if a Parquet file has no text column named field."""
    for path in (p for p in files if suffix(p) == ".parquet"):
        try:
            schema = pq.read_schema(path)
        except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
            raise UserError(f"{path}: not a readable Parquet file ({e})") from None
        if field not in schema.names:
            raise UserError(f"{path}: no {field!r} column (it has: {', '.join(schema.names)}); pass --text_field")
        kind = schema.field(field).type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
            raise UserError(f"{path}: column {field!r} is {kind}, not text")


def file_records(root, files, field):
    """(key, text) of every record of the files, in order; the key names the file and line or row."""
    for path in files:
        rel = path.relative_to(root).as_posix()
        if path.name.endswith(".txt"):
            yield rel, read_text(path)
        elif path.name.endswith(".parquet"):
            batches = pq.ParquetFile(path).iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=[field])
            texts = (text for batch in batches for text in batch.column(0).to_pylist())
            yield from ((f"{rel}:{row}", text or "") for row, text in enumerate(texts))
        else:
            yield from jsonl_texts(path, rel, field)


def hf_records(spec, field):
    """(row index, text) of the train split of a Hugging Face dataset, streamed as it downloads."""
    try:
        import datasets
    except ImportError:
        raise UserError(f"{HF}{spec} needs the Hugging Face `datasets` package: pip install datasets") from None
    name, _, config = spec.partition(":")
    try:
        stream = datasets.load_dataset(name, config or None, split="train", streaming=True)
    except Exception as e:  # offline, no such dataset or config, ...: datasets raises many kinds
        raise OSError(f"cannot open Hugging Face dataset {spec!r} (offline? no such dataset or config?): "
                      f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}") from None
    if stream.features is not None and field not in stream.features:
        raise UserError(f"{HF}{spec}: no {field!r} field (it has: {', '.join(stream.features)}); pass --text_field")
    return ((str(i), field_text(row, field, f"{HF}{spec} row {i}")) for i, row in enumerate(stream))


def record_documents(records, val_fraction, where):
    """(split, None, text) of every non-empty record (not a lone EOT), placed by a hash of its key."""
    n = 0
    for key, text in records:
        if text:
            n += 1
            yield ("val" if val_by_hash(key, val_fraction, SEED) else "train"), None, text
    if n == 0:
        raise UserError(f"{where}: the corpus is empty (no non-empty documents)")


def default_name(source):
    if source.startswith(HF):
        name, _, config = source[len(HF):].partition(":")
        return name.rstrip("/").split("/")[-1] + (f"_{config}" if config else "")
    path = Path(source).resolve()
    return path.name[:-len(suffix(path))] if path.is_file() and suffix(path) else path.name


def prepare(source, name=None, text_field="text", vocab_size=None, val_fraction=0.1, workers=None, out_dir=None,
            overwrite=False, tokenizer=None):
    """Tokenize source into out_dir (default data/<name>), checking every option; a no-op if prepared from the same inputs,
    an error if another corpus is there (unless overwrite). tokenizer: a pretrained model's folder, whose
    tokenizer.json tokenizes instead of GPT-2's BPE (pretrained.py --dataset then reads the model with it)."""
    source = str(source)
    name = name or default_name(source)
    if not name or name in (".", "..") or "/" in name or "\\" in name:
        raise UserError(f"name={name!r} is not allowed; use a plain directory name (output goes to data/<name>/)")
    if builtin(name):
        raise UserError(f"name {name!r} is taken by a built-in corpus (data/{name}/); pass another --name")
    if not 0 < val_fraction < 1:
        raise UserError(f"val_fraction={val_fraction!r} is not allowed; use a number strictly between 0 and 1")
    if not text_field:
        raise UserError("text_field='' is not allowed; name the field that holds the text")
    workers = min(os.cpu_count() or 1, 8) if workers is None else workers
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise UserError(f"workers={workers!r} is not allowed; use an integer >= 1")
    if out_dir is not None and not str(out_dir).strip():
        raise UserError("--out_dir is empty; name the folder for the corpus, or leave it out for data/<name>/")
    out_dir = Path(out_dir) if out_dir is not None else DATA_ROOT / name
    if out_dir.resolve().parent == DATA_ROOT and builtin(out_dir.name):  # --out_dir data/shakespeare: --name's rule
        raise UserError(f"--out_dir {out_dir} is a built-in corpus's folder (data/{out_dir.name}/); choose another folder")
    if hf := source.startswith(HF):
        spec = source[len(HF):]
        if not spec.split(":")[0]:
            raise UserError(f"{source!r} is not allowed; use hf:NAME or hf:NAME:CONFIG")
        # a Hugging Face dataset is known by its name: a re-run does not notice a new upstream revision
        named, files, origin = False, [], {"hf": spec, "split": "train", "text_field": text_field}
    else:
        path = Path(source).resolve()
        root, files = list_files(path)
        named = all(suffix(p) == ".txt" for p in files)
        origin = {"folder" if path.is_dir() else "file": str(path), "sha256": fingerprint(root, files),
                  **({} if named else {"text_field": text_field})}
        print(f"{len(files)} files, {sum(p.stat().st_size for p in files):,} bytes from {path}")
    if tokenizer is not None and vocab_size is not None:
        raise UserError("--vocab_size cuts GPT-2's BPE; with --tokenizer the model's tokenizer sets it")
    enc = folder_tokenizer(tokenizer) if tokenizer is not None else None
    if enc and enc.eot_token is None:
        raise UserError(f"{tokenizer}: no end-of-text token (config.json's eos_token_id, "
                        "tokenizer_config.json's eos_token): documents need one between them")
    if enc:
        vocab_size = enc.n_vocab
    vocab_size = (VOCAB_SIZE if named else GPT2_VOCAB_SIZE) if vocab_size is None else vocab_size
    same = dict(source=origin, vocab_size=vocab_size, val_fraction=val_fraction)
    if enc:
        same["tokenizer"] = enc.identity
    if is_prepared(out_dir, **same):
        print(f"{out_dir}: already prepared (vocab_size={vocab_size}, same inputs)")
        return out_dir
    claim_corpus(out_dir, overwrite, **same)
    check_parquet(files, text_field)
    records = None if named else hf_records(spec, text_field) if hf else file_records(root, files, text_field)
    print(f"tokenizing with vocab_size={vocab_size}, workers={workers} -> {out_dir}")
    if named:  # a .txt file is a document, split exactly: the names are known
        write_dataset({p.relative_to(root).as_posix(): p for p in files}, out_dir, vocab_size, val_fraction, SEED,
                      origin, workers, read=read_text, tokenizer=enc)
    else:
        write_documents(record_documents(records, val_fraction, source), out_dir, vocab_size, origin, val_fraction,
                        SEED, workers, tokenizer=enc)
    return out_dir


if __name__ == "__main__":
    parser = command_parser(__doc__)
    parser.add_argument("source", help="a folder, a .jsonl / .jsonl.gz / .parquet file, or hf:NAME[:CONFIG]")
    parser.add_argument("--name", default=None, help="output goes to data/NAME/ (default: the folder's or file's name)")
    parser.add_argument("--out_dir", default=None, help="output folder instead of data/NAME/")
    parser.add_argument("--text_field", default="text", help="the JSONL / Parquet / Hugging Face field with the text (default text)")
    parser.add_argument("--vocab_size", type=int, default=None, help=f"257..{GPT2_VOCAB_SIZE} (default: {VOCAB_SIZE} for "
                        f"a folder of .txt files only, else {GPT2_VOCAB_SIZE}, the full GPT-2 vocabulary)")
    parser.add_argument("--val_fraction", type=float, default=0.1, help="fraction of documents held out (default 0.1)")
    parser.add_argument("--workers", type=int, default=None, help="tokenizer threads (default: the CPU count, at most 8)")
    parser.add_argument("--tokenizer", default=None, help="a pretrained model's folder: tokenize with its "
                        "tokenizer.json (then convert the model with pretrained.py --dataset NAME)")
    parser.add_argument("--overwrite", action="store_true", help="replace a corpus prepared in that folder from other inputs")
    run_cli("prepare.py", lambda: prepare(**vars(parser.parse_args())))
