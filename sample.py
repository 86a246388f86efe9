"""Generate text from a trained run with any evaluation method, as far past the training length as you ask.
The KV cache re-rotates its unrotated keys at every step, so dynamic-ntk is exact (docs/methodology.md).
Options and outputs: docs/reference.md."""
import codecs
import math
import sys
from pathlib import Path

import torch
from torch.nn import functional as F

from data.tokenizer import EOT, run_tokenizer
from eval.methods import FIXED, forward_args, method_factor, unavailable
from common import MAX_FACTOR, UserError, command_parser, parse_number, run_cli, shared_values
from positions import AS_TRAINED
from rope import ORIGINAL, complete_scaling, scaling_type
from runfolder import load_checkpoint
from runtime import autocast, model_from_checkpoint


SEPARATOR = "\n---------------\n"


class KVCache:
    """Per-layer keys and values so far, keys *before* rotation: every step re-rotates them with the
    frequencies for the current length, exact for dynamic NTK (GPT.forward's `cache`)."""

    def __init__(self, n_layer):
        self.kv, self.length = [None] * n_layer, 0  # length: tokens already in the cache

    def update(self, layer, k, v):
        if self.kv[layer] is not None:
            k = torch.cat((self.kv[layer][0], k), dim=2)
            v = torch.cat((self.kv[layer][1], v), dim=2)
        self.kv[layer] = (k, v)
        return k, v


@torch.no_grad()
def generate(model, idx, max_new_tokens, temperature=1.0, top_k=None, on_token=None, method=AS_TRAINED):
    """Sample max_new_tokens after idx [B, T], every step with the same PositionArgs (past block_size the
    encoding extrapolates): through a KV cache, except under crop, where each token comes from its last `crop`
    tokens at positions 0 .. crop - 1 (nanoGPT's sampling). on_token(ids [B, 1]) sees each step's tokens as
    they come."""
    cache = None if method.crop else KVCache(model.config.n_layer)
    if cache is None:
        logits, _ = model(method.cropped(idx))
    else:
        logits, _ = model(idx[:, :exact_prefill(model.config, idx.size(1), method.rope_scaling)], cache=cache,
                          method=method)
        for t in range(cache.length, idx.size(1)):  # the rest of the prompt, one token per forward
            logits, _ = model(idx[:, t:t + 1], cache=cache, method=method)
    for _ in range(max_new_tokens):
        idx_next = sample_next(logits[:, -1, :], temperature, top_k)
        idx = torch.cat((idx, idx_next), dim=1)
        if on_token:
            on_token(idx_next)
        if cache is None:
            logits, _ = model(method.cropped(idx))
        else:
            logits, _ = model(idx_next, cache=cache, method=method)
    return idx


def exact_prefill(config, T, rope_scaling):
    """How many of T prompt tokens one forward can take exactly. All of them unless the scaling is dynamic:
    its frequencies follow the length of the forward, so past the original length one forward would give
    every prompt token the prompt's length where generation gives token t the length t + 1 (exact)."""
    if config.pos_emb != "rope":
        return T
    scaling = complete_scaling(rope_scaling, config.rope_scaling, config.block_size)
    if scaling_type(scaling) == "dynamic":
        return min(T, scaling[ORIGINAL])
    return T


def sample_next(logits, temperature=1.0, top_k=None):
    """One token id per row [B, 1] from logits [B, vocab]: divided by the temperature, cut to the top_k."""
    logits = logits.float() / max(temperature, 1e-8)
    if top_k is not None:
        v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
        logits[logits < v[:, [-1]]] = -float("inf")
    return torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)


def parse_args(argv):
    p = command_parser(__doc__, "run_dir", "device", "seed", seed=1337)
    prompt = p.add_mutually_exclusive_group()
    prompt.add_argument("--prompt", default=None, help=f"text to continue (default: {EOT}, a new document)")
    prompt.add_argument("--prompt_file", default=None, help="read the prompt from this file")
    p.add_argument("--method", default="none", help=f"one of {', '.join(FIXED)} (default none)")
    p.add_argument("--factor", default="auto", help="auto ((prompt + new tokens) / training length) or >= 1; "
                   "dynamic-ntk: transformers' extra multiplier a (auto: 1, plain dynamic NTK)")
    for name, default, text in (("max_new_tokens", 500, "tokens to generate"), ("num_samples", 1, "samples"),
                                ("top_k", 200, "keep the k most likely tokens (0: all)")):
        p.add_argument(f"--{name}", type=int, default=default, help=f"{text} (default {default})")
    p.add_argument("--temperature", type=float, default=0.8, help="> 0; --top_k 1 samples greedily")
    a = p.parse_args(argv)
    if a.method not in FIXED:
        raise UserError(f"unknown --method {a.method!r}; allowed: {', '.join(FIXED)}")
    for name, low in (("max_new_tokens", 1), ("num_samples", 1), ("top_k", 0)):
        parse_number(getattr(a, name), name, int, low)
    if a.temperature == math.inf:  # every token equally likely: noise, not the model
        raise UserError("--temperature inf samples uniformly at random; use a finite number > 0")
    if not a.temperature > 0:  # also catches nan
        raise UserError(f"--temperature must be > 0, got {a.temperature}; for greedy sampling use --top_k 1")
    try:
        factor = None if a.factor == "auto" else float(a.factor)
    except ValueError:
        raise UserError(f"--factor {a.factor!r} is not auto or a number") from None
    if factor is not None and not factor >= 1:
        raise UserError(f"--factor must be auto or a number >= 1, got {a.factor}")
    if factor == math.inf:  # passes `>= 1`: an infinite factor leaves no frequency
        raise UserError(f"--factor {a.factor} is not a finite number; use auto or a number >= 1")
    if factor is not None and factor > MAX_FACTOR:  # the evaluation's cap: past it the RoPE math overflows
        raise UserError(f"--factor {a.factor} is too large: use auto or a number <= {MAX_FACTOR:g}")
    if a.prompt == "":
        raise UserError(f"--prompt is empty; leave it out to start a new document ({EOT})")
    return dict(vars(a), factor=factor, **shared_values(a))


