"""Train a small GPT at a short context length (keys, checkpoints, fine-tuning: docs/reference.md, "Training").

    python train.py configs/rope_small.py [--key=value ...]
    torchrun --standalone --nproc_per_node=8 train.py configs/rope_small.py   # DDP, one node
"""
import importlib
import json
import math
import os
import sys
import time
from contextlib import contextmanager, nullcontext, suppress
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP

from data.dataset import builtin, get_rows, load_meta, load_split
from data.synthetic import copy_rows, mix_copies, mix_mqar, mqar_batch, random_vocab
from model import GPT
from config import DEFAULTS, DROPE_KEYS, FINETUNE_KEYS, MODEL_KEYS, load_config, model_config
from rope import first_negative, scaling_type, trained_freq
from runtime import (UserError, autocast, checkpoint_config, data_dir, json_text, load_checkpoint, model_from_checkpoint,
                     peak_flops, pick_device, run_cli, take_lock, write_atomic)
from wandb_runs import open_run

RESUME_KEYS = ("optimizer", "best_val_loss", "rng")  # what a resume needs beyond the weights

# ----------------------------------------------------------------------------- training

def lr_at(it, c):
    if it < c["warmup_iters"]:
        return c["learning_rate"] * (it + 1) / (c["warmup_iters"] + 1)
    if it > c["lr_decay_iters"]:
        return c["min_lr"]
    ratio = (it - c["warmup_iters"]) / max(1, c["lr_decay_iters"] - c["warmup_iters"])
    return c["min_lr"] + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (c["learning_rate"] - c["min_lr"])


def base_bound_note(cfg, eval_multiple=16):
    """A line if the RoPE base is below Men et al.'s bound (B_m < 0) up to eval_multiple x block_size, else None."""
    L, head_dim = cfg.block_size, cfg.n_embd // cfg.n_head
    if cfg.pos_emb == "rope" and (m := first_negative(trained_freq(head_dim, cfg.rope_base, cfg.rope_fraction), eval_multiple * L)):
        reach = "its own training length" if m <= L else f"evaluation lengths past {m} ({m / L:.2g}x the training length)"
        fraction = f", rope_fraction {cfg.rope_fraction:g}" if cfg.rope_fraction else ""
        return (f"note: rope_base={cfg.rope_base:g} is below the RoPE base bound (Men et al. 2024) for {reach}: B_m < 0 "
                f"from distance {m}, head dim {head_dim}{fraction} (python lab/base_bound.py --head_dim {head_dim})")


def throughput(tokens, seconds, flops_per_token, peak, world):
    """(tokens/s, FLOP/s, MFU) of all processes: tokens counts every process's, so MFU divides by world peaks."""
    tok_s = tokens / seconds
    flops = flops_per_token * tok_s
    return tok_s, flops, flops / (peak * world) if peak else None


