"""
Training-step throughput of a config on random tokens: tokens/s, TFLOP/s, MFU (where the peak is known)
and peak memory. No data, no checkpoint, no wandb.

    python bench.py configs/rope_small.py [--key=value ...] [--vocab_size=2048] [--steps=20]
"""
import resource
import sys
import time

import torch

from model import GPT
from runtime import autocast, peak_flops, pick_device, run_cli
from train import load_config, model_config


def bench(argv):
    extra = {a.split("=")[0][2:]: int(a.split("=")[1]) for a in argv if a.startswith(("--vocab_size=", "--steps="))}
    config = load_config([a for a in argv if not a.startswith(("--vocab_size=", "--steps="))])
    vocab_size, steps = extra.get("vocab_size", 2048), extra.get("steps", 20)
    device = pick_device(config["device"])
    device_type = device.split(":")[0]
    dtype, ctx = autocast(config["dtype"], device_type)
    model = GPT(model_config(config, vocab_size)).to(device)
    optimizer = model.configure_optimizers(0.1, 1e-4, (0.9, 0.95), device_type)
    step_model = torch.compile(model) if config["compile"] else model
    B, T = config["batch_size"], config["block_size"]
    x = torch.randint(vocab_size, (B, T + 1), device=device)

    def step():
        with ctx:
            _, loss = step_model(x[:, :-1], x[:, 1:])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device_type == "cuda":
            torch.cuda.synchronize()

    for _ in range(3):  # warm-up (and compilation)
        step()
    t0 = time.time()
    for _ in range(steps):
        step()
    tok_s = B * T * steps / (time.time() - t0)
    flops = model.flops_per_token(T) * tok_s
    peak = peak_flops(device_type)
    memory = (torch.cuda.max_memory_allocated() / 2**20 if device_type == "cuda"
              else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10)
    print(f"{model.num_params() / 1e6:.2f}M params, vocab {vocab_size}, batch {B}x{T}, {device}, {dtype}, "
          f"compile={config['compile']}, {torch.get_num_threads()} threads")
    print(f"{tok_s:,.0f} tokens/s, {flops / 1e12:.3f} TFLOP/s" + (f", MFU {100 * flops / peak:.1f}%" if peak else "")
          + f", peak memory {memory:,.0f} MiB ({'CUDA allocated' if device_type == 'cuda' else 'process RSS'})")


if __name__ == "__main__":
    run_cli("bench.py", bench, sys.argv[1:])
