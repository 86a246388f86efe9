"""What every command needs around the model: CLI helpers, device and dtype, wandb, where data lives, atomic writes
and checkpoints. Shared by train.py, bench.py, sample.py and eval/; no training loop, no model code."""
import argparse
import netrc
import os
import sys
from contextlib import nullcontext, suppress
from pathlib import Path

import torch

from model import GPT, GPTConfig

ROOT = Path(__file__).resolve().parent
PEAK_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12}  # dense bf16, for MFU
CHECKPOINT_KEYS = ("model", "model_args", "iter_num", "config")


class UserError(ValueError):
    """Bad input from the user (an option, a config, a file): run_cli prints it as one line. A bug keeps its traceback."""


def run_cli(prog, fn, *args):
    """fn(*args), with an expected failure (UserError, OSError) as `prog: error: <one line>`, exit 1; any other
    exception is a bug and keeps its traceback."""
    try:
        return fn(*args)
    except (UserError, OSError) as e:
        sys.exit(f"{prog}: error: {' '.join(str(e).split())}")


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # a ValueError, for run_cli's one line (argparse's own error takes two, with the usage)
        raise UserError(message)


def arg_parser(doc):
    return _Parser(description=doc.split("\n\n")[0].strip())


def parse_list(text, name, convert, allowed=None):
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise UserError(f"--{name} is empty")
    if allowed and (bad := [t for t in items if t not in allowed]):
        raise UserError(f"unknown --{name} {', '.join(bad)}; allowed: {', '.join(allowed)}")
    try:
        return list(dict.fromkeys(convert(t) for t in items))  # keep order, drop repeats
    except ValueError:  # the convert function's own: float("x")
        raise UserError(f"--{name} {text!r} is not a comma-separated list of numbers") from None


def number(text, name, convert, minimum):
    try:
        value = convert(text)
    except ValueError:
        raise UserError(f"--{name} {text!r} is not a{'n integer' if convert is int else ' number'}") from None
    if not value >= minimum:  # also catches nan
        raise UserError(f"--{name} must be >= {minimum}, got {text}")
    return value


def pick_device(name):
    kind, available = name.split(":")[0], dict(cuda=torch.cuda.is_available, mps=torch.backends.mps.is_available)
    if kind not in ("auto", "cpu", "cuda", "mps"):
        raise UserError(f"device={name!r} is not one of: auto, cpu, cuda, cuda:N, mps")
    if kind in available and not available[kind]():
        why = "Apple GPUs only" if kind == "mps" else f"torch {torch.__version__} " + (
            f"(CUDA {torch.version.cuda}) sees no GPU" if torch.version.cuda else "is a CPU-only build")
        raise UserError(f"device={name!r} but this torch has no {kind.upper()}: {why}; use --device=cpu or auto")
    return name if kind != "auto" else next((k for k, ok in available.items() if ok()), "cpu")


def autocast(dtype, device_type):
    """(dtype name, context for the forward pass): mixed precision through autocast, float32 as is."""
    if dtype == "auto":
        dtype = "bfloat16" if device_type == "cuda" and torch.cuda.is_bf16_supported() else "float32"
    return dtype, nullcontext() if dtype == "float32" else torch.autocast(device_type, dtype=getattr(torch, dtype))


def peak_flops(device_type):
    name = torch.cuda.get_device_name() if device_type == "cuda" else ""
    return next((v for k, v in PEAK_FLOPS.items() if k in name), None)


def data_dir(dataset):
    return Path(dataset) if Path(dataset).is_absolute() else ROOT / "data" / dataset


def synced(f):  # flush f to the disk, so that renaming it into place is safe against a crash
    f.flush()
    os.fsync(f.fileno())


def write_atomic(path, write):
    """write(f) into a temp file beside path, renamed over it: a crash leaves the old file or the new one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # same folder: os.replace is then a rename
    try:
        with open(tmp, "wb") as f:
            write(f)
            synced(f)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def init_wandb(config, job_type, group):
    """A wandb run that never blocks on a login prompt: online when logged in, else offline."""
    import wandb
    logged_in = False
    with suppress(OSError, netrc.NetrcParseError):
        logged_in = os.environ.get("WANDB_API_KEY") or netrc.netrc().authenticators("api.wandb.ai")
    mode = os.environ.get("WANDB_MODE") or ("online" if logged_in else "offline")
    return wandb.init(project=config["wandb_project"], name=f"{config['wandb_run_name']}-{job_type}", group=group,
                      job_type=job_type, config=config, mode=mode)


def load_checkpoint(path, device="cpu"):
    """Read a ckpt.pt written by train.py (path: the file or its run folder)."""
    path = Path(path) / "ckpt.pt" if Path(path).is_dir() else Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint at {path}; train one first: python train.py configs/rope_small.py")
    try:
        ckpt = torch.load(path, map_location=device, weights_only=True)
    except Exception as e:  # torch raises many kinds for a truncated or foreign file, with pages of advice: its first clause
        why = (str(e).strip().splitlines() or [""])[0].split(". ")[0][:80]
        raise UserError(f"checkpoint {path} is corrupted or not a ropelab checkpoint ({type(e).__name__}: {why})") from None
    if missing := [k for k in CHECKPOINT_KEYS if not isinstance(ckpt, dict) or k not in ckpt]:
        raise UserError(f"checkpoint {path} is not a ropelab checkpoint: missing {', '.join(missing)}")
    return ckpt


def gpt_config(args):
    """GPTConfig(**args), its checks of the user's model keys as a UserError."""
    try:
        return GPTConfig(**args)
    except ValueError as e:  # GPTConfig and rope.check_scaling validate and raise nothing else
        raise UserError(str(e)) from None


def model_from_checkpoint(ckpt, config=None):
    """The checkpoint's model (config: a GPTConfig to build instead of its own model_args, for a fine-tune)."""
    model = GPT(config or gpt_config(ckpt["model_args"]))
    try:
        model.load_state_dict(ckpt["model"])
    except RuntimeError as e:
        raise UserError(f"checkpoint weights do not match its model config: {str(e).splitlines()[0]}") from None
    return model
