"""Train a small GPT at a short context length (keys, checkpoints, fine-tuning: docs/reference.md,
"Training").

    python train.py configs/rope_small.py [--key=value ...]
    torchrun --standalone --nproc_per_node=8 train.py configs/rope_small.py   # DDP, one node
"""
import gc
import math
import os
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP

from common import UserError, pick_device, run_cli
from config import key_help, load_config, model_config
from data.dataset import get_rows
from model import GPT
from runfolder import data_identity, open_out_dir, save_checkpoint, start_checkpoint, write_log
from runtime import autocast, model_from_checkpoint, peak_flops, throughput, training_data


@dataclass
class Training:  # what the loop's evaluations and checkpoints read (rank 0 evaluates and writes)
    config: dict
    model: GPT  # the raw model (not compiled, not DDP's): what a checkpoint holds
    optimizer: torch.optim.Optimizer
    meta: dict
    splits: dict
    copy_vocab: int | None
    rng: np.random.Generator
    origin: dict | None
    log: list
    out_dir: Path
    ctx: object
    device: str
    wandb: object | None
    master: bool
    ddp: bool


def lr_at(it, c):
    # a schedule no longer than its warmup (a short run) warms up over its first half, so it still decays
    warmup = c["warmup_iters"] if c["warmup_iters"] < c["lr_decay_iters"] else c["lr_decay_iters"] // 2
    if it < warmup:
        return c["learning_rate"] * (it + 1) / (warmup + 1)
    if it > c["lr_decay_iters"]:
        return c["min_lr"]
    ratio = (it - warmup) / max(1, c["lr_decay_iters"] - warmup)
    return c["min_lr"] + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (c["learning_rate"] - c["min_lr"])


def inputs_targets(rows, device):
    return torch.from_numpy(rows[:, :-1]).to(device), torch.from_numpy(rows[:, 1:]).to(device)


@torch.no_grad()
def estimate_loss(model, splits, config, ctx, device, copy_vocab):
    # each split's mean loss; with retrieval_mix also the top-1 accuracy on the retrieval rows' known tokens
    model.eval()
    rng = np.random.default_rng(0)  # the same batches at every evaluation, so the curve is not noise
    B, T = config["batch_size"], config["block_size"]
    losses = {}
    for split, tokens in splits.items():
        batches = (inputs_targets(get_rows(tokens, B, T, rng), device) for _ in range(config["eval_iters"]))
        with ctx:
            losses[split] = sum(model(x, y)[1].item() for x, y in batches) / config["eval_iters"]
    if config["retrieval_mix"]:
        from data.synthetic import retrieval_check
        name, rows, known = retrieval_check(rng, config, 4 * B, T, splits["val"], copy_vocab)
        (x, y), known = inputs_targets(rows, device), torch.from_numpy(known[:, 1:]).to(device)
        with ctx:
            logits, _ = model(x)
        losses[name] = (logits.argmax(-1) == y)[known].float().mean().item()
    model.train()
    return losses


def evaluate_and_save(t, iter_num, lr, best_val_loss, saved):
    # every process calls it, rank 0 evaluates and writes; returns (best_val_loss, the last checkpoint's iter)
    losses = estimate_loss(t.model, t.splits, t.config, t.ctx, t.device, t.copy_vocab) if t.master else {}
    if t.ddp:  # rank 0's losses to every process, so that a non-finite loss stops each with the same line
        both = [losses.get("train", 0.0), losses.get("val", 0.0)]
        shared = torch.tensor(both, dtype=torch.float64, device=t.device)
        torch.distributed.broadcast(shared, 0)
        losses = losses or dict(train=shared[0].item(), val=shared[1].item())
    if not math.isfinite(losses["train"] + losses["val"]):  # NaN weights are no checkpoint
        raise UserError(f"the loss is not finite at iter {iter_num} (train {losses['train']}, "
                        f"val {losses['val']}): training diverged; lower learning_rate "
                        f"(now {t.config['learning_rate']:g}) or raise warmup_iters"
                        + ("" if saved is None else f" (the checkpoint at iter {saved} is kept)"))
    best_val_loss = min(best_val_loss, losses["val"])
    if t.master:
        retrieval = (f", copy top-1 {losses['copy_top1']:.3f}" if "copy_top1" in losses else
                     f", mqar acc {losses['mqar_acc']:.3f}" if "mqar_acc" in losses else "")
        print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}{retrieval}")
        if not t.log or t.log[-1]["iter"] < iter_num:  # a resume's first evaluation is logged already
            t.log.append({"iter": iter_num, **losses})
            write_log(t.out_dir, t.log)
        if t.wandb:
            t.wandb.log({"iter": iter_num, "lr": lr, **{f"{k}/loss" if k in t.splits else f"val/{k}": v
                                                       for k, v in losses.items()}})
    if iter_num == 0 and 0 not in t.config["keep_iters"]:  # the starting point: a checkpoint if kept
        return best_val_loss, saved
    if t.master:  # what the run was trained from (config, data, origin): what a resume and a study compare
        ckpt = {"model": t.model.state_dict(), "optimizer": t.optimizer.state_dict(), "iter_num": iter_num,
                "model_args": asdict(t.model.config), "best_val_loss": best_val_loss, "origin": t.origin,
                "config": t.config, "data": data_identity(t.meta), "log": t.log,
                "rng": {"numpy": t.rng.bit_generator.state, "torch": torch.get_rng_state()}}
        save_checkpoint(t.out_dir, ckpt, keep=iter_num in t.config["keep_iters"])
    return best_val_loss, iter_num


