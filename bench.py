"""Training-step throughput of a config on random tokens (tokens/s, TFLOP/s, MFU where the peak is known, peak memory);
or, with --nanogpt, a karpathy/nanoGPT checkout's model beside ours (learned, rope) on the CPU: median ms per step.

    python bench.py configs/rope_small.py [--key=value ...] [--vocab_size=2048] [--steps=20]
    python bench.py --nanogpt=PATH/TO/nanoGPT [--steps=15]
"""
import importlib.util
import resource
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch

from model import GPT, GPTConfig
from common import UserError, parse_number, pick_device, run_cli
from runtime import autocast, peak_flops
from config import load_config, model_config

OPTIONS = ("--vocab_size=", "--steps=", "--nanogpt=")


def train_step(model, optimizer, x, y, ctx=nullcontext(), sync=False):
    with ctx:
        _, loss = model(x, y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if sync:
        torch.cuda.synchronize()


def bench(argv):
    extra = {a.split("=")[0][2:]: a.split("=", 1)[1] for a in argv if a.startswith(OPTIONS)}
    if "nanogpt" in extra:
        return versus_nanogpt(Path(extra["nanogpt"]), parse_number(extra.get("steps", "15"), "steps", int, 1))
    config = load_config([a for a in argv if not a.startswith(OPTIONS)])
    vocab_size = parse_number(extra.get("vocab_size", "2048"), "vocab_size", int, 1)
    steps = parse_number(extra.get("steps", "20"), "steps", int, 1)
    device = pick_device(config["device"])
    device_type = device.split(":")[0]
    dtype, ctx = autocast(config["dtype"], device_type)
    model = GPT(model_config(config, vocab_size)).to(device)
    optimizer = model.configure_optimizers(0.1, 1e-4, (0.9, 0.95), device_type)
    step_model = torch.compile(model) if config["compile"] else model
    B, T = config["batch_size"], config["block_size"]
    x, y = torch.randint(vocab_size, (2, B, T), device=device)
    for _ in range(3):  # warm-up (and compilation)
        train_step(step_model, optimizer, x, y, ctx, device_type == "cuda")
    t0 = time.time()
    for _ in range(steps):
        train_step(step_model, optimizer, x, y, ctx, device_type == "cuda")
    tok_s = B * T * steps / (time.time() - t0)
    flops = model.flops_per_token(T) * tok_s
    peak = peak_flops(device_type)
    memory = (torch.cuda.max_memory_allocated() / 2**20 if device_type == "cuda"
              else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10)
    print(f"{model.num_params() / 1e6:.2f}M params, vocab {vocab_size}, batch {B}x{T}, {device}, {dtype}, "
          f"compile={config['compile']}, {torch.get_num_threads()} threads")
    print(f"{tok_s:,.0f} tokens/s, {flops / 1e12:.3f} TFLOP/s" + (f", MFU {100 * flops / peak:.1f}%" if peak else "")
          + f", peak memory {memory:,.0f} MiB ({'CUDA allocated' if device_type == 'cuda' else 'process RSS'})")


def versus_nanogpt(root, blocks):
    path = root / "model.py"
    if not path.is_file():
        raise UserError(f"--nanogpt={root}: no model.py there; give a checkout of karpathy/nanoGPT")
    spec = importlib.util.spec_from_file_location("nanogpt_model", path)
    nano = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(nano)
    shape = dict(block_size=128, vocab_size=2048, n_layer=4, n_head=6, n_embd=192, dropout=0.0)
    models = {"nanoGPT": lambda: nano.GPT(nano.GPTConfig(**shape, bias=False)),
              "ours, learned": lambda: GPT(GPTConfig(**shape, pos_emb="learned")),
              "ours, rope": lambda: GPT(GPTConfig(**shape, pos_emb="rope"))}
    x, y = torch.randint(2048, (2, 16, 128))
    runs = {}
    for name, make in models.items():
        torch.manual_seed(0)
        model = make()
        runs[name] = (model, model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu"), [])
        for _ in range(5):  # warm-up
            train_step(model, runs[name][1], x, y)
    for _ in range(blocks):  # blocks of 10 steps taken in turn, so that a noisy machine slows all three alike
        for model, optimizer, times in runs.values():
            t0 = time.perf_counter()
            for _ in range(10):
                train_step(model, optimizer, x, y)
            times.append((time.perf_counter() - t0) * 100)  # ms per step
    median = {name: statistics.median(times) for name, (_, _, times) in runs.items()}
    print(f"4x192, T 128, batch 16, vocab 2048, cpu float32, {torch.get_num_threads()} threads, torch "
          f"{torch.__version__}; median of {blocks} blocks of 10 steps")
    for name, ms in median.items():
        print(f"{name:14s} {ms:6.1f} ms/step {2048 / ms * 1000:8,.0f} tokens/s  {median['nanoGPT'] / ms:.3f}x nanoGPT")


if __name__ == "__main__":
    run_cli("bench.py", bench, sys.argv[1:])