def start_checkpoint(config, meta, device):
    """(init_from's checkpoint, origin): out_dir's to resume (matching this run) or a run's to fine-tune (FINETUNE_KEYS
    may differ, and pos_emb from rope to none: DroPE). A scaling that needs the original length and lacks it takes
    the checkpoint's train_len (model.py would take block_size)."""
    tune = config["init_from"] != "resume"
    path = config["init_from"] if tune else Path(config["out_dir"])
    ckpt = load_checkpoint(path, device)
    if not tune and (missing := [k for k in RESUME_KEYS if k not in ckpt]):  # weights only, as tests/assets/copier.pt
        raise UserError(f"{path}/ckpt.pt cannot be resumed: it holds no {', '.join(missing)} (weights only); fine-tune "
                        f"from it instead: --init_from={path}/ckpt.pt --out_dir=<a new folder>")
    args, origin, scaling = ckpt["model_args"], ckpt.get("origin"), config["rope_scaling"]
    train_len = checkpoint_config(ckpt).train_len  # the original training length: the first run's, through fine-tunes
    if tune:
        origin = dict(init_from=config["init_from"], iter_num=ckpt["iter_num"], train_len=train_len,
                      pos_emb=(origin or {}).get("pos_emb") or args["pos_emb"])
    # DroPE (Gelberg et al. 2026): a RoPE run fine-tuned without positions; RoPE has no weights, so they load as they are
    drope = tune and args["pos_emb"] == "rope" and config["pos_emb"] == "none"
    needs_original = scaling_type(scaling) in ("dynamic", "yarn", "llama3", "longrope")
    if origin and needs_original and "original_max_position_embeddings" not in scaling:
        config["rope_scaling"] = {**scaling, "original_max_position_embeddings": train_len}
        print(f"rope_scaling: original_max_position_embeddings={train_len}, the original training length")
    # a key newer than the checkpoint: it was trained as its default (a new key's default is the old behaviour)
    differ = [f"{k}={args.get(k, DEFAULTS[k])!r} (config: {config[k]!r})" for k in MODEL_KEYS
              if not (tune and k in FINETUNE_KEYS or drope and k in DROPE_KEYS) and args.get(k, DEFAULTS[k]) != config[k]]
    if args["vocab_size"] != meta["vocab_size"]:
        differ.append(f"vocab_size={args['vocab_size']} (data/{config['dataset']}: {meta['vocab_size']})")
    if tune and config["pos_emb"] == "learned" and args["block_size"] != config["block_size"]:
        differ.append(f"block_size={args['block_size']} (config: {config['block_size']}; a learned table cannot change size)")
    if differ:
        raise UserError(f"init_from={path}: the checkpoint does not match this run ({'; '.join(differ)}); a fine-tune "
                         f"may change only {', '.join(FINETUNE_KEYS)}, and pos_emb from 'rope' to 'none' (DroPE)" if tune else
                         f"checkpoint {path}/ckpt.pt does not match this run: {'; '.join(differ)}")
    return ckpt, origin


@contextmanager
def run_folder(config):
    """out_dir, made and locked: out_dir/.lock holds the pid, and a lock whose process has died is taken over."""
    out_dir, lock = Path(config["out_dir"]), Path(config["out_dir"]) / ".lock"
    if out_dir.is_file():
        raise UserError(f"out_dir {out_dir} is a file: choose another --out_dir (a folder for ckpt.pt and log.jsonl)")
    out_dir.mkdir(parents=True, exist_ok=True)
    if pid := take_lock(lock):
        raise UserError(f"out_dir {out_dir} is in use by process {pid} ({lock}): one training per out_dir")
    try:
        if config["init_from"] != "resume":
            if config["overwrite"] and Path(config["init_from"]).resolve() in (out_dir.resolve(), (out_dir / "ckpt.pt").resolve()):
                raise UserError(f"init_from={config['init_from']} is out_dir's own checkpoint, which --overwrite=True would "
                                f"delete before loading it: fine-tune into another --out_dir")
            if (out_dir / "ckpt.pt").exists() and not config["overwrite"]:
                raise UserError(f"{out_dir} already holds a run (ckpt.pt): continue it with --init_from=resume, "
                                 f"or replace it with --overwrite=True")
            for name in ("ckpt.pt", "log.jsonl"):  # a new run starts its log anew
                (out_dir / name).unlink(missing_ok=True)
        yield out_dir
    finally:
        lock.unlink(missing_ok=True)
        with suppress(OSError):
            out_dir.rmdir()  # only if empty: a run that failed before writing anything leaves no folder


