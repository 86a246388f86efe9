"""The run folder a training or a conversion writes (docs/reference.md, "Training"): one writer at a time,
checkpoints written whole and read once (hashed and loaded from one open file), --overwrite=True, kept
checkpoints, resume and fine-tune provenance. train.py calls it to open out_dir, to save a checkpoint, and at
the end of open_out_dir's block."""
import io
import json
import os
import shutil
from contextlib import contextmanager, suppress
from dataclasses import fields
from pathlib import Path

import torch

from common import UserError, claim_output, digest_id, json_text, release_outputs, write_atomic
from config import DEFAULTS, DROPE_KEYS, FINETUNE_KEYS, MODEL_KEYS, gpt_config
from model import GPTConfig
from rope import ORIGINAL, ROPE_TYPES, scaling_type

CHECKPOINT_KEYS = ("model", "model_args", "iter_num", "config")
RESUME_KEYS = ("optimizer", "best_val_loss", "rng", "log")  # what a resume needs beyond the weights
# how a run runs, not what it learns: the keys a resume or a study's reuse may change
RUNNING_KEYS = ("out_dir", "init_from", "overwrite", "device", "dtype", "compile", "log_interval",
                "eval_interval", "eval_iters", "keep_iters", "wandb_log", "wandb_project", "wandb_run_name",
                "wandb_group")
LONGER_KEYS = ("max_iters", "lr_decay_iters")  # how long it trains: a resume may train on further
KEPT_PREFIX = "iter_"  # out_dir/iter_<n>/: a checkpoint keep_iters kept, a run folder of its own


# ----------------------------------------------------------------------------- reading a checkpoint

def read_checkpoint(path, device="cpu"):
    """(checkpoint, weights_id) of a ckpt.pt written by train.py or pretrained.py (path: the file or its run
    folder), hashed and loaded from one open file: a checkpoint written meanwhile is renamed over the path,
    and this file keeps the bytes it had, so the id names the weights loaded."""
    path = checkpoint_file(path)
    with open(path, "rb") as f:
        weights = digest_id(f)
        f.seek(0)
        return checked_load(f, path, device), weights


def load_checkpoint(path, device="cpu"):
    """read_checkpoint's checkpoint alone, not hashed: for what it records, not for a result."""
    path = checkpoint_file(path)
    return checked_load(path, path, device)


def checkpoint_file(path):
    """The ckpt.pt of path (the file or its run folder); where there is none, a one-line error saying why."""
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
        raise FileNotFoundError(f"no checkpoint at {path}; "
                                "train one first: python train.py configs/rope_small.py")
    return path


def checked_load(source, path, device, mmap=False):
    """torch.load of a checkpoint (source: path or its open file; mmap: the tensors left on disk until read),
    checked to be one of ropelab's."""
    try:
        ckpt = torch.load(source, map_location=device, weights_only=True, mmap=mmap)
    # torch raises many kinds for a truncated or foreign file, with pages of advice: its first clause
    except Exception as e:
        why = (str(e).strip().splitlines() or [""])[0].split(". ")[0][:80]
        raise UserError(f"checkpoint {path} is corrupted or not a ropelab checkpoint "
                        f"({type(e).__name__}: {why})") from None
    if missing := [k for k in CHECKPOINT_KEYS if not isinstance(ckpt, dict) or k not in ckpt]:
        raise UserError(f"checkpoint {path} is not a ropelab checkpoint: missing {', '.join(missing)}")
    known = {f.name for f in fields(GPTConfig)}
    if not isinstance(ckpt["model_args"], dict) or (unknown := sorted(set(ckpt["model_args"]) - known)):
        what = (f"model_args {', '.join(map(str, unknown))}" if isinstance(ckpt["model_args"], dict)
                else "no model_args dict")
        raise UserError(f"checkpoint {path} is not a ropelab checkpoint: it has {what} (nanoGPT's, say), "
                        "which ropelab's "
                        "model does not have; train.py writes the checkpoints ropelab reads")
    return ckpt


def peek_checkpoint(folder):
    """folder's checkpoint with its tensors left on disk (mmap): what it records, read cheaply."""
    path = checkpoint_file(folder)
    return checked_load(path, path, "cpu", mmap=True)


def checkpoint_config(ckpt):
    """The checkpoint's GPTConfig; one written before train_len was a field takes it from its origin."""
    return gpt_config({"train_len": (ckpt.get("origin") or {}).get("train_len"), **ckpt["model_args"]})


