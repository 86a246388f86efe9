"""What the commands that run the model need around it: dtype and autocast, peak FLOPs, checkpoints and the run
folder a training writes. The torch-free helpers (errors, CLI, locks, atomic writes) are common.py's."""
import importlib
import io
import os
import shutil
from contextlib import contextmanager, nullcontext, suppress
from dataclasses import asdict, fields
from pathlib import Path

import torch

from common import (UserError, claim_output, data_dir, json_text, lock_holder, open_locked, release_outputs,
                    weights_id, write_atomic)
from data.dataset import builtin, check_tokenizer, load_meta, load_split
from config import DEFAULTS, DROPE_KEYS, FINETUNE_KEYS, MIN_BLOCK_SIZE, MODEL_KEYS, gpt_config
from model import GPT, GPTConfig
from rope import ORIGINAL, ROPE_TYPES, scaling_type

PEAK_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12}  # dense bf16, for MFU
CHECKPOINT_KEYS = ("model", "model_args", "iter_num", "config")
RESUME_KEYS = ("optimizer", "best_val_loss", "rng", "log")  # what a resume needs beyond the weights
# how a run runs, not what it learns: the keys a resume or a study's reuse may change
HOW_KEYS = ("out_dir", "init_from", "overwrite", "device", "dtype", "compile", "log_interval", "eval_interval",
            "eval_iters", "keep_iters", "wandb_log", "wandb_project", "wandb_run_name", "wandb_group")
LONGER_KEYS = ("max_iters", "lr_decay_iters")  # how long it trains: a resume may train on further


def autocast(dtype, device_type):
    """(dtype name, context for the forward pass): mixed precision through autocast, float32 as is."""
    if dtype == "auto":
        dtype = "bfloat16" if device_type == "cuda" and torch.cuda.is_bf16_supported() else "float32"
    return dtype, nullcontext() if dtype == "float32" else torch.autocast(device_type, dtype=getattr(torch, dtype))


def peak_flops(device_type):
    name = torch.cuda.get_device_name() if device_type == "cuda" else ""
    return next((v for k, v in PEAK_FLOPS.items() if k in name), None)


def throughput(tokens, seconds, flops_per_token, peak, world):
    """(tokens/s, FLOP/s, MFU) of all processes: tokens counts every process's, so MFU divides by world peaks."""
    tok_s = tokens / seconds
    flops = flops_per_token * tok_s
    return tok_s, flops, flops / (peak * world) if peak else None


def load_checkpoint(path, device="cpu"):
    """Read a ckpt.pt written by train.py or pretrained.py (path: the file or its run folder)."""
    run = Path(path).parent if Path(path).suffix == ".pt" else Path(path)
    path = Path(path) / "ckpt.pt" if Path(path).is_dir() else Path(path)
    if not path.exists() and replaced(run).is_dir():
        raise UserError(f"no checkpoint at {path}: an --overwrite=True was stopped before its first "
                        f"checkpoint, and the run it replaces waits in {replaced(run)}; the next "
                        f"train.py with --out_dir={run} puts it back")
    if not path.exists() and (run / "config.json").is_file():
        raise UserError(f"{run} is a model folder, not a run: convert it once, python pretrained.py {run} "
                        f"--out out/{run.name} --dataset NAME, and read out/{run.name}")
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint at {path}; train one first: python train.py configs/rope_small.py")
    try:
        ckpt = torch.load(path, map_location=device, weights_only=True)
    except Exception as e:  # torch raises many kinds for a truncated or foreign file, with pages of advice: its first clause
        why = (str(e).strip().splitlines() or [""])[0].split(". ")[0][:80]
        raise UserError(f"checkpoint {path} is corrupted or not a ropelab checkpoint ({type(e).__name__}: {why})") from None
    if missing := [k for k in CHECKPOINT_KEYS if not isinstance(ckpt, dict) or k not in ckpt]:
        raise UserError(f"checkpoint {path} is not a ropelab checkpoint: missing {', '.join(missing)}")
    known = {f.name for f in fields(GPTConfig)}
    if not isinstance(ckpt["model_args"], dict) or (unknown := sorted(set(ckpt["model_args"]) - known)):
        what = f"model_args {', '.join(map(str, unknown))}" if isinstance(ckpt["model_args"], dict) else "no model_args dict"
        raise UserError(f"checkpoint {path} is not a ropelab checkpoint: it has {what} (nanoGPT's, say), which ropelab's "
                        "model does not have; train.py writes the checkpoints ropelab reads")
    return ckpt


