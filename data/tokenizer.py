"""The tokenizers of a run's text (run_tokenizer picks a run's): offline GPT-2 BPE (tiktoken) from the ranks shipped
in data/gpt2.tiktoken, optionally cut to the first ranks (keeping ranks < K is still a valid GPT-2 BPE, as a merged
token's two parts have lower ranks and survive the cut), or a pretrained model's own tokenizer: a folder's
tokenizer.json or a GGUF file's. A model folder's JSON files are read here through one table of keys (checked)."""
import base64
import functools
import hashlib
import json
import math
from contextlib import suppress
from pathlib import Path

import tiktoken
from common import UserError, data_dir

RANKS_PATH = Path(__file__).resolve().parent / "gpt2.tiktoken"
RANKS_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
GPT2_VOCAB_SIZE = 50257  # 50256 BPE ranks + <|endoftext|>
MIN_VOCAB_SIZE = 257     # 256 byte tokens + <|endoftext|>: anything smaller can't encode all bytes
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
EOT = "<|endoftext|>"


@functools.lru_cache(maxsize=None)
def load_ranks(path=RANKS_PATH, sha256=RANKS_SHA256):
    """Parse a tiktoken ranks file ('base64token rank' per line) after checking its sha256."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"GPT-2 ranks file not found: {path} (it is committed in the repo; restore it with: git checkout -- data/gpt2.tiktoken)")
    raw = path.read_bytes()
    if (digest := hashlib.sha256(raw).hexdigest()) != sha256:
        raise UserError(f"{path} has sha256 {digest}, expected {sha256}; the file is corrupted or not GPT-2's (restore it with: git checkout -- data/gpt2.tiktoken)")
    return {base64.b64decode(token): int(rank) for token, rank in (line.split() for line in raw.splitlines() if line)}


def gpt2_tokenizer(vocab_size: int = GPT2_VOCAB_SIZE) -> tiktoken.Encoding:
    """GPT-2 BPE keeping ranks < vocab_size - 1, with <|endoftext|> = vocab_size - 1 (50257: exactly GPT-2)."""
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or not MIN_VOCAB_SIZE <= vocab_size <= GPT2_VOCAB_SIZE:
        raise UserError(f"vocab_size={vocab_size!r} is not allowed; use an integer in {MIN_VOCAB_SIZE}..{GPT2_VOCAB_SIZE}")
    n_bpe = vocab_size - 1  # the last id is reserved for EOT
    return tiktoken.Encoding(f"gpt2-{vocab_size}", pat_str=GPT2_PATTERN, special_tokens={EOT: n_bpe},
                             mergeable_ranks={tok: r for tok, r in load_ranks().items() if r < n_bpe})


# ------------------------------------------------------------------ a model folder's JSON, checked where it comes in

REQUIRED = object()  # a key without a default


def integer(lowest):
    return lambda v: type(v) is int and v >= lowest, f"an integer >= {lowest:,}"


def number(test, allowed):  # finite: NaN passes no comparison, inf leaves no frequency
    return lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and test(v), allowed


def kind(t, allowed):
    return lambda v: isinstance(v, t), allowed


def token_ids(v):
    return type(v) is int and v >= 0 or isinstance(v, list) and v != [] and all(type(i) is int and i >= 0 for i in v)


def token_name(v):
    return isinstance(v, str) or isinstance(v, dict) and isinstance(v.get("content"), str)


POSITIVE = number(lambda v: v > 0, "a number > 0")
BOOL = kind(bool, "true or false (a JSON boolean, not a string)")
TEXT = kind(str, "a string")
DICT = kind(dict, "a JSON object (a dict)")
TOKENIZER_KEYS = {  # key: ((test, what is allowed), default); a default of None takes null as absent too
    "eos_token_id": ((token_ids, "a token id >= 0 or a non-empty list of them"), None),
    "eos_token": ((token_name, "a token's text, or an object with its text as 'content'"), None),
}


def checked(values, keys, where):
    """values (a JSON object) with every key of the table keys ({key: ((test, allowed), default)}) present and
    valid, a missing one at its default; keys the table does not name are left out. Anything else is one line
    naming the key, its value and what is allowed."""
    if not isinstance(values, dict):
        raise UserError(f"{where} is not a JSON object but {type(values).__name__}")
    out = {}
    for key, ((test, allowed), default) in keys.items():
        value = values.get(key)
        if key not in values or value is None and default is None:
            if default is REQUIRED:
                raise UserError(f"{where}: no {key!r} ({allowed})")
            out[key] = default
        elif not test(value):
            raise UserError(f"{where}: {key} {json.dumps(value, default=repr)[:60]} is not allowed: {allowed}")
        else:
            out[key] = value
    return out


def read_json(path, what):
    """The JSON in path; missing, not UTF-8 or not JSON is one line."""
    try:
        return json.loads(Path(path).read_bytes().decode())
    except FileNotFoundError:
        raise UserError(f"{path} is missing: a model folder holds config.json, *.safetensors and "
                        "tokenizer.json") from None
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
        raise UserError(f"{path} is damaged: not {what} ({type(e).__name__}: {str(e)[:60]})") from None


# ------------------------------------------------------------------ a pretrained model's own tokenizer

def end_of_text(model_dir, tok):
    """The id that ends a document: config.json's eos_token_id, else tokenizer_config.json's eos_token; None
    where neither names one."""
    configs = [checked(read_json(p, "JSON"), TOKENIZER_KEYS, p) for p in
               (Path(model_dir) / name for name in ("config.json", "tokenizer_config.json")) if p.is_file()]
    eos = next((c["eos_token_id"] for c in configs if c["eos_token_id"] is not None), None)
    if eos is None and (name := next((c["eos_token"] for c in configs if c["eos_token"]), None)):
        eos = tok.token_to_id(name if isinstance(name, str) else name["content"])
    return eos[0] if isinstance(eos, list) else eos


class ModelTokenizer:
    """A Hugging Face tokenizer.json's text (Hugging Face `tokenizers`) with the part of tiktoken's interface
    that the data writer and sample.py use; eot_token ends a document (None: the model names none). Text is
    encoded as it is: no BOS or other special token is added. Its identity, the sha256 of the file, is what a
    corpus it prepared records."""

    def __init__(self, text, eot_token, where):
        from tokenizers import Tokenizer
        try:
            self.tok = Tokenizer.from_str(text)
        except Exception as e:  # tokenizers raises a bare Exception for a file it cannot parse
            raise UserError(f"{where} is damaged ({str(e)[:80]})") from None
        self.text, self.identity = text, {"tokenizer.json": hashlib.sha256(text.encode()).hexdigest()}
        self.n_vocab = self.tok.get_vocab_size(with_added_tokens=True)
        self.eot_token = self.token(eot_token, where)

    def token(self, eot, where):
        """eot, once it is one of the tokenizer's ids (None: the model names no end-of-text token)."""
        if eot is not None and self.tok.id_to_token(eot) is None:
            raise UserError(f"{where}: the end-of-text id {eot:,} is not a token of its tokenizer "
                            f"({self.n_vocab:,} ids)")
        return eot

    def encode_ordinary(self, text):
        return self.tok.encode(text, add_special_tokens=False).ids

    def encode(self, text, allowed_special=()):  # its special tokens are always read as such
        return self.encode_ordinary(text)

    def decode(self, ids):
        return self.tok.decode(ids, skip_special_tokens=False)

    def decode_single_token_bytes(self, token):  # a token alone that ends mid-character decodes to U+FFFD
        return self.decode([token]).encode()