# ----------------------------------------------------------------------------- one writer, whole folders

def replaced(out_dir):
    """Where --overwrite=True moves the run in out_dir, whole, until the new run's first checkpoint."""
    home = Path(out_dir).resolve()
    return home.with_name(f".{home.name}.replaced")


def lock_of(folder):
    home = Path(folder).resolve()
    return home.with_name(f".{home.name}.lock")


def run_files(out_dir):
    """The files of a run that out_dir holds (ckpt.pt, log.jsonl)."""
    return [n for n in ("ckpt.pt", "log.jsonl") if (Path(out_dir) / n).exists()]


def kept_folders(out_dir):
    return sorted(p for p in Path(out_dir).glob(KEPT_PREFIX + "*")
                  if p.name[len(KEPT_PREFIX):].isdecimal() and p.is_dir())


def claim_run(out_dir, writer, in_use, option):
    """Make out_dir and hold its lock until the command ends, the one lock of a run folder whatever writes it
    (train.py, pretrained.py); then settle a run that an interrupted --overwrite=True left waiting, so that
    the command's own checks see the run that is there."""
    claim_output(out_dir, writer, lock=lock_of(out_dir), option=option, in_use=in_use)
    settle_replaced(Path(out_dir))


def settle_replaced(out_dir, finish=False):
    """Settle an --overwrite=True from the two whole folders (each step is one rename or one removal, so a
    kill leaves one of these states). The new run has no checkpoint (it failed, was refused or was killed):
    the new folder goes and the old one is renamed back. It has its first: the old run goes, but only when
    finish (a command past its own refusals writes there), never in a command that is then refused. A ckpt.pt
    that is not the new run's (put there by hand) decides nothing: both are kept, and the command (its claim)
    refused."""
    old = replaced(out_dir)
    if not old.exists():
        return
    if (out_dir / "ckpt.pt").exists():  # written atomically: there means complete
        if finish:  # checked by this command's claim already
            shutil.rmtree(old)
        elif not overwrote(out_dir):
            raise UserError(f"{out_dir}/ckpt.pt is not the first checkpoint of the --overwrite=True that "
                            f"moved the run there into {old}, which waits to come back: "
                            "move one of the two elsewhere")
        return
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.rename(old, out_dir)


def overwrote(out_dir):
    """Whether out_dir/ckpt.pt is a training's with --overwrite=True: the run that replaces a waiting one."""
    with suppress(UserError):
        ckpt = peek_checkpoint(out_dir)
        return "pretrained" not in ckpt and ckpt["config"].get("overwrite") is True
    return False


def trained_on(kept):
    """The last iteration in a kept checkpoint's log: past its own, it was resumed in place (a run of its
    own)."""
    # no log, or not one of train.py's
    with suppress(OSError, ValueError, KeyError, TypeError, IndexError):
        return json.loads((kept / "log.jsonl").read_text().splitlines()[-1])["iter"]
    return int(kept.name[len(KEPT_PREFIX):])


def replace_run(out_dir, config):
    """Move the run in out_dir aside whole, one rename, for a new run (--overwrite=True). Its kept
    checkpoints' locks are held meanwhile: one trained on (now, or before) is a run of its own, refused, never
    moved."""
    source = config["init_from"]
    if source != "resume" and Path(source).resolve().is_relative_to(out_dir.resolve()):
        raise UserError(f"init_from={source} is out_dir's own checkpoint, which --overwrite=True would "
                        f"replace: fine-tune into another --out_dir")
    if others := sorted(p.name for p in out_dir.iterdir()
                        if p.is_dir() and p not in kept_folders(out_dir)):
        raise UserError(f"{out_dir} holds folders besides its run's ({', '.join(others)}): --overwrite=True "
                        f"replaces the folder whole; give the new run a folder of its own")
    kept_runs = kept_folders(out_dir)
    try:
        for kept in kept_runs:
            claim_output(kept, "train", lock=lock_of(kept), option="--out_dir",
                         in_use=f"--overwrite=True would remove it with {out_dir}; wait for it to end")
            if (it := trained_on(kept)) > int(kept.name[len(KEPT_PREFIX):]):
                raise UserError(f"{kept} was trained on to iter {it} (a run of its own now): "
                                f"--overwrite=True would remove it with {out_dir}; move it out first")
        # a run an earlier overwrite replaced already, for this one's place
        settle_replaced(out_dir, finish=True)
        os.rename(out_dir, replaced(out_dir))
    finally:
        for kept in kept_runs:
            release_outputs(kept)
    out_dir.mkdir()