def checkpoint_config(ckpt):
    """The checkpoint's GPTConfig; one written before train_len was a field takes it from its origin."""
    return gpt_config({"train_len": (ckpt.get("origin") or {}).get("train_len"), **ckpt["model_args"]})


def model_from_checkpoint(ckpt, config=None):
    """The checkpoint's model (config: a GPTConfig to build instead of its own, for a fine-tune)."""
    if "pretrained" in ckpt:  # no random init of weights about to be replaced (billions of draws at 7B)
        with torch.device("meta"):
            model = GPT(checkpoint_config(ckpt))
        weights = ckpt["model"]  # in float32 as a trained run's, each file tensor let go as its copy replaces it
        for name in weights:
            weights[name] = weights[name].float()
        model.load_state_dict(weights, assign=True)
        if model.config.tie_embeddings:  # assign gave the embedding and the head a Parameter each: one again
            model.transformer.wte.weight = model.lm_head.weight
        return model
    model = GPT(config or checkpoint_config(ckpt))
    try:
        model.load_state_dict(ckpt["model"])
    except RuntimeError as e:
        raise UserError(f"checkpoint weights do not match its model config: {str(e).splitlines()[0]}") from None
    return model



def load_run(run_dir, device="cpu"):
    """(model in eval mode on device, checkpoint, dataset dir); a bad checkpoint or data: a one-line error."""
    ckpt = load_checkpoint(run_dir, device)
    if "pretrained" in ckpt:
        return pretrained_run(run_dir, ckpt, device)
    folder = data_dir(ckpt["config"]["dataset"])
    meta = load_meta(folder)  # FileNotFoundError with the prepare command if the data is gone
    if meta["vocab_size"] != ckpt["model_args"]["vocab_size"]:
        # the tokens would index a different vocabulary: the losses would be meaningless, not wrong-looking
        raise UserError(f"data {folder} has vocab_size {meta['vocab_size']} but checkpoint {run_dir} was "
                         f"trained with vocab_size {ckpt['model_args']['vocab_size']}; re-prepare the data to match")
    return model_from_checkpoint(ckpt).to(device).eval(), ckpt, folder


def pretrained_run(run_dir, ckpt, device):
    """load_run for a converted pretrained model: its held-out text must be tokenized by its own tokenizer."""
    record = ckpt["pretrained"]
    prepare = (f"python data/text/prepare.py SOURCE --name NAME --tokenizer {record['folder']}, then "
               f"python pretrained.py {record['folder']} --out NEW_RUN --dataset NAME")
    if ckpt["config"]["dataset"] is None:
        raise UserError(f"{run_dir} was converted with no held-out text: {prepare}")
    folder = data_dir(ckpt["config"]["dataset"])
    check_tokenizer(folder, record["tokenizer"], f"data {folder}", run_dir, prepare)
    return model_from_checkpoint(ckpt).to(device).eval(), ckpt, folder

# ----------------------------------------------------------------------------- a training's run folder

def training_data(config, master, ddp):
    """(meta, {split: tokens}) of the run's dataset, a built-in corpus prepared on first use (by the master process,
    before the others look); every file checked against meta.json's sha256s, and a row of block_size + 1 fitting."""
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
                            f"({len(tokens)} tokens, a row takes block_size + 1): " + (f"use block_size <= {len(tokens) - 1}"
                            if len(tokens) > MIN_BLOCK_SIZE else f"too few for any model; prepare more {s} text "
                            "(more documents, or a val_fraction nearer 0.5)"))
    return meta, splits


def data_identity(meta):
    """What a run was trained on, from its data's meta.json: tokenizer, vocabulary, source and the splits' sha256."""
    return dict(tokenizer=meta["tokenizer"], vocab_size=meta["vocab_size"], source=meta.get("source"),
                sha256={name: meta["files"][name]["sha256"] for name in ("train.bin", "val.bin")})


