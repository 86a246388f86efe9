"""Offline GPT-2 BPE (tiktoken) from the ranks shipped in data/gpt2.tiktoken, optionally cut to the first ranks:
keeping ranks < K is still a valid GPT-2 BPE, as a merged token's two parts have lower ranks and survive the cut."""
import base64
import functools
import hashlib
from pathlib import Path

import tiktoken
from common import UserError

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