@contextmanager
def open_out_dir(config):
    """out_dir, made and held for one training (claim_run). A new run into a folder holding one needs
    --overwrite=True, and replaces it only once its first checkpoint is written: until then the old run waits
    whole in .<name>.replaced, and comes back if the new one ends sooner."""
    out_dir = Path(config["out_dir"])
    if out_dir.is_file():
        raise UserError(f"out_dir {out_dir} is a file: "
                        "choose another --out_dir (a folder for ckpt.pt and log.jsonl)")
    claim_run(out_dir, "train", "one training per out_dir", "--out_dir")
    try:
        existing = run_files(out_dir) + [p.name for p in kept_folders(out_dir)]
        if config["init_from"] != "resume" and existing:
            if not config["overwrite"]:
                raise UserError(f"{out_dir} already holds a run ({', '.join(existing)}): "
                                f"{go_on(out_dir)}replace it with --overwrite=True")
            replace_run(out_dir, config)
        if files := [f"{KEPT_PREFIX}{n}" for n in config["keep_iters"]
                     if (out_dir / f"{KEPT_PREFIX}{n}").is_file()]:
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


def go_on(out_dir):
    """How to go on from the checkpoint in out_dir, as advice: resume a training's, fine-tune from
    another's."""
    if not (out_dir / "ckpt.pt").exists():
        return ""
    with suppress(UserError):
        if all(k in peek_checkpoint(out_dir) for k in RESUME_KEYS):
            return "continue it with --init_from=resume, or "
    return f"fine-tune from it into another folder (--init_from={out_dir} --out_dir=NEW), or "


# ----------------------------------------------------------------------------- writing

def save_checkpoint(out_dir, state, keep=False):
    """state (a training's: iter_num, log, ...) into out_dir/ckpt.pt, atomically: the earlier checkpoint stays
    if this one fails (a full disk is one line); then the run it replaces goes. keep: also kept as
    out_dir/iter_<n>/."""
    path, iter_num = out_dir / "ckpt.pt", state["iter_num"]
    buffer = io.BytesIO()  # first: torch reports a failed write (a full disk) as a RuntimeError of its own
    torch.save(state, buffer)
    try:
        write_atomic(path, lambda f: f.write(buffer.getbuffer()))
    except OSError as e:
        raise OSError(f"cannot write {path} at iter {iter_num} ({e.strerror or e}): "
                      "the checkpoint there is kept as "
                      f"it was; free some space and resume with --init_from=resume") from None
    settle_replaced(out_dir, finish=True)
    if keep:
        keep_checkpoint(out_dir, iter_num, state["log"])


def write_log(folder, log):
    """folder/log.jsonl, one line per evaluation, written whole: a kill leaves the old file or the new one."""
    write_atomic(folder / "log.jsonl", lambda f: f.write("".join(json_text(e) + "\n" for e in log).encode()))


def keep_checkpoint(out_dir, iter_num, log):
    """out_dir's checkpoint and log at iter_num as out_dir/iter_<n>/, a run folder of its own (evaluate it,
    resume it in place), built under a temporary name and renamed whole. Never written again once there: a
    resume of out_dir passing iter_num again leaves it as it is (a run may have trained on in it)."""
    folder = out_dir / f"{KEPT_PREFIX}{iter_num}"
    if folder.exists():
        print(f"{folder} is kept already: a kept checkpoint is never written again")
        return
    tmp = out_dir / f".{folder.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)  # a killed run's half-built one
    tmp.mkdir()
    shutil.copyfile(out_dir / "ckpt.pt", tmp / "ckpt.pt")
    write_log(tmp, log)
    os.rename(tmp, folder)


# ----------------------------------------------------------------------------- resume and fine-tune

def data_identity(meta):
    """What a run was trained on, from its data's meta.json: tokenizer, vocabulary, source and the splits'
    sha256."""
    return dict(tokenizer=meta["tokenizer"], vocab_size=meta["vocab_size"], source=meta.get("source"),
                sha256={name: meta["files"][name]["sha256"] for name in ("train.bin", "val.bin")})