def provenance_changes(ckpt, config, meta, free=HOW_KEYS):
    """What differs between what a checkpoint was trained from and config on meta's data (None: not compared), as
    'key=recorded (now ...)' each: every config key but free, the data's contents (not only its folder's name) and the
    init source. A key newer than the checkpoint was trained as its default; the training length a fine-tune's
    rope_scaling took from its origin (start_checkpoint) counts as given."""
    recorded, changes = ckpt["config"], []
    sha = (ckpt.get("data") or {}).get("sha256")  # older checkpoints: the dataset by its name only
    for key in (k for k in DEFAULTS if k not in free and not (k == "dataset" and sha and meta)):
        was, now = recorded.get(key, DEFAULTS[key]), config[key]
        if key == "rope_scaling" and isinstance(was, dict) and isinstance(now, dict) and ORIGINAL not in now:
            was = {k: v for k, v in was.items() if k != ORIGINAL}
        if was != now:
            changes.append(f"{key}={was!r} (now {now!r})")
    if sha and meta and (now := data_identity(meta)["sha256"]) != sha:
        changes.append(f"dataset={recorded['dataset']!r} (now {config['dataset']!r}, other text)")
    init = (ckpt.get("origin") or {}).get("init_from", "scratch")
    if config["init_from"] != "resume" and str(init) != str(config["init_from"]):
        changes.append(f"init_from={init!r} (now {config['init_from']!r})")
    return changes


def start_checkpoint(config, meta, device):
    """(init_from's checkpoint, origin): out_dir's to resume (matching this run) or a run's to fine-tune (FINETUNE_KEYS
    may differ, and pos_emb from rope to none: DroPE). A scaling that needs the original length and lacks it takes
    the checkpoint's train_len (model.py would take block_size)."""
    tune = config["init_from"] != "resume"
    path = config["init_from"] if tune else Path(config["out_dir"])
    ckpt = load_checkpoint(path, device)
    if not tune and (missing := [k for k in RESUME_KEYS if k not in ckpt]):  # weights only, as tests/assets/copier.pt
        raise UserError(f"{path}/ckpt.pt cannot be resumed: it holds no {', '.join(missing)} (weights only, "
                        f"or an older train.py's); fine-tune from it instead: --init_from={path}/ckpt.pt "
                        "--out_dir=<a new folder>")
    if not tune and config["max_iters"] < (done := ckpt["iter_num"]):
        raise UserError(f"max_iters={config['max_iters']} is below the iteration of {path}/ckpt.pt ({done}): "
                        f"a resume trains on from there; give --max_iters={done} or more")
    args, origin, scaling = ckpt["model_args"], ckpt.get("origin"), config["rope_scaling"]
    train_len = checkpoint_config(ckpt).train_len  # the original training length: the first run's, through fine-tunes
    if tune:
        origin = dict(init_from=config["init_from"], iter_num=ckpt["iter_num"], train_len=train_len,
                      pos_emb=(origin or {}).get("pos_emb") or args["pos_emb"], weights_id=weights_id(path))
    # DroPE (Gelberg et al. 2026): a RoPE run fine-tuned without positions; RoPE has no weights, so they load as they are
    drope = tune and args["pos_emb"] == "rope" and config["pos_emb"] == "none"
    if origin and scaling and ORIGINAL in ROPE_TYPES[scaling_type(scaling)].required and ORIGINAL not in scaling:
        config["rope_scaling"] = {**scaling, ORIGINAL: train_len}
        print(f"rope_scaling: {ORIGINAL}={train_len}, the original training length")
    # a key newer than the checkpoint: it was trained as its default (a new key's default is the old behaviour)
    differ = [f"{k}={args.get(k, DEFAULTS[k])!r} (config: {config[k]!r})" for k in MODEL_KEYS
              if not (tune and k in FINETUNE_KEYS or drope and k in DROPE_KEYS) and args.get(k, DEFAULTS[k]) != config[k]]
    if args["vocab_size"] != meta["vocab_size"]:
        differ.append(f"vocab_size={args['vocab_size']} (data/{config['dataset']}: {meta['vocab_size']})")
    if tune and config["pos_emb"] == "learned" and args["block_size"] != config["block_size"]:
        differ.append(f"block_size={args['block_size']} (config: {config['block_size']}; a learned table cannot change size)")
    if not tune and not differ and (changed := provenance_changes(ckpt, config, meta, HOW_KEYS + LONGER_KEYS + MODEL_KEYS)):
        raise UserError(f"checkpoint {path}/ckpt.pt was trained otherwise: {'; '.join(changed)}; a resume may change only "
                        f"{' and '.join(LONGER_KEYS)} and how it runs (device, logging, ...); to train on otherwise, "
                        f"fine-tune from it into a new --out_dir")
    if differ:
        raise UserError(f"init_from={path}: the checkpoint does not match this run ({'; '.join(differ)}); a fine-tune "
                         f"may change only {', '.join(FINETUNE_KEYS)}, and pos_emb from 'rope' to 'none' (DroPE)" if tune else
                         f"checkpoint {path}/ckpt.pt does not match this run: {'; '.join(differ)}")
    return ckpt, origin


