"""The run folder behind train.py's three calls (open_out_dir, start_checkpoint, save_checkpoint): one writer
at a time, checkpoints written whole and read once, --overwrite=True, kept checkpoints, resume, fine-tunes."""
import io
import json
import os
import shutil
from contextlib import contextmanager, suppress
from pathlib import Path

import torch

from common import UserError, claim_output, digest_id, json_text, release_outputs, write_atomic
from config import DEFAULTS, DROPE_KEYS, FINETUNE_KEYS, MODEL_KEYS, gpt_config
from rope import ORIGINAL, ROPE_TYPES, scaling_type

CHECKPOINT_KEYS = ("model", "model_args", "iter_num", "config")
RESUME_KEYS = ("optimizer", "best_val_loss", "rng", "log")  # what a resume needs beyond the weights
# how a run runs, not what it learns: the keys a resume or a study's reuse may change
RUNNING_KEYS = ("out_dir", "init_from", "overwrite", "device", "dtype", "compile", "log_interval",
                "eval_interval", "eval_iters", "keep_iters", "wandb_log", "wandb_project", "wandb_run_name",
                "wandb_group")
LONGER_KEYS = ("max_iters", "lr_decay_iters")  # how long it trains: a resume may train on further
KEPT_PREFIX = "iter_"  # out_dir/iter_<n>/: a checkpoint keep_iters kept, a run folder of its own


def read_checkpoint(path, device="cpu"):
    """(checkpoint, weights_id) from one open file: one renamed over it meanwhile leaves it its bytes."""
    with open(path := checkpoint_file(path), "rb") as f:
        weights = digest_id(f)
        f.seek(0)
        return load_checkpoint(path, device, file=f), weights


def load_checkpoint(path, device="cpu", mmap=False, file=None):
    """A ckpt.pt (path: it or its run folder; mmap: tensors read when used), checked to be ropelab's."""
    path = checkpoint_file(path) if file is None else path
    try:
        ckpt = torch.load(file or path, map_location=device, weights_only=True, mmap=mmap)
    # torch raises many kinds for a truncated or foreign file, with pages of advice: its first clause
    except Exception as e:
        why = (str(e).strip().splitlines() or [""])[0].split(". ")[0][:80]
        raise UserError(f"checkpoint {path} is corrupted or not a ropelab checkpoint "
                        f"({type(e).__name__}: {why})") from None
    if missing := [k for k in CHECKPOINT_KEYS if not isinstance(ckpt, dict) or k not in ckpt]:
        raise UserError(f"checkpoint {path} is not a ropelab checkpoint: missing {', '.join(missing)}")
    known = {*MODEL_KEYS, "vocab_size", "train_len"}
    if not isinstance(ckpt["model_args"], dict) or (unknown := sorted(set(ckpt["model_args"]) - known)):
        what = (f"model_args {', '.join(map(str, unknown))}" if isinstance(ckpt["model_args"], dict)
                else "no model_args dict")
        raise UserError(f"checkpoint {path} is not a ropelab checkpoint: it has {what} (nanoGPT's, say), "
                        "which ropelab's model does not have; train.py writes the checkpoints ropelab reads")
    return ckpt


def checkpoint_file(path):
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


def checkpoint_config(ckpt):
    """Its GPTConfig; one written before train_len was a field takes it from its origin."""
    return gpt_config({"train_len": (ckpt.get("origin") or {}).get("train_len"), **ckpt["model_args"]})


def beside(folder, kind):  # .<name>.<kind> beside folder: its lock, or the run an overwrite replaced
    home = Path(folder).resolve()
    return home.with_name(f".{home.name}.{kind}")


def replaced(out_dir):  # where --overwrite=True moves out_dir's run until the new one's first checkpoint
    return beside(out_dir, "replaced")


def run_files(out_dir):
    return [n for n in ("ckpt.pt", "log.jsonl") if (Path(out_dir) / n).exists()]


def kept_folders(out_dir):
    return sorted(p for p in Path(out_dir).glob(KEPT_PREFIX + "*")
                  if p.name[len(KEPT_PREFIX):].isdecimal() and p.is_dir())


def claim_run(out_dir, writer, in_use, option):
    """Hold out_dir's lock, then settle a run an --overwrite=True left waiting: checks see the run there."""
    claim_output(out_dir, writer, lock=beside(out_dir, "lock"), option=option, in_use=in_use)
    settle_replaced(Path(out_dir))


def settle_replaced(out_dir, finish=False):
    """Settle an --overwrite=True from its two whole folders (a step is one rename or removal: a kill leaves
    one of these): no new checkpoint, the old run comes back; one, the old run goes on finish (not in a
    command then refused). A ckpt.pt put there by hand decides nothing: both stay, refused."""
    old = replaced(out_dir)
    if not old.exists():
        return
    if (out_dir / "ckpt.pt").exists():  # written atomically: there means complete
        if finish:  # checked by this command's claim already
            shutil.rmtree(old)
            return
        with suppress(UserError):
            ckpt = load_checkpoint(out_dir, mmap=True)
            if "pretrained" not in ckpt and ckpt["config"].get("overwrite") is True:
                return  # the first checkpoint of the run that replaces the waiting one
        raise UserError(f"{out_dir}/ckpt.pt is not the first checkpoint of the --overwrite=True that "
                        f"moved the run there into {old}, which waits to come back: "
                        "move one of the two elsewhere")
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.rename(old, out_dir)


