"""A converted model read by this repository's GPT against transformers' own forward of the same Hugging Face
folder, method by method (transformers' rope_parameters for yarn, linear and dynamic): tokens per second, peak
memory above the loaded model (a forked process's peak resident set) and the NLL difference, on one window of
random tokens (the cost does not depend on the text). docs/benchmarks.md, "A real model against transformers".

    python lab/hf_bench.py MODEL_DIR RUN_DIR --lengths 1,2 --methods none,yarn,pi,dynamic-ntk --threads 1,2
"""
import sys

import numpy as np
import torch
from torch.nn import functional as F

from common import UserError, command_parser, parse_list, run_cli
from eval.methods import forward_args
from lab.measure import in_child, measured
from runfolder import load_checkpoint
from runtime import model_from_checkpoint

# the method's rope_parameters in transformers at factor s over the trained length L (its dynamic's factor: DESIGN's
# multiplier a = 1 reads as plain dynamic NTK)
HF = {"none": lambda s, L: None,
      "pi": lambda s, L: {"rope_type": "linear", "factor": s},
      "yarn": lambda s, L: {"rope_type": "yarn", "factor": s, "original_max_position_embeddings": L},
      "dynamic-ntk": lambda s, L: {"rope_type": "dynamic", "factor": 1.0, "original_max_position_embeddings": L}}


def hf_model(folder, method, s, L):
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging
    logging.disable_progress_bar()
    config = AutoConfig.from_pretrained(folder)
    theta = config.rope_parameters["rope_theta"]
    if (scaling := HF[method](s, L)) is not None:
        config.rope_parameters = {"rope_theta": theta, **scaling}
    if method != "dynamic-ntk":  # transformers' dynamic takes its original length from max_position_embeddings
        config.max_position_embeddings = max(config.max_position_embeddings, round(s * L))
    return AutoModelForCausalLM.from_pretrained(folder, config=config, dtype=torch.float32).eval()


def nll(logits, row):
    return F.cross_entropy(logits[0].float(), torch.from_numpy(row[1:]), reduction="none").double().numpy()


def read(impl, folder, run, method, length, threads):
    """(seconds, peak MiB above the loaded model, per-target NLL) of one forward, in a forked child."""
    torch.set_num_threads(threads)
    ckpt = load_checkpoint(run)
    L = ckpt["model_args"].get("train_len") or ckpt["model_args"]["block_size"]
    n, s = round(length * L), max(1.0, length)
    row = np.random.default_rng(0).integers(0, ckpt["model_args"]["vocab_size"], n + 1)
    x = torch.from_numpy(row[None, :-1])
    if impl == "gpt":
        model = model_from_checkpoint(ckpt).eval()
        how = forward_args(method, n, L, L)
        forward = lambda: model(x, method=how)[0]
    else:
        model = hf_model(folder, method, s, L)
        forward = lambda: model(x, use_cache=False).logits
    del ckpt
    out = {}

    def step():
        with torch.no_grad():
            out["nll"] = nll(forward(), row)
    seconds, mib = measured(step, "cpu")
    return seconds, mib, out["nll"]


def main(argv):
    p = command_parser(__doc__)
    p.add_argument("model_dir", help="the Hugging Face folder the run was converted from")
    p.add_argument("run", help="its converted run folder")
    p.add_argument("--lengths", default="2", help="multiples of the trained length (default 2)")
    p.add_argument("--methods", default="none,yarn,pi,dynamic-ntk", help=f"of {', '.join(HF)}")
    p.add_argument("--threads", default="2,1", help="torch threads, each a set of readings (default 2,1)")
    a = p.parse_args(argv)
    methods = parse_list(a.methods, "methods", str, tuple(HF))
    lengths, threads = parse_list(a.lengths, "lengths", float), parse_list(a.threads, "threads", int)
    if min(threads) < 1:
        raise UserError(f"--threads {a.threads}: each must be at least 1")
    print("| threads | length | method | GPT tokens/s | transformers tokens/s | GPT / transformers time | "
          "GPT peak MiB | transformers peak MiB | max abs NLL difference |")
    print("| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for t in threads:
        for length in lengths:
            for method in methods:
                (gs, gm, gn), (hs, hm, hn) = (in_child(lambda: read(impl, a.model_dir, a.run, method, length, t))
                                              for impl in ("gpt", "hf"))
                n = len(gn)
                print(f"| {t} | {n:,} | `{method}` | {n / gs:,.0f} | {n / hs:,.0f} | {gs / hs:.2f} | {gm:,.0f} | "
                      f"{hm:,.0f} | {np.abs(gn - hn).max():.1e} |", flush=True)


if __name__ == "__main__":
    run_cli("hf_bench.py", lambda: main(sys.argv[1:]))