def folder_tokenizer(model_dir):
    """A model folder's tokenizer.json, ending documents with the end-of-text token its configs name; a llama.cpp
    GGUF file's tokenizer (gguf_tokenizer) for a .gguf file."""
    if Path(model_dir).suffix == ".gguf" and Path(model_dir).is_file():
        return gguf_tokenizer(read_gguf(model_dir), model_dir)
    path = Path(model_dir) / "tokenizer.json"
    if not path.is_file():
        raise UserError(f"{path} is missing: ropelab reads a model's tokenizer from its tokenizer.json "
                        "(the fast tokenizer file of the Hugging Face layout)")
    try:
        text = path.read_bytes().decode()
    except UnicodeDecodeError as e:
        raise UserError(f"{path} is damaged (not UTF-8 at byte {e.start})") from None
    tokenizer = ModelTokenizer(text, None, path)
    tokenizer.eot_token = tokenizer.token(end_of_text(model_dir, tokenizer.tok), model_dir)
    return tokenizer


# ------------------------------------------------------------------ a llama.cpp GGUF file's tokenizer

def read_gguf(path):
    """gguf.GGUFReader of path (the file mapped, nothing read yet); not a GGUF file is one line."""
    from gguf import GGUFReader
    try:
        return GGUFReader(path)
    except (ValueError, OSError, IndexError) as e:  # its magic, version or sizes wrong, or the file cut short
        raise UserError(f"{path} is damaged: not a GGUF file ({type(e).__name__}: {str(e)[:60]})") from None