def replace_run(out_dir, config):
    """Move out_dir's run aside whole (one rename); a kept checkpoint trained on (now, before) is refused."""
    source = config["init_from"]
    if source != "resume" and Path(source).resolve().is_relative_to(out_dir.resolve()):
        raise UserError(f"init_from={source} is out_dir's own checkpoint, which --overwrite=True would "
                        f"replace: fine-tune into another --out_dir")
    kept_runs = kept_folders(out_dir)
    if others := sorted(p.name for p in out_dir.iterdir() if p.is_dir() and p not in kept_runs):
        raise UserError(f"{out_dir} holds folders besides its run's ({', '.join(others)}): --overwrite=True "
                        f"replaces the folder whole; give the new run a folder of its own")
    try:
        for kept in kept_runs:
            claim_output(kept, "train", lock=beside(kept, "lock"), option="--out_dir",
                         in_use=f"--overwrite=True would remove it with {out_dir}; wait for it to end")
            it = own = int(kept.name[len(KEPT_PREFIX):])
            # the last iteration in its log: past its own, it was resumed in place (a run of its own)
            with suppress(OSError, ValueError, KeyError, TypeError, IndexError):  # no log, or not train.py's
                it = json.loads((kept / "log.jsonl").read_text().splitlines()[-1])["iter"]
            if it > own:
                raise UserError(f"{kept} was trained on to iter {it} (a run of its own now): "
                                f"--overwrite=True would remove it with {out_dir}; move it out first")
        settle_replaced(out_dir, finish=True)  # a run an earlier overwrite replaced, for this one's place
        os.rename(out_dir, replaced(out_dir))
    finally:
        for kept in kept_runs:
            release_outputs(kept)
    out_dir.mkdir()


@contextmanager
def open_out_dir(config):
    """out_dir, held for one training; a run there goes (--overwrite=True) once the new one's is written."""
    out_dir = Path(config["out_dir"])
    if out_dir.is_file():
        raise UserError(f"out_dir {out_dir} is a file: "
                        "choose another --out_dir (a folder for ckpt.pt and log.jsonl)")
    claim_run(out_dir, "train", "one training per out_dir", "--out_dir")
    try:
        kept = [p.name for p in kept_folders(out_dir)]
        existing = [] if config["init_from"] == "resume" else run_files(out_dir) + kept
        if existing and not config["overwrite"]:
            go_on = ""  # how to go on instead: resume a training's checkpoint, fine-tune from another's
            if (out_dir / "ckpt.pt").exists():
                go_on = f"fine-tune from it into another folder (--init_from={out_dir} --out_dir=NEW), or "
                with suppress(UserError):
                    if all(k in load_checkpoint(out_dir, mmap=True) for k in RESUME_KEYS):
                        go_on = "continue it with --init_from=resume, or "
            raise UserError(f"{out_dir} already holds a run ({', '.join(existing)}): "
                            f"{go_on}replace it with --overwrite=True")
        if existing:
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


def save_checkpoint(out_dir, state, keep=False):
    """state into out_dir/ckpt.pt atomically, then the run it replaces goes. keep: also as out_dir/iter_<n>/,
    a run folder of its own, never written again (a run may have trained on in it)."""
    path, iter_num = out_dir / "ckpt.pt", state["iter_num"]
    buffer = io.BytesIO()  # first: torch reports a failed write (a full disk) as a RuntimeError of its own
    torch.save(state, buffer)
    try:
        write_atomic(path, lambda f: f.write(buffer.getbuffer()))
    except OSError as e:
        raise OSError(f"cannot write {path} at iter {iter_num} ({e.strerror or e}): the checkpoint there is "
                      f"kept as it was; free some space and resume with --init_from=resume") from None
    settle_replaced(out_dir, finish=True)
    if not keep:
        return
    folder = out_dir / f"{KEPT_PREFIX}{iter_num}"
    if folder.exists():
        print(f"{folder} is kept already: a kept checkpoint is never written again")
        return
    tmp = out_dir / f".{folder.name}.tmp"  # built whole, then renamed
    shutil.rmtree(tmp, ignore_errors=True)  # a killed run's half-built one
    tmp.mkdir()
    shutil.copyfile(path, tmp / "ckpt.pt")
    write_log(tmp, state["log"])
    os.rename(tmp, folder)


def write_log(folder, log):
    write_atomic(folder / "log.jsonl", lambda f: f.write("".join(json_text(e) + "\n" for e in log).encode()))


def data_identity(meta):
    return dict(tokenizer=meta["tokenizer"], vocab_size=meta["vocab_size"], source=meta.get("source"),
                sha256={name: meta["files"][name]["sha256"] for name in ("train.bin", "val.bin")})


