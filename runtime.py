"""
What every command needs around the model: device and dtype, wandb, where data lives, atomic writes,
checkpoints, and the wrapper that turns an expected failure into one line on stderr.
Shared by train.py, bench.py and eval/; it holds no training loop and no model code.
"""
import argparse
import netrc
import os
import sys
from contextlib import nullcontext
from pathlib import Path

import torch

from model import GPT, GPTConfig

ROOT = Path(__file__).resolve().parent
PEAK_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12}  # dense bf16, for MFU
CHECKPOINT_KEYS = ("model", "model_args", "iter_num", "config")


# ----------------------------------------------------------------------------- command line

def run_cli(prog, fn, *args):
    """Call fn(*args); an expected failure (a bad value, a missing, unreadable or corrupt file, a failed
    download) becomes `prog: error: <one line>` on stderr and exit status 1, never a traceback."""
    try:
        return fn(*args)
    except (ValueError, OSError) as e:
        sys.exit(f"{prog}: error: {' '.join(str(e).split())}")


def arg_parser(doc):
    """An ArgumentParser whose errors raise ValueError (argparse prints usage and the message on two lines)."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0].strip())

    def fail(message):
        raise ValueError(message)
    p.error = fail
    return p


def parse_list(text, name, convert, allowed=None):
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise ValueError(f"--{name} is empty")
    if allowed:
        bad = [t for t in items if t not in allowed]
        if bad:
            raise ValueError(f"unknown --{name} {', '.join(bad)}; allowed: {', '.join(allowed)}")
    try:
        return list(dict.fromkeys(convert(t) for t in items))  # keep order, drop repeats
    except ValueError:
        raise ValueError(f"--{name} {text!r} is not a comma-separated list of numbers") from None


def number(text, name, convert, minimum):
    try:
        value = convert(text)
    except ValueError:
        raise ValueError(f"--{name} {text!r} is not a{'n integer' if convert is int else ' number'}") from None
    if not value >= minimum:  # also catches nan
        raise ValueError(f"--{name} must be >= {minimum}, got {text}")
    return value


# ----------------------------------------------------------------------------- device

def pick_device(name):
    if name != "auto":
        return name
    if torch.cuda.is_available():
        return "cuda"
    return "mps" if torch.backends.mps.is_available() else "cpu"


def autocast(dtype, device_type):
    """(dtype name, context for the forward pass): mixed precision through autocast, float32 as is."""
    if dtype == "auto":
        dtype = "bfloat16" if device_type == "cuda" and torch.cuda.is_bf16_supported() else "float32"
    return dtype, nullcontext() if dtype == "float32" else torch.autocast(device_type, dtype=getattr(torch, dtype))


def peak_flops(device_type):
    name = torch.cuda.get_device_name() if device_type == "cuda" else ""
    return next((v for k, v in PEAK_FLOPS.items() if k in name), None)


# ----------------------------------------------------------------------------- files and logging

def data_dir(dataset):
    return Path(dataset) if Path(dataset).is_absolute() else ROOT / "data" / dataset


def write_atomic(path, write):
    """write(f) into a temp file beside path, then rename it over path: a crash leaves the old file or
    the new one, never half of one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # same folder: os.replace is then a rename
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def init_wandb(config, job_type, group):
    """A wandb run that never blocks on a login prompt: online when logged in, else offline."""
    import wandb
    mode = os.environ.get("WANDB_MODE")
    if not mode:
        try:
            logged_in = os.environ.get("WANDB_API_KEY") or netrc.netrc().authenticators("api.wandb.ai")
        except (OSError, netrc.NetrcParseError):
            logged_in = False
        mode = "online" if logged_in else "offline"
    return wandb.init(project=config["wandb_project"], name=f"{config['wandb_run_name']}-{job_type}", group=group,
                      job_type=job_type, config=config, mode=mode)


# ----------------------------------------------------------------------------- checkpoints

def save_checkpoint(ckpt, path):
    write_atomic(path, lambda f: torch.save(ckpt, f))


def load_checkpoint(path, device="cpu"):
    """Read a ckpt.pt written by train.py (path: the file or its run folder)."""
    path = Path(path)
    if path.is_dir():
        path = path / "ckpt.pt"
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint at {path}; train one first: python train.py configs/rope_small.py")
    try:
        ckpt = torch.load(path, map_location=device, weights_only=True)
    except Exception as e:  # torch raises many kinds for a truncated or foreign file
        raise ValueError(f"checkpoint {path} is corrupted or not a ropelab checkpoint ({type(e).__name__}: {e})") from None
    missing = [k for k in CHECKPOINT_KEYS if not isinstance(ckpt, dict) or k not in ckpt]
    if missing:
        raise ValueError(f"checkpoint {path} is not a ropelab checkpoint: missing {', '.join(missing)}")
    return ckpt


def model_from_checkpoint(ckpt):
    model = GPT(GPTConfig(**ckpt["model_args"]))
    try:
        model.load_state_dict(ckpt["model"])
    except RuntimeError as e:
        raise ValueError(f"checkpoint weights do not match its model config: {str(e).splitlines()[0]}") from None
    return model
