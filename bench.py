"""Training-step throughput of a config on random tokens (tokens/s, TFLOP/s, MFU where the peak is known, peak memory);
or, with --nanogpt, a karpathy/nanoGPT checkout's model beside ours (learned, rope) on the CPU: median ms per step;
with --processes as well, the three trainings as whole processes (train.py against nanoGPT's train.py).

    python bench.py configs/rope_small.py [--key=value ...] [--vocab_size=2048] [--steps=20]
    python bench.py --nanogpt=PATH/TO/nanoGPT [--steps=15]
    python bench.py --nanogpt=PATH/TO/nanoGPT --processes [--repeats=3]
"""
import importlib.util
import pickle
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import torch

from model import GPT, GPTConfig
from common import ROOT, UserError, data_dir, parse_number, pick_device, run_cli
from runtime import autocast, peak_flops, training_data
from config import load_config, model_config

OPTIONS = ("--vocab_size=", "--steps=", "--nanogpt=", "--processes", "--repeats=")
SHAPE = dict(block_size=128, vocab_size=2048, n_layer=4, n_head=6, n_embd=192, dropout=0.0)


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
    extra = {a.split("=")[0][2:]: a.partition("=")[2] for a in argv if a.startswith(OPTIONS)}
    if "nanogpt" in extra and "processes" in extra:
        repeats = parse_number(extra.get("repeats", "3"), "repeats", int, 1)
        return processes_vs_nanogpt(nanogpt_checkout(Path(extra["nanogpt"])), repeats)
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


def nanogpt_checkout(root, files=("model.py",)):
    if missing := [f for f in files if not (root / f).is_file()]:
        raise UserError(f"--nanogpt={root}: no {', '.join(missing)} there; give a checkout of karpathy/nanoGPT")
    return root


def versus_nanogpt(root, blocks):
    spec = importlib.util.spec_from_file_location("nanogpt_model", nanogpt_checkout(root) / "model.py")
    nano = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(nano)
    models = {"nanoGPT": lambda: nano.GPT(nano.GPTConfig(**SHAPE, bias=False)),
              "ours, learned": lambda: GPT(GPTConfig(**SHAPE, pos_emb="learned")),
              "ours, rope": lambda: GPT(GPTConfig(**SHAPE, pos_emb="rope"))}
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


def processes_vs_nanogpt(root, repeats, short=10, long=50):
    """The three trainings as whole processes on the default corpus, each run for `long` and for `short` iterations in
    turn: the difference of the two is long - short iterations of the loop, with start-up, the evaluations and the
    final checkpoint cancelled. Prints the median difference of each and its speed against nanoGPT's."""
    nanogpt_checkout(root, ("train.py", "model.py", "configurator.py"))
    config = load_config([])
    training_data(config, True, False)  # prepared on first use, as train.py would
    folder = data_dir(config["dataset"])
    shape = [f"--{k}={v}" for k, v in SHAPE.items() if k != "vocab_size"] + [
        "--batch_size=16", "--device=cpu", "--dtype=float32", "--compile=False", "--warmup_iters=5",
        "--eval_interval=100000", "--eval_iters=1", "--log_interval=10"]  # one evaluation at the start, one at the end
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)  # nanoGPT reads data/<dataset>/ and configurator.py from the folder it runs in
        (tmp / "data" / "bench").mkdir(parents=True)
        for name in ("train.bin", "val.bin"):
            (tmp / "data" / "bench" / name).symlink_to(folder / name)
        (tmp / "data" / "bench" / "meta.pkl").write_bytes(pickle.dumps({"vocab_size": SHAPE["vocab_size"]}))
        (tmp / "configurator.py").symlink_to(root.resolve() / "configurator.py")
        nano = [sys.executable, str(root.resolve() / "train.py"), "--dataset=bench", "--bias=False",
                "--gradient_accumulation_steps=1", "--always_save_checkpoint=False", f"--out_dir={tmp}/nano"]
        ours = [sys.executable, str(ROOT / "train.py"), f"--dataset={folder}", "--wandb_log=False"]
        commands = {"nanoGPT": lambda n, r: nano + [f"--max_iters={n}", f"--lr_decay_iters={n}"],
                    "ours, learned": lambda n, r: ours + ["--pos_emb=learned", f"--max_iters={n}", f"--out_dir={tmp}/l{n}_{r}"],
                    "ours, rope": lambda n, r: ours + ["--pos_emb=rope", f"--max_iters={n}", f"--out_dir={tmp}/r{n}_{r}"]}
        loop = {name: [] for name in commands}
        for r in range(repeats):  # in turn, so that a drifting machine slows all three alike
            for name, command in commands.items():
                # nanoGPT's train.py logs its last iteration: a train.py that is not nanoGPT's would time nothing
                seconds = [timed(command(n, r) + shape, tmp, f"iter {n}: loss" if name == "nanoGPT" else None)
                           for n in (long, short)]
                loop[name].append(seconds[0] - seconds[1])
                print(f"repeat {r + 1}/{repeats}, {name}: {seconds[0]:.2f} s - {seconds[1]:.2f} s", file=sys.stderr)
    print(f"whole processes, 4x192, T 128, batch 16, vocab 2048, cpu float32, torch {torch.__version__}: "
          f"the {long}-iteration run minus the {short}-iteration one, median of {repeats} repeats")
    for name, diffs in loop.items():
        speeds = sorted(n / d for n, d in zip(loop["nanoGPT"], diffs))  # per repeat: the spread is the noise
        print(f"{name:14s} {statistics.median(diffs):6.2f} s for {long - short} iterations  "
              f"{statistics.median(speeds):.3f}x nanoGPT (repeats {speeds[0]:.3f} to {speeds[-1]:.3f})")


def timed(command, cwd, expected=None):
    """Seconds the command took; expected: what its output must hold, else a one-line error."""
    t0 = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    if done.returncode:
        raise UserError(f"{' '.join(command[:2])} failed: {(done.stderr.strip().splitlines() or [''])[-1]}")
    if expected and expected not in done.stdout:
        raise UserError(f"{command[1]} printed no {expected!r} line: karpathy/nanoGPT's train.py prints one at "
                        f"the last iteration; give a checkout of karpathy/nanoGPT")
    return time.perf_counter() - t0


if __name__ == "__main__":
    run_cli("bench.py", bench, sys.argv[1:])