def streamer(enc, live):
    """(on_token for generation, the new ids so far per step, the text a last partial character leaves): with
    live, the first sample's text is printed as it comes, so a long generation shows progress and survives a
    Ctrl-C."""
    # a character may span tokens
    steps, decoder = [], codecs.getincrementaldecoder("utf-8")(errors="replace")
    def on_token(ids):
        steps.append(ids[:, 0].tolist())
        if live:
            print(decoder.decode(enc.decode_single_token_bytes(steps[-1][0])), end="", flush=True)
    return on_token, steps, lambda: decoder.decode(b"", final=True)


def read_prompt(path):
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"--prompt_file {path} is not UTF-8 text ({e.reason} at byte {e.start}); convert it "
                        "to UTF-8") from None
    except IsADirectoryError:
        raise UserError(f"--prompt_file {path} is a folder; give a text file") from None
    except FileNotFoundError:
        raise UserError(f"--prompt_file {path} not found") from None


def sample(args):
    ckpt = load_checkpoint(args["run_dir"], args["device"])
    model = model_from_checkpoint(ckpt).to(args["device"]).eval()
    cfg = model.config
    enc = run_tokenizer(ckpt)  # the run's vocabulary: the data is not needed, only its tokenizer
    text = read_prompt(args["prompt_file"]) if args["prompt_file"] else args["prompt"]
    if args["prompt_file"] and not text:
        raise UserError(f"--prompt_file {args['prompt_file']} is empty; leave it out to start a new document "
                        f"({EOT})")
    if not text and enc.eot_token is None:
        raise UserError(f"{args['run_dir']}'s model names no end-of-text token to start a new document: give "
                        "--prompt")
    # an <|endoftext|> in the prompt is the document boundary the model was trained with
    prompt = enc.encode(text, allowed_special={EOT}) if text else [enc.eot_token]
    total, method, train_len = len(prompt) + args["max_new_tokens"], args["method"], cfg.train_len
    if reason := unavailable(cfg, method, total):  # before any sampling
        raise UserError(f"--method {method}: {reason}")
    if (factor := method_factor(method, total, train_len, args["factor"])) and factor > MAX_FACTOR:
        raise UserError(f"--max_new_tokens {args['max_new_tokens']}: {total} tokens make --method {method}'s "
                        "factor "
                        f"{factor:.3g}, above {MAX_FACTOR:g}; ask for fewer tokens or pin --factor")
    how = forward_args(method, total, train_len, cfg.block_size, args["factor"])
    print(f"{args['run_dir']}: pos_emb={cfg.pos_emb}, trained at L={train_len}; {len(prompt)} prompt + "
          f"{args['max_new_tokens']} new tokens = {total / train_len:.3g} L; method {method}: "
          f"{'each token from its last L' if how.crop else how.settings() or 'as trained'}",
          file=sys.stderr)
    torch.manual_seed(args["seed"])
    idx = torch.tensor([prompt] * args["num_samples"], dtype=torch.long, device=args["device"])
    new, live = (args["max_new_tokens"], args["temperature"], args["top_k"] or None), args["num_samples"] == 1
    on_token, steps, rest = streamer(enc, live)
    if live:
        print(text or "", end="", flush=True)
    try:
        with autocast("auto", torch.device(args["device"]).type)[1]:
            generate(model, idx, *new, on_token=on_token, method=how)
    except KeyboardInterrupt:
        raise KeyboardInterrupt(f"after {len(steps)} of {args['max_new_tokens']} new tokens; the text so far "
                                "is above") from None
    finally:  # the text so far, whatever happens: the one sample streamed, or every sample printed now
        samples = [(text or "") + enc.decode([step[i] for step in steps]) for i in range(args["num_samples"])]
        print(*([rest()] if live else samples), sep=SEPARATOR, end=SEPARATOR)
    return samples


def main(argv):
    return run_cli("sample.py", lambda: sample(parse_args(argv)))


if __name__ == "__main__":
    main(sys.argv[1:])