def trim_log(path, iter_num):
    """Keep the log lines up to a resume's checkpoint iter_num, rewritten atomically, so that none is written twice.
    A line that is not a log entry (a kill -9 mid-write, an edit) is moved to log.jsonl.rejected, never dropped."""
    def entry(line):
        with suppress(ValueError, TypeError, KeyError):  # not JSON, not a dict, no iter
            if isinstance(it := json.loads(line)["iter"], int):
                return it
        return None
    lines = [(line, entry(line)) for line in path.read_text(errors="replace").splitlines()] if path.exists() else []
    if bad := [line for line, it in lines if it is None and line.strip()]:
        with open(path.with_name(path.name + ".rejected"), "a") as f:
            f.write("".join(line + "\n" for line in bad))
        print(f"{path}: {len(bad)} line(s) that are not log entries moved to {path.name}.rejected")
    text = "".join(line + "\n" for line, it in lines if it is not None and it <= iter_num)
    write_atomic(path, lambda f: f.write(text.encode()))


def inputs_targets(rows, device):
    return torch.from_numpy(rows[:, :-1]).to(device), torch.from_numpy(rows[:, 1:]).to(device)


@torch.no_grad()
def estimate_loss(model, splits, config, ctx, device, copy_vocab):
    """Mean loss on fixed batches of each split; with retrieval_mix, copy_top1: top-1 accuracy on repeated segments
    (retrieval_task copy) or mqar_acc: top-1 on the values after MQAR queries (mqar, rows as trained on)."""
    model.eval()
    rng = np.random.default_rng(0)  # the same batches at every evaluation, so the curve is not noise
    B, T = config["batch_size"], config["block_size"]
    losses = {}
    for split, tokens in splits.items():
        batches = (inputs_targets(get_rows(tokens, B, T, rng), device) for _ in range(config["eval_iters"]))
        with ctx:
            losses[split] = sum(model(x, y)[1].item() for x, y in batches) / config["eval_iters"]
    if config["retrieval_mix"] and config["retrieval_task"] == "mqar":
        rows, mask = mqar_batch(rng, 4 * B, T + 1, config["retrieval_segment"] // 2, copy_vocab)
        (x, y), scored = inputs_targets(rows, device), torch.from_numpy(mask[:, 1:]).to(device)
        with ctx:
            logits, _ = model(x)
        losses["mqar_acc"] = (logits.argmax(-1) == y)[scored].float().mean().item()
    elif config["retrieval_mix"]:
        k = config["retrieval_segment"]
        distances = np.linspace(k, T + 1 - k, 4 * B).round()  # spread over every distance inside the window
        x, y = inputs_targets(copy_rows(get_rows(splits["val"], 4 * B, T, rng), rng, k, distances, copy_vocab), device)
        with ctx:
            logits, _ = model(x)
        losses["copy_top1"] = (logits[:, -(k - 1):].argmax(-1) == y[:, -(k - 1):]).float().mean().item()
    model.train()
    return losses


def mix_synthetic(rows, rng, config, vocab):
    """Replace retrieval_mix of a batch's rows by retrieval_task's synthetic rows (in place); their loss is the rows' own."""
    if config["retrieval_mix"] and config["retrieval_task"] == "mqar":
        mix_mqar(rows, rng, config["retrieval_mix"], config["retrieval_segment"] // 2, vocab)
    elif config["retrieval_mix"]:  # copy: the same calls, so the same batches, as before the key existed
        mix_copies(rows, rng, config["retrieval_mix"], config["retrieval_segment"], vocab)


def train(config):
    ddp = int(os.environ.get("RANK", -1)) != -1
    rank, world = (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])) if ddp else (0, 1)
    device = pick_device(config["device"])
    if ddp:
        if device.startswith("cuda"):
            device = f"cuda:{int(os.environ['LOCAL_RANK'])}"
            torch.cuda.set_device(device)
        init_process_group(backend="nccl" if device.startswith("cuda") else "gloo")
    master = rank == 0
    with run_folder(config) if master else nullcontext(Path(config["out_dir"])) as out_dir:
        device_type = device.split(":")[0]
        dtype, ctx = autocast(config["dtype"], device_type)
        torch.manual_seed(config["seed"] + rank)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True

        folder = data_dir(config["dataset"])
        if master and (corpus := builtin(config["dataset"])) and not (folder / "meta.json").exists():  # before the others look
            print(f"no prepared data yet: preparing data/{config['dataset']} (once)")
            importlib.import_module(f"data.{corpus}.prepare").prepare(config["dataset"])
        if ddp:
            torch.distributed.barrier()
        meta = load_meta(folder)  # every file checked against meta.json's sha256s
        splits = {s: load_split(folder, s)[0] for s in ("train", "val")}
        for s, tokens in splits.items():
            if len(tokens) <= config["block_size"]:
                raise UserError(f"block_size={config['block_size']} does not fit in the {s} split of {folder} "
                                 f"({len(tokens)} tokens, a row takes block_size + 1): use block_size <= {len(tokens) - 1}")
        rng = np.random.default_rng(config["seed"] + rank)
        iter_num, best_val_loss, logged = 0, float("inf"), -1
        ckpt, origin = (None, None) if config["init_from"] == "scratch" else start_checkpoint(config, meta, device)
        if config["init_from"] == "resume":
            iter_num = logged = ckpt["iter_num"]  # the log holds this iteration's evaluation already
            best_val_loss = ckpt["best_val_loss"]
            if master:
                rng.bit_generator.state = ckpt["rng"]["numpy"]
                torch.set_rng_state(ckpt["rng"]["torch"].cpu())
                trim_log(out_dir / "log.jsonl", iter_num)
            else:  # other processes: a fresh stream, not a replay of what they drew before
                rng = np.random.default_rng([config["seed"], rank, iter_num])
            print(f"resuming from {out_dir}/ckpt.pt at iter {iter_num}")
        elif ckpt is not None:
            print(f"fine-tuning from {config['init_from']} (iter {origin['iter_num']}, trained at {origin['train_len']}): "
                  f"weights loaded, a fresh optimizer, block_size {config['block_size']}, rope_scaling {config['rope_scaling']}"
                  + (", pos_emb rope -> none (DroPE: the rotation dropped)" if ckpt["model_args"]["pos_emb"] != config["pos_emb"] else ""))

        gptconf = model_config(config, meta["vocab_size"], origin and origin["train_len"])
        model = (GPT(gptconf) if ckpt is None else model_from_checkpoint(ckpt, gptconf)).to(device)
        optimizer = model.configure_optimizers(config["weight_decay"], config["learning_rate"],
                                               (config["beta1"], config["beta2"]), device_type)
        if config["init_from"] == "resume":  # a fine-tune starts a fresh optimizer
            optimizer.load_state_dict(ckpt["optimizer"])
        ckpt = None  # free memory
        scaler = torch.amp.GradScaler(device_type, enabled=dtype == "float16")
        raw_model, model = model, torch.compile(model) if config["compile"] else model
        if ddp:
            model = DDP(model, device_ids=[int(device.split(":")[1])] if device_type == "cuda" else None)

        gas = config["gradient_accumulation_steps"]
        copy_vocab = random_vocab(config["retrieval_vocab"], meta["vocab_size"])  # the ids retrieval rows draw from
        tokens_per_iter = gas * world * config["batch_size"] * config["block_size"]
        peak = peak_flops(device_type)
        if master:
            print(f"{raw_model.num_params() / 1e6:.2f}M parameters, pos_emb={config['pos_emb']}, vocab {meta['vocab_size']}, "
                  f"{tokens_per_iter:,} tokens/iter, device {device}, {dtype}, {world} process(es)")
            if note := base_bound_note(gptconf):
                print(note)
        run = open_run(config, out_dir, new=config["init_from"] != "resume") if master and config["wandb_log"] else None

        t0, timed_from = time.time(), iter_num
        saved = iter_num if config["init_from"] == "resume" else None  # the checkpoint a resume starts from
        try:
            while True:
                lr = lr_at(iter_num, config)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                if iter_num % config["eval_interval"] == 0 or iter_num == config["max_iters"]:
                    if master:
                        losses = estimate_loss(raw_model, splits, config, ctx, device, copy_vocab)
                        if not math.isfinite(losses["train"] + losses["val"]):  # NaN weights are no checkpoint
                            raise UserError(f"the loss is not finite at iter {iter_num} (train {losses['train']}, val {losses['val']}): "
                                            f"training diverged; lower "
                                            f"learning_rate (now {config['learning_rate']:g}) or raise warmup_iters"
                                            + ("" if saved is None else f" (the checkpoint at iter {saved} is kept)"))
                        best_val_loss = min(best_val_loss, losses["val"])
                        copy = (f", copy top-1 {losses['copy_top1']:.3f}" if "copy_top1" in losses else
                                f", mqar acc {losses['mqar_acc']:.3f}" if "mqar_acc" in losses else "")
                        print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}{copy}")
                        if iter_num > logged:  # the eval curve, readable without wandb
                            with open(out_dir / "log.jsonl", "a") as f:
                                f.write(json_text({"iter": iter_num, **losses}) + "\n")
                        if run:
                            run.log({"iter": iter_num, "lr": lr, **{f"{k}/loss" if k in splits else f"val/{k}": v for k, v in losses.items()}})
                        if iter_num > 0:
                            state = {"model": raw_model.state_dict(), "optimizer": optimizer.state_dict(),
                                     "model_args": asdict(gptconf), "iter_num": iter_num, "best_val_loss": best_val_loss,
                                     "origin": origin, "config": config, "data": {k: meta[k] for k in ("tokenizer", "vocab_size")},
                                     "rng": {"numpy": rng.bit_generator.state, "torch": torch.get_rng_state()}}
                            write_atomic(out_dir / "ckpt.pt", lambda f: torch.save(state, f))
                            saved = iter_num
                    t0, timed_from = time.time(), iter_num  # evaluation time is not training throughput
                if iter_num >= config["max_iters"]:
                    break
                for micro in range(gas):
                    if ddp:  # all-reduce gradients on the last micro step only
                        model.require_backward_grad_sync = micro == gas - 1
                    rows = get_rows(splits["train"], config["batch_size"], config["block_size"], rng)
                    mix_synthetic(rows, rng, config, copy_vocab)
                    x, y = inputs_targets(rows, device)
                    with ctx:
                        _, loss = model(x, y)
                        loss = loss / gas
                    scaler.scale(loss).backward()
                if config["grad_clip"]:
                    scaler.unscale_(optimizer)
                    torch.nn.utils.clip_grad_norm_(model.parameters(), config["grad_clip"])
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad(set_to_none=True)
                iter_num += 1
                if iter_num % config["log_interval"] == 0 and master:
                    if device_type == "cuda":
                        torch.cuda.synchronize()
                    tok_s, flops, mfu = throughput(tokens_per_iter * (iter_num - timed_from), time.time() - t0,
                                                   raw_model.flops_per_token(config["block_size"]), peak, world)
                    t0, timed_from = time.time(), iter_num
                    print(f"iter {iter_num}: loss {loss.item() * gas:.4f}, lr {lr:.2e}, {tok_s:,.0f} tok/s, "
                          f"{flops / 1e12:.2f} TFLOP/s" + (f", mfu {100 * mfu:.1f}%" if peak else ""))
                    if run:
                        run.log({"iter": iter_num, "train/step_loss": loss.item() * gas, "tokens_per_s": tok_s})
        except KeyboardInterrupt:  # for run_cli's one line: where it stopped and how to go on
            raise KeyboardInterrupt(f"at iter {iter_num}; resume with --init_from=resume" + ("" if saved is None else
                                    f" (from its checkpoint at iter {saved})")) from None
        if run:
            run.finish()
    if ddp:
        destroy_process_group()


def main(argv):
    run_cli("train.py", lambda: train(load_config(argv)))


if __name__ == "__main__":
    main(sys.argv[1:])
