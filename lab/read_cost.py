"""What reading a long input costs, per method: targets scored per second and peak memory for one window of
each length, through eval/score.py's path (crop: its strided truncation windows), on a model of Pythia-160M's
shape with random weights (the cost does not depend on the weights), or on a run's (a converted model's).

    python lab/read_cost.py [--model DIR] [--lengths 2,4] [--methods none,crop,yarn,...] [--device cpu]

Peak memory is what the method adds to the loaded model: on the CPU a forked process's peak resident memory
(VmHWM) above its start, on CUDA the allocator's peak above the memory in use before. A length under one token or
whose logits (and mask) alone exceed the free memory is refused before anything is measured; `pairs` is not taken (its cost
is yarn's: the same attention, other frequencies)."""
import math
import sys

import numpy as np
import torch


from common import UserError, command_parser, parse_list, pick_device, run_cli
from config import gpt_config
from eval.methods import MASKS, METHODS, forward_args, unavailable
from eval.score import score_units
from model import GPT
from runfolder import load_checkpoint
from runtime import model_from_checkpoint
from lab.measure import in_child, measured, memory_kib_of

PYTHIA_160M = dict(  # its config.json as pretrained.py converts it
    vocab_size=50304, n_layer=12, n_head=12, n_embd=768, block_size=2048, pos_emb="rope", rope_layout="half",
    rope_base=10000.0, rope_scaling={"rope_type": "default", "partial_rotary_factor": 0.25}, norm="layernorm",
    norm_eps=1e-5, biases=True, mlp="gelu", mlp_hidden=3072, parallel_residual=True, tie_embeddings=False)


def available_mib(device):
    """Memory free for one window on the device: CUDA's free memory, else the kernel's MemAvailable."""
    if device.startswith("cuda"):
        return torch.cuda.mem_get_info(device)[0] / 2**20
    return memory_kib_of("/proc/meminfo", "MemAvailable") / 1024


def check_lengths(model, lengths, methods, device):
    """A one-line error, before anything is scored, for a length under one token, one whose least memory exceeds
    the device's free memory, or a method the model cannot read. The least: the window's logits (float32, vocab_size
    a token), and for window, sinks and exact causal dynamic NTK their mask, 1 byte a pair (docs/benchmarks.md)."""
    L, vocab = model.config.block_size, model.config.vocab_size
    free = available_mib(device) * 2**20
    for m in lengths:
        T = round(m * L)
        if T < 1:
            raise UserError(f"--lengths {m:g} is {m * L:.3g} tokens at trained length {L}: use multiples of at least "
                            f"{1 / L:.3g} (one token)")
        for method in methods:
            name = method.removesuffix(" (causal)")
            if why := unavailable(model.config, name, T):
                raise UserError(f"--methods {method} cannot read {T:,} tokens of this model: {why}")
            mask = name.split(":")[0] in MASKS or name != method
            if (need := 4 * vocab * T + mask * T * T) > free:  # the most tokens: the root of T^2 + 4 vocab T = free
                most = free / (4 * vocab) if not mask else math.sqrt(4 * vocab**2 + free) - 2 * vocab
                raise UserError(f"--lengths {m:g} is {T:,} tokens, and {method} needs at least {need / 2**20:,.0f} MiB "
                                f"for them ({device} has {free / 2**20:,.0f} MiB free): use --lengths up to "
                                f"{most / L:.4g}")


def read_cost(args):
    device = pick_device(args["device"])
    if args["model"]:
        model = model_from_checkpoint(load_checkpoint(args["model"]))
    else:
        torch.manual_seed(0)
        model = GPT(gpt_config(PYTHIA_160M))
    model = model.to(device).eval()
    L = model.config.block_size
    check_lengths(model, args["lengths"], args["methods"], device)
    stride = max(1, L // 8)  # extrapolate.py's default crop stride
    dtype = "bf16 autocast" if device.startswith("cuda") else "float32"
    print(f"{model.num_params() / 1e6:.0f}M parameters, trained length {L}, {device}, {dtype}, "
          f"{torch.get_num_threads()} threads; crop strided by {stride}")
    print(f"{'method':22s}" + "".join(f"{f'{m:g}L = {round(m * L)}':>26s}" for m in args["lengths"]))
    rng = np.random.default_rng(0)
    for method in args["methods"]:
        cells = []
        for m in args["lengths"]:
            T = round(m * L)
            tokens = rng.integers(0, model.config.vocab_size, T + 1)
            name = method.removesuffix(" (causal)")
            how = forward_args(name, T, model.config.train_len, L, causal=name != method)
            def score():
                score_units(model, tokens, [0], T, "windows", T, None, how, stride)
            seconds, mib = measured(score, device) if device.startswith("cuda") else in_child(
                lambda: measured(score, device))
            cells.append(f"{T / seconds:9,.0f} tok/s {mib:7,.0f} MiB")
        print(f"{method:22s}" + "".join(f"{c:>26s}" for c in cells), flush=True)


def parse_args(argv):
    p = command_parser(__doc__, "device")
    p.add_argument("--model", default=None, help="a run folder, a converted model's say "
                                                 "(default: Pythia-160M's shape, random weights)")
    p.add_argument("--lengths", default="2,4", help="multiples of the trained length (default 2,4)")
    p.add_argument("--methods", default="none,crop,yarn,self-extend,rerope,dynamic-ntk (causal)",
                   help="eval/methods.py's; 'dynamic-ntk (causal)' for the exact causal mode")
    a = vars(p.parse_args(argv))
    a["lengths"] = parse_list(a["lengths"], "lengths", float)
    a["methods"] = parse_list(a["methods"], "methods", str)
    for method in a["methods"]:
        name = method.removesuffix(" (causal)").split(":")[0]
        if name not in METHODS:
            p.error(f"unknown --methods {method}; allowed: {', '.join(METHODS)}")
        if name == "pairs":  # the same attention as yarn's, other frequencies: the same cost
            p.error("--methods pairs is not taken (it needs per-pair factors): its cost is yarn's")
    if bad := [m for m in a["lengths"] if not m > 0]:
        p.error(f"--lengths {', '.join(f'{m:g}' for m in bad)}: use positive multiples of the trained length")
    return a


if __name__ == "__main__":
    run_cli("read_cost.py", lambda: read_cost(parse_args(sys.argv[1:])))