def with_original(scaling, train_len):
    """A scaling that needs the original length and lacks it, given train_len (model.py takes block_size)."""
    needs = scaling and ORIGINAL in ROPE_TYPES[scaling_type(scaling)].required and ORIGINAL not in scaling
    return {**scaling, ORIGINAL: train_len} if needs and train_len else scaling


def differences(ckpt, config, meta, ignored=RUNNING_KEYS):
    """{key: (as trained, as configured)} for each key but ignored that differs, the text by its contents
    (meta None: not compared), the init source; a key newer than the checkpoint was trained as its default."""
    args, recorded, origin = ckpt["model_args"], ckpt["config"], ckpt.get("origin") or {}
    sha, found = (ckpt.get("data") or {}).get("sha256"), {}
    for key in (k for k in DEFAULTS if k not in ignored and not (k == "dataset" and sha and meta)):
        was, now = (args if key in MODEL_KEYS else recorded).get(key, DEFAULTS[key]), config[key]
        if key == "rope_scaling" and origin:
            now = with_original(now, origin.get("train_len"))
        if was != now:
            found[key] = was, repr(now)
    if sha and meta and data_identity(meta)["sha256"] != sha:
        found["dataset"] = recorded["dataset"], f"{config['dataset']!r}, other text"
    init = origin.get("init_from", "scratch")
    if config["init_from"] != "resume" and str(init) != str(config["init_from"]):
        found["init_from"] = init, repr(config["init_from"])
    return found


def start_checkpoint(config, meta, device):
    """(init_from's checkpoint, origin): out_dir's to resume, or a run's to fine-tune (FINETUNE_KEYS may
    differ, and pos_emb from rope to none: DroPE)."""
    fine_tune = config["init_from"] != "resume"
    path = config["init_from"] if fine_tune else Path(config["out_dir"])
    ckpt, weights = read_checkpoint(path, device)
    if not fine_tune and (missing := [k for k in RESUME_KEYS if k not in ckpt]):
        raise UserError(f"{path}/ckpt.pt cannot be resumed: it holds no {', '.join(missing)} (weights only, "
                        f"a converted model's, or an older train.py's); fine-tune from it instead: "
                        f"--init_from={path}/ckpt.pt --out_dir=<a new folder>")
    if not fine_tune and config["max_iters"] < (done := ckpt["iter_num"]):
        raise UserError(f"max_iters={config['max_iters']} is below the iteration of {path}/ckpt.pt ({done}): "
                        f"a resume trains on from there; give --max_iters={done} or more")
    args, origin = ckpt["model_args"], ckpt.get("origin")
    train_len = checkpoint_config(ckpt).train_len  # the first run's, through fine-tunes
    if fine_tune:
        origin = dict(init_from=config["init_from"], iter_num=ckpt["iter_num"], train_len=train_len,
                      pos_emb=(origin or {}).get("pos_emb") or args["pos_emb"], weights_id=weights)
    if origin and (scaling := with_original(config["rope_scaling"], train_len)) != config["rope_scaling"]:
        config["rope_scaling"] = scaling
        print(f"rope_scaling: {ORIGINAL}={train_len}, the original training length")
    # DroPE (Gelberg et al. 2026): a RoPE run fine-tuned without positions (RoPE has no weights to drop)
    drope = fine_tune and args["pos_emb"] == "rope" and config["pos_emb"] == "none"
    may_differ = (FINETUNE_KEYS + (DROPE_KEYS if drope else ()) if fine_tune else LONGER_KEYS) + RUNNING_KEYS
    found = differences(ckpt, config, None if fine_tune else meta, may_differ)
    differ = [f"{k}={was!r} (config: {now})" for k, (was, now) in found.items() if k in MODEL_KEYS]
    if args["vocab_size"] != meta["vocab_size"]:
        differ.append(f"vocab_size={args['vocab_size']} (data/{config['dataset']}: {meta['vocab_size']})")
    if fine_tune and config["pos_emb"] == "learned" and args["block_size"] != config["block_size"]:
        differ.append(f"block_size={args['block_size']} (config: {config['block_size']}; "
                      "a learned table cannot change size)")
    if fine_tune and differ:
        raise UserError(f"init_from={path}: the checkpoint does not match this run ({'; '.join(differ)}); "
                        f"a fine-tune may change only {', '.join(FINETUNE_KEYS)}, and pos_emb from 'rope' to "
                        "'none' (DroPE)")
    if differ:
        raise UserError(f"checkpoint {path}/ckpt.pt does not match this run: {'; '.join(differ)}")
    if not fine_tune and (changed := [f"{k}={was!r} (now {now})" for k, (was, now) in found.items()]):
        raise UserError(f"checkpoint {path}/ckpt.pt was trained otherwise: {'; '.join(changed)}; "
                        f"a resume may change only {' and '.join(LONGER_KEYS)} and how it runs (device, "
                        "logging, ...); to train on otherwise, fine-tune from it into a new --out_dir")
    return ckpt, origin