def provenance_changes(ckpt, config, meta, ignored=RUNNING_KEYS):
    """What differs between what a checkpoint was trained from and config on meta's data (None: not compared),
    as 'key=recorded (now ...)' each: every config key but ignored, the data's contents (not only its folder's
    name) and the init source. A key newer than the checkpoint was trained as its default; the training length
    a fine-tune's rope_scaling took from its origin (start_checkpoint) counts as given."""
    recorded, changes = ckpt["config"], []
    sha = (ckpt.get("data") or {}).get("sha256")  # older checkpoints: the dataset by its name only
    for key in (k for k in DEFAULTS if k not in ignored and not (k == "dataset" and sha and meta)):
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
    """(init_from's checkpoint, origin): out_dir's to resume (matching this run) or a run's to fine-tune
    (FINETUNE_KEYS may differ, and pos_emb from rope to none: DroPE). A scaling that needs the original length
    and lacks it takes the checkpoint's train_len (model.py would take block_size)."""
    fine_tune = config["init_from"] != "resume"
    path = config["init_from"] if fine_tune else Path(config["out_dir"])
    ckpt, weights = read_checkpoint(path, device)
    # weights only, as tests/assets/copier.pt
    if not fine_tune and (missing := [k for k in RESUME_KEYS if k not in ckpt]):
        raise UserError(f"{path}/ckpt.pt cannot be resumed: it holds no {', '.join(missing)} (weights only, "
                        f"a converted model's, or an older train.py's); fine-tune from it instead: "
                        f"--init_from={path}/ckpt.pt --out_dir=<a new folder>")
    if not fine_tune and config["max_iters"] < (done := ckpt["iter_num"]):
        raise UserError(f"max_iters={config['max_iters']} is below the iteration of {path}/ckpt.pt ({done}): "
                        f"a resume trains on from there; give --max_iters={done} or more")
    args, origin, scaling = ckpt["model_args"], ckpt.get("origin"), config["rope_scaling"]
    # the original training length: the first run's, through fine-tunes
    train_len = checkpoint_config(ckpt).train_len
    if fine_tune:
        origin = dict(init_from=config["init_from"], iter_num=ckpt["iter_num"], train_len=train_len,
                      pos_emb=(origin or {}).get("pos_emb") or args["pos_emb"], weights_id=weights)
    # DroPE (Gelberg et al. 2026): a RoPE run fine-tuned without positions; RoPE has no weights, so they load
    # as they are
    drope = fine_tune and args["pos_emb"] == "rope" and config["pos_emb"] == "none"
    if (origin and scaling and ORIGINAL in ROPE_TYPES[scaling_type(scaling)].required
            and ORIGINAL not in scaling):
        config["rope_scaling"] = {**scaling, ORIGINAL: train_len}
        print(f"rope_scaling: {ORIGINAL}={train_len}, the original training length")
    # a key newer than the checkpoint: it was trained as its default (a new key's default is the old
    # behaviour)
    differ = [f"{k}={args.get(k, DEFAULTS[k])!r} (config: {config[k]!r})" for k in MODEL_KEYS
              if not (fine_tune and k in FINETUNE_KEYS or drope and k in DROPE_KEYS)
              and args.get(k, DEFAULTS[k]) != config[k]]
    if args["vocab_size"] != meta["vocab_size"]:
        differ.append(f"vocab_size={args['vocab_size']} (data/{config['dataset']}: {meta['vocab_size']})")
    if fine_tune and config["pos_emb"] == "learned" and args["block_size"] != config["block_size"]:
        differ.append(f"block_size={args['block_size']} (config: {config['block_size']}; "
                      "a learned table cannot change size)")
    if not fine_tune and not differ and (
            changed := provenance_changes(ckpt, config, meta, RUNNING_KEYS + LONGER_KEYS + MODEL_KEYS)):
        raise UserError(f"checkpoint {path}/ckpt.pt was trained otherwise: {'; '.join(changed)}; "
                        "a resume may change only "
                        f"{' and '.join(LONGER_KEYS)} and how it runs (device, logging, ...); "
                        "to train on otherwise, "
                        f"fine-tune from it into a new --out_dir")
    if differ:
        raise UserError(f"init_from={path}: the checkpoint does not match this run ({'; '.join(differ)}); "
                        f"a fine-tune may change only {', '.join(FINETUNE_KEYS)}, and pos_emb from 'rope' to "
                        "'none' (DroPE)" if fine_tune else
                        f"checkpoint {path}/ckpt.pt does not match this run: {'; '.join(differ)}")
    return ckpt, origin