KEPT = "iter_"  # out_dir/iter_<n>/: a checkpoint keep_iters kept, a run folder of its own


def replaced(out_dir):
    """Where --overwrite=True moves the run in out_dir, whole, until the new run's first checkpoint."""
    home = Path(out_dir).resolve()
    return home.with_name(f".{home.name}.replaced")


def settle_replaced(out_dir):
    """Finish an --overwrite=True from the two whole folders (each step is one rename or one removal, so a
    kill leaves one of these states). The new run has its first checkpoint: the old run goes. Else (the new
    run failed, was refused or was killed) the new folder goes and the old one is renamed back."""
    old = replaced(out_dir)
    if not old.exists():
        return
    if (out_dir / "ckpt.pt").exists():  # written atomically: there means complete
        shutil.rmtree(old)
        return
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.rename(old, out_dir)


def kept_folders(out_dir):
    return sorted(p for p in out_dir.glob(KEPT + "*") if p.name[len(KEPT):].isdecimal() and p.is_dir())


@contextmanager
def held_children(out_dir):
    """The locks of out_dir's kept checkpoints, held while out_dir is moved aside. A kept checkpoint trained
    on (resumed in place, or training now) is a run of its own: refused in one line, never moved."""
    held = []
    try:
        for kept in kept_folders(out_dir):
            lock = kept.with_name(f".{kept.name}.lock")
            if (f := open_locked(lock)) is None:
                raise UserError(f"{kept} is in use by {lock_holder(lock)}: --overwrite=True would remove it "
                                f"with {out_dir}; wait for it to end")
            held.append((lock.name, f))
            at = int(kept.name[len(KEPT):])
            if (kept / "ckpt.pt").is_file() and (it := load_checkpoint(kept)["iter_num"]) != at:
                raise UserError(f"{kept} was trained on to iter {it} (a run of its own now): "
                                f"--overwrite=True would remove it with {out_dir}; move it out first")
        yield
    finally:
        folder = replaced(out_dir) if replaced(out_dir).exists() else out_dir  # the lock files moved with it
        for name, f in held:
            with suppress(OSError):
                (folder / name).unlink()
            f.close()


def replace_run(out_dir, config):
    """Move the run in out_dir aside whole, one rename, for a new run (--overwrite=True)."""
    source = config["init_from"]
    if source != "resume" and Path(source).resolve().is_relative_to(out_dir.resolve()):
        raise UserError(f"init_from={source} is out_dir's own checkpoint, which --overwrite=True would "
                        f"replace: fine-tune into another --out_dir")
    if others := sorted(p.name for p in out_dir.iterdir() if p.is_dir() and p not in kept_folders(out_dir)):
        raise UserError(f"{out_dir} holds folders besides its run's ({', '.join(others)}): --overwrite=True "
                        f"replaces the folder whole; give the new run a folder of its own")
    with held_children(out_dir):
        os.rename(out_dir, replaced(out_dir))
    out_dir.mkdir()


def claim_run_folder(out_dir, name, in_use, option):
    """Make out_dir and hold its lock .<dir name>.lock beside it, the one lock of a run folder whatever writes
    it (train.py, pretrained.py): the operating system's, gone with its process."""
    home = Path(out_dir).resolve()
    claim_output(out_dir, name, lock=home.with_name(f".{home.name}.lock"), option=option, in_use=in_use)


def run_files(out_dir):
    """The files of a run that out_dir holds (ckpt.pt, log.jsonl)."""
    return [n for n in ("ckpt.pt", "log.jsonl") if (Path(out_dir) / n).exists()]


