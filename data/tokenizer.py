"""The tokenizers of a run's text (run_tokenizer picks a run's): offline GPT-2 BPE (tiktoken) from the ranks shipped
in data/gpt2.tiktoken, optionally cut to the first ranks (keeping ranks < K is still a valid GPT-2 BPE, as a merged
token's two parts have lower ranks and survive the cut), or a pretrained model's own tokenizer.json."""
import base64
import functools
import hashlib
import json
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


# ------------------------------------------------------------------ a pretrained model's own tokenizer

def end_of_text(model_dir, tok):
    """The id that ends a document: config.json's eos_token_id, else tokenizer_config.json's eos_token; None
    where neither names one."""
    paths = [Path(model_dir) / name for name in ("config.json", "tokenizer_config.json")]
    configs = [json.loads(p.read_text()) for p in paths if p.is_file()]
    eos = next((c["eos_token_id"] for c in configs if c.get("eos_token_id") is not None), None)
    if eos is None and (name := next((c["eos_token"] for c in configs if c.get("eos_token")), None)):
        eos = tok.token_to_id(name if isinstance(name, str) else name.get("content"))
    eos = eos[0] if isinstance(eos, list) else eos
    return eos if isinstance(eos, int) else None


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
        self.eot_token = eot_token

    def encode_ordinary(self, text):
        return self.tok.encode(text, add_special_tokens=False).ids

    def encode(self, text, allowed_special=()):  # its special tokens are always read as such
        return self.encode_ordinary(text)

    def decode(self, ids):
        return self.tok.decode(ids, skip_special_tokens=False)

    def decode_single_token_bytes(self, token):  # a token alone that ends mid-character decodes to U+FFFD
        return self.decode([token]).encode()


def folder_tokenizer(model_dir):
    """A model folder's tokenizer.json, ending documents with the end-of-text token its configs name."""
    path = Path(model_dir) / "tokenizer.json"
    if not path.is_file():
        raise UserError(f"{path} is missing: ropelab reads a model's tokenizer from its tokenizer.json "
                        "(the fast tokenizer file of the Hugging Face layout)")
    try:
        text = path.read_bytes().decode()
    except UnicodeDecodeError as e:
        raise UserError(f"{path} is damaged (not UTF-8 at byte {e.start})") from None
    tokenizer = ModelTokenizer(text, None, path)
    tokenizer.eot_token = end_of_text(model_dir, tokenizer.tok)
    return tokenizer


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