def train_in(out_dir, config, rank, world, device, ddp):
    master = rank == 0
    device_type = device.split(":")[0]
    dtype, ctx = autocast(config["dtype"], device_type)
    torch.manual_seed(config["seed"] + rank)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True

    meta, splits = training_data(config, master, ddp)
    rng = np.random.default_rng(config["seed"] + rank)
    iter_num, best_val_loss, log = 0, float("inf"), []
    ckpt, origin = ((None, None) if config["init_from"] == "scratch"
                    else start_checkpoint(config, meta, device))
    if config["init_from"] == "resume":
        iter_num, best_val_loss, log = ckpt["iter_num"], ckpt["best_val_loss"], ckpt["log"]
        if master:
            rng.bit_generator.state = ckpt["rng"]["numpy"]
            torch.set_rng_state(ckpt["rng"]["torch"].cpu())
            write_log(out_dir, log)  # evaluations after the checkpoint were of weights it does not hold
        else:  # other processes: a fresh stream, not a replay
            rng = np.random.default_rng([config["seed"], rank, iter_num])
        print(f"resuming from {out_dir}/ckpt.pt at iter {iter_num}")
    elif ckpt is not None:
        drope = ckpt["model_args"]["pos_emb"] != config["pos_emb"]
        print(f"fine-tuning from {config['init_from']} (iter {origin['iter_num']}, trained at "
              f"{origin['train_len']}): weights loaded, a fresh optimizer, block_size "
              f"{config['block_size']}, rope_scaling {config['rope_scaling']}"
              + drope * ", pos_emb rope -> none (DroPE: the rotation dropped)")

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
    copy_vocab = None  # the ids the retrieval rows draw from
    if config["retrieval_mix"]:
        from data.synthetic import mix_retrieval, random_vocab
        copy_vocab = random_vocab(config["retrieval_vocab"], meta["vocab_size"])
    tokens_per_iter = gas * world * config["batch_size"] * config["block_size"]
    peak = peak_flops(device_type)
    if master:
        print(f"{raw_model.num_params() / 1e6:.2f}M parameters, pos_emb={config['pos_emb']}, vocab "
              f"{meta['vocab_size']}, {tokens_per_iter:,} tokens/iter, device {device}, {dtype}, "
              f"{world} process(es)")
    wandb_run = None
    if master and config["wandb_log"]:
        from wandb_runs import open_run  # offline when no server answers
        wandb_run = open_run(config, out_dir, new=config["init_from"] != "resume")
    training = Training(config=config, model=raw_model, optimizer=optimizer, meta=meta, splits=splits,
                        copy_vocab=copy_vocab, rng=rng, origin=origin, log=log, out_dir=out_dir, ctx=ctx,
                        device=device, wandb=wandb_run, master=master, ddp=ddp)

    t0, timed_from = time.time(), iter_num
    saved = iter_num if config["init_from"] == "resume" else None  # the checkpoint a resume starts from
    try:
        while True:
            lr = lr_at(iter_num, config)
            for group in optimizer.param_groups:
                group["lr"] = lr
            if (iter_num % config["eval_interval"] == 0
                    or iter_num in (config["max_iters"], *config["keep_iters"])):
                best_val_loss, saved = evaluate_and_save(training, iter_num, lr, best_val_loss, saved)
                t0, timed_from = time.time(), iter_num  # evaluation time is not training throughput
            if iter_num >= config["max_iters"]:
                break
            for micro in range(gas):
                if ddp:  # all-reduce gradients on the last micro step only
                    model.require_backward_grad_sync = micro == gas - 1
                rows = get_rows(splits["train"], config["batch_size"], config["block_size"], rng)
                if config["retrieval_mix"]:
                    mix_retrieval(rows, rng, config, copy_vocab)
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
                if wandb_run:
                    wandb_run.log({"iter": iter_num, "train/step_loss": loss.item() * gas,
                                   "tokens_per_s": tok_s})
    except KeyboardInterrupt:  # for run_cli's one line: where it stopped and how to go on
        raise KeyboardInterrupt(f"at iter {iter_num}; resume with --init_from=resume" + (
            "" if saved is None else f" (from its checkpoint at iter {saved})")) from None
    if wandb_run:
        wandb_run.finish()


def train(config):
    ddp = int(os.environ.get("RANK", -1)) != -1
    rank, world = (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])) if ddp else (0, 1)
    device = pick_device(config["device"])
    if ddp:
        if device.startswith("cuda"):
            device = f"cuda:{int(os.environ['LOCAL_RANK'])}"
            torch.cuda.set_device(device)
        init_process_group(backend="nccl" if device.startswith("cuda") else "gloo")
    with open_out_dir(config) if rank == 0 else nullcontext(Path(config["out_dir"])) as out_dir:
        train_in(out_dir, config, rank, world, device, ddp)
    if ddp:  # the DDP wrapper holds the process group in reference cycles: freed first, or gloo can abort
        gc.collect()  # the process at exit
        destroy_process_group()


def main(argv):
    if {"-h", "--help"} & set(argv):
        print(f"{__doc__.strip()}\n\nkeys (--key=value, or in a config file) and defaults:\n{key_help()}")
        return
    run_cli("train.py", lambda: train(load_config(argv)))


if __name__ == "__main__":
    main(sys.argv[1:])