@contextmanager
def run_folder(config):
    """out_dir, made and locked for one training: the lock .<name>.lock beside it, the operating system's (it
    goes with its process). A new run into a folder holding one needs --overwrite=True, and replaces it only
    once its first checkpoint is written: until then the old run waits whole in .<name>.replaced, and comes
    back if the new one ends sooner."""
    out_dir = Path(config["out_dir"])
    if out_dir.is_file():
        raise UserError(f"out_dir {out_dir} is a file: choose another --out_dir (a folder for ckpt.pt and log.jsonl)")
    claim_run_folder(out_dir, "train", "one training per out_dir", "--out_dir")
    try:
        settle_replaced(out_dir)  # an earlier replacement stopped half way
        held = run_files(out_dir) + [p.name for p in kept_folders(out_dir)]
        if config["init_from"] != "resume" and held:
            if not config["overwrite"]:
                raise UserError(f"{out_dir} already holds a run ({', '.join(held)}): " + ("continue it with "
                                "--init_from=resume, or " if "ckpt.pt" in held else "") + "replace it with --overwrite=True")
            replace_run(out_dir, config)
        if files := [f"{KEPT}{n}" for n in config["keep_iters"] if (out_dir / f"{KEPT}{n}").is_file()]:
            raise UserError(f"{out_dir / files[0]} is a file, where keep_iters keeps a checkpoint: move it, "
                            f"or keep other iterations")
        yield out_dir
    finally:
        try:
            settle_replaced(out_dir)
        finally:
            release_outputs(out_dir)
            with suppress(OSError):
                out_dir.rmdir()  # only if empty: a run that failed before writing anything leaves no folder


def save_checkpoint(run, iter_num, best_val_loss):
    """The training's state at iter_num into out_dir/ckpt.pt, atomically: the earlier checkpoint stays if this
    one fails (a full disk is one line); then the run it replaces is removed. With it goes what the run was
    trained from (its config after the overrides, its data's identity, its origin: what a resume and a study's
    reuse compare against) and its log. At one of keep_iters it is also kept (keep_checkpoint)."""
    state = {"model": run["model"].state_dict(), "optimizer": run["optimizer"].state_dict(), "iter_num": iter_num,
             "model_args": asdict(run["model"].config), "best_val_loss": best_val_loss, "origin": run["origin"],
             "config": run["config"], "data": data_identity(run["meta"]), "log": run["log"],
             "rng": {"numpy": run["rng"].bit_generator.state, "torch": torch.get_rng_state()}}
    path = run["out_dir"] / "ckpt.pt"
    buffer = io.BytesIO()  # first: torch reports a failed write (a full disk) as a RuntimeError of its own
    torch.save(state, buffer)
    try:
        write_atomic(path, lambda f: f.write(buffer.getbuffer()))
    except OSError as e:
        raise OSError(f"cannot write {path} at iter {iter_num} ({e.strerror or e}): the checkpoint there is kept as "
                      f"it was; free some space and resume with --init_from=resume") from None
    settle_replaced(run["out_dir"])
    if iter_num in run["config"]["keep_iters"]:
        keep_checkpoint(run["out_dir"], iter_num, run["log"])


def write_log(folder, log):
    """folder/log.jsonl, one line per evaluation, written whole: a kill leaves the old file or the new one."""
    write_atomic(folder / "log.jsonl", lambda f: f.write("".join(json_text(e) + "\n" for e in log).encode()))


def keep_checkpoint(out_dir, iter_num, log):
    """out_dir's checkpoint and log at iter_num as out_dir/iter_<n>/, a run folder of its own (evaluate it,
    resume it in place), built under a temporary name and renamed whole. Never written again once there: a
    resume of out_dir passing iter_num again leaves it as it is (a run may have trained on in it)."""
    folder = out_dir / f"{KEPT}{iter_num}"
    if folder.exists():
        print(f"{folder} is kept already: a kept checkpoint is never written again")
        return
    tmp = out_dir / f".{folder.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)  # a killed run's half-built one
    tmp.mkdir()
    shutil.copyfile(out_dir / "ckpt.pt", tmp / "ckpt.pt")
    write_log(tmp, log)
    os.rename(tmp, folder)
