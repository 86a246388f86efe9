"""Around the model: autocast, peak FLOPs, a run's model and data, a training's data."""
import importlib
from contextlib import nullcontext

import torch

from common import UserError, data_dir
from data.dataset import builtin, check_tokenizer, load_meta, load_split
from config import MIN_BLOCK_SIZE
from model import GPT
from runfolder import checkpoint_config, read_checkpoint

PEAK_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12}  # dense bf16, for MFU


def autocast(dtype, device_type):  # (dtype name, the forward's context)
    if dtype == "auto":
        dtype = "bfloat16" if device_type == "cuda" and torch.cuda.is_bf16_supported() else "float32"
    return dtype, (nullcontext() if dtype == "float32"
                   else torch.autocast(device_type, dtype=getattr(torch, dtype)))


def peak_flops(device_type):
    name = torch.cuda.get_device_name() if device_type == "cuda" else ""
    return next((v for k, v in PEAK_FLOPS.items() if k in name), None)


def throughput(tokens, seconds, flops_per_token, peak, world):  # of all the world's processes
    tok_s = tokens / seconds
    flops = flops_per_token * tok_s
    return tok_s, flops, flops / (peak * world) if peak else None


def model_from_checkpoint(ckpt, config=None):
    """The checkpoint's model (config: a fine-tune's GPTConfig, instead of its own)."""
    if "pretrained" in ckpt:  # a converted model (pretrained.py)
        from pretrained import converted_model
        return converted_model(ckpt)
    model = GPT(config or checkpoint_config(ckpt))
    try:
        model.load_state_dict(ckpt["model"])
    except RuntimeError as e:
        why = str(e).splitlines()[0]
        raise UserError(f"checkpoint weights do not match its model config: {why}") from None
    return model


def load_run(run_dir, device="cpu"):
    """(model in eval mode on device, checkpoint, dataset dir, weights_id of the bytes loaded), checked."""
    ckpt, weights = read_checkpoint(run_dir, device)
    if record := ckpt.get("pretrained"):  # a converted model: its text tokenized by its own tokenizer
        from pretrained import converted_text
        fix, tokenizer = converted_text(ckpt, run_dir)
    else:
        fix = "read it on text prepared as its training text was (the same --vocab_size or --tokenizer)"
        tokenizer = (ckpt.get("data") or {}).get("tokenizer")  # older checkpoints: the vocabulary only
    folder = data_dir(ckpt["config"]["dataset"])
    # another vocabulary: the losses would be meaningless, not wrong-looking
    if not record and (meta := load_meta(folder))["vocab_size"] != ckpt["model_args"]["vocab_size"]:
        raise UserError(f"data {folder} has vocab_size {meta['vocab_size']} but checkpoint {run_dir} was "
                        f"trained with vocab_size {ckpt['model_args']['vocab_size']}; "
                        "re-prepare the data to match")
    if tokenizer:
        check_tokenizer(folder, tokenizer, f"data {folder}", run_dir, fix)
    return model_from_checkpoint(ckpt).to(device).eval(), ckpt, folder, weights


def training_data(config, master, ddp):
    """(meta, {split: tokens}), checked; a built-in corpus prepared on first use, by the master process."""
    folder = data_dir(config["dataset"])
    if master and (corpus := builtin(config["dataset"])) and not (folder / "meta.json").exists():
        print(f"no prepared data yet: preparing data/{config['dataset']} (once)")
        importlib.import_module(f"data.{corpus}.prepare").prepare(config["dataset"])
    if ddp:
        torch.distributed.barrier()
    meta = load_meta(folder)
    splits = {s: load_split(folder, s)[0] for s in ("train", "val")}
    for s, tokens in splits.items():
        if len(tokens) <= config["block_size"]:
            raise UserError(f"block_size={config['block_size']} does not fit in the {s} split of {folder} "
                            f"({len(tokens)} tokens, a row takes block_size + 1): "
                            + (f"use block_size <= {len(tokens) - 1}" if len(tokens) > MIN_BLOCK_SIZE else
                               f"too few for any model; prepare more {s} text (more documents, or a "
                               "val_fraction nearer 0.5)"))
    return meta, splits