def gguf_metadata(reader, prefix):
    """{key: value} of the reader's metadata under prefix (strings, numbers, lists of them)."""
    return {k: f.contents() for k, f in reader.fields.items() if k.startswith(prefix)}


GGUF_TOKENIZER_KEYS = {  # llama.cpp's keys, as transformers' own conversion of a GGUF tokenizer names them
    "tokenizer.ggml.model": ((lambda v: isinstance(v, str), "a string"), REQUIRED),
    "tokenizer.ggml.pre": ((lambda v: isinstance(v, str), "a string"), None),
    "tokenizer.ggml.tokens": ((lambda v: isinstance(v, list) and v != [], "a list of tokens"), REQUIRED),
    "tokenizer.ggml.merges": ((lambda v: isinstance(v, list), "a list of merges"), None),
    "tokenizer.ggml.token_type": ((lambda v: isinstance(v, list), "a list of token types"), None),
    "tokenizer.ggml.scores": ((lambda v: isinstance(v, list), "a list of scores"), None),
    "tokenizer.ggml.eos_token_id": ((lambda v: type(v) is int and v >= 0, "a token id >= 0"), None),
}


def gguf_tokenizer(reader, where):
    """The tokenizer a GGUF file's tokenizer.ggml.* metadata describes, built by transformers' own conversion
    (as AutoTokenizer.from_pretrained(..., gguf_file=...) builds it) and held as its tokenizer.json; the
    end-of-text id is tokenizer.ggml.eos_token_id."""
    from transformers.integrations.gguf import convert_gguf_tokenizer
    meta = checked(gguf_metadata(reader, "tokenizer.ggml."), GGUF_TOKENIZER_KEYS, f"{where}'s metadata")
    names = dict(model="tokenizer_type", pre="pre_tokenizer_type", tokens="tokens", merges="merges",
                 token_type="token_type", scores="scores")
    settings = {name: meta[f"tokenizer.ggml.{key}"] for key, name in names.items()
                if meta[f"tokenizer.ggml.{key}"] is not None}
    try:
        tok = convert_gguf_tokenizer(reader.fields["general.architecture"].contents(), settings)[0]
    except (ValueError, KeyError, TypeError) as e:  # a tokenizer type it has no builder for, say
        raise UserError(f"{where}: its tokenizer cannot be read ({str(e)[:120]})") from None
    return ModelTokenizer(tok.to_str(), meta["tokenizer.ggml.eos_token_id"], where)


def run_tokenizer(ckpt):
    """The tokenizer of a run's text: a converted model's own (its checkpoint holds it), a trained run's the one
    that prepared its data (GPT-2's BPE cut to the run's vocabulary, or a model's tokenizer.json kept beside the
    data), refused in one line where that one is not there."""
    if record := ckpt.get("pretrained"):
        return ModelTokenizer(record["tokenizer_json"], record["eot_token"], "the checkpoint's tokenizer.json")
    identity = (ckpt.get("data") or {}).get("tokenizer", "gpt2")  # older checkpoints: GPT-2's, as all were then
    if identity == "gpt2":
        return gpt2_tokenizer(ckpt["model_args"]["vocab_size"])
    folder = data_dir(ckpt["config"]["dataset"])
    with suppress(OSError, ValueError, KeyError):
        text = (folder / "tokenizer.json").read_bytes().decode()
        if {"tokenizer.json": hashlib.sha256(text.encode()).hexdigest()} == identity:
            return ModelTokenizer(text, json.loads((folder / "meta.json").read_text())["eot_token"], folder / "tokenizer.json")
    raise UserError(f"the run was trained on text tokenized with {identity}, and {folder} holds no tokenizer.json of "
                    "that sha256 to encode and decode with: run the command that prepared it again (data/text/prepare.py "
                    "... --tokenizer MODEL_DIR): it keeps the model's tokenizer.json beside the data, the data unchanged")
