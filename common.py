"""The torch-free helpers every command shares: one-line user errors, the CLI parser, output locks, atomic
writes and strict JSON. Data preparation and reporting import this and never the model (so never torch)."""
import argparse
import atexit
import fcntl
import hashlib
import json
import math
import os
import re
import sys
from contextlib import contextmanager, suppress
from pathlib import Path

ROOT = Path(__file__).resolve().parent
# a scaling factor's largest: past it the RoPE math overflows (NTK's base * factor ** (d / (d - 2)))
MAX_FACTOR = 1e6
OOM_HINT = {"train.py": "lower --batch_size (and raise --gradient_accumulation_steps to keep the tokens per "
                         "iteration), --block_size or the model size",
            "sample.py": "lower --num_samples or --max_new_tokens",
            "extrapolate.py": "lower --lengths (the longest window is one forward) or --tokens"}


class UserError(ValueError):
    """Bad input from the user (an option, a config, a file): run_cli prints it as one line. A bug keeps its
    traceback."""


def out_of_memory(e):
    """Whether e is an allocator's failure (torch's is a RuntimeError; any other RuntimeError is a bug)."""
    torch = sys.modules.get("torch")  # only a command that imported torch can meet its allocator
    return (isinstance(e, MemoryError) or (torch is not None and isinstance(e, torch.OutOfMemoryError))
            or "can't allocate memory" in str(e))


def run_cli(prog, fn, *args):
    """fn(*args), with an expected failure (UserError, OSError) as `prog: error: <one line>`, exit 1; Ctrl-C
    as `prog: interrupted <where>`, exit 130; any other exception is a bug and keeps its traceback. The output
    folders it claimed are released whatever happens."""
    try:
        return fn(*args)
    except (UserError, OSError) as e:
        sys.exit(f"{prog}: error: {' '.join(str(e).split())}")
    except KeyboardInterrupt as e:
        # e: what the command was doing, if it said (train.py: the iteration and how to resume)
        print(f"{prog}: interrupted{' ' + str(e) if str(e) else ''}", file=sys.stderr)
        sys.exit(130)
    except (MemoryError, RuntimeError) as e:
        if not out_of_memory(e):
            raise
        sys.exit(f"{prog}: error: out of memory; "
                 f"{OOM_HINT.get(prog, 'use a smaller batch, length or model')}")
    finally:
        release_outputs()


# ----------------------------------------------------------------------------- the one CLI parser

class _Parser(argparse.ArgumentParser):
    def error(self, message):
        # a ValueError, for run_cli's one line (argparse's own error takes two, with the usage)
        raise UserError(re.sub(r"^argument (--[\w-]+): (?=.*\1)", "", message))  # a type's message names it


def command_parser(doc, *shared, out=None, seed=0, wandb_log=None):
    """An argparse parser whose errors are run_cli's one line, with the options commands share (named in
    shared), one meaning each in every command: run_dir, a run folder; --out, the folder the results go into
    (default: out, else the run folder, else required); --device; --seed; --wandb_log true|false (default:
    wandb_log; None, the run's own) and --no-wandb, its short form. shared_values gives their values."""
    p = _Parser(description=doc.split("\n\n")[0].strip())
    if "run_dir" in shared:
        p.add_argument("run_dir", help="a run folder holding ckpt.pt (e.g. out/rope_small)")
    if "out" in shared:
        required = out is None and "run_dir" not in shared
        p.add_argument("--out", default=out, required=required, help="the folder the results are written into"
                       + ("" if required else f" (default {out or 'RUN_DIR'})"))
    if "device" in shared:
        p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N | mps (default auto)")
    if "seed" in shared:
        p.add_argument("--seed", default=str(seed), help=f"seed of the random choices (default {seed})")
    if "check" in shared:
        p.add_argument("--check", action="store_true",
                       help="check the options and exit, computing nothing (what a study runs before its "
                            "first training)")
    if "wandb" in shared:
        p.add_argument("--wandb_log", default=wandb_log,
                       help=f"log to wandb: true | false (default {wandb_log or 'as the run'})")
        p.add_argument("--no-wandb", dest="wandb_log", action="store_const", const="false",
                       help="--wandb_log false")
    return p


def shared_values(a):
    """The shared options of a command_parser's parsed namespace a as values: run_dir and out as Paths (out:
    the run folder if not given), the device picked, the seed an integer >= 0, wandb_log None (the run's own),
    True or False."""
    # "" is the current folder, which nobody means
    if getattr(a, "out", None) is not None and not a.out.strip():
        raise UserError("--out is empty; name the folder to write into")
    if getattr(a, "wandb_log", None) is not None and a.wandb_log.lower() not in ("true", "false"):
        raise UserError(f"--wandb_log {a.wandb_log!r} is not true or false")
    values = dict(run_dir=lambda: Path(a.run_dir),
                  out=lambda: run_home(a.run_dir) if a.out is None else Path(a.out),
                  device=lambda: pick_device(a.device), seed=lambda: parse_number(a.seed, "seed", int, 0),
                  wandb_log=lambda: None if a.wandb_log is None else a.wandb_log.lower() == "true",
                  check=lambda: a.check)
    return {k: value() for k, value in values.items() if k in a}


def unless_check(fn, args):
    """fn(args), or with --check only the note that the options passed (a study checks its commands' options
    so)."""
    if not args.get("check"):
        return fn(args)
    print("options checked")


def pick_device(name):
    # here, not above: only a command that runs the model picks a device, and it has torch loaded already
    import torch
    kind, available = name.split(":")[0], dict(cuda=torch.cuda.is_available,
                                               mps=torch.backends.mps.is_available)
    if kind not in ("auto", "cpu", "cuda", "mps"):
        raise UserError(f"device={name!r} is not one of: auto, cpu, cuda, cuda:N, mps")
    if kind in available and not available[kind]():
        why = "Apple GPUs only" if kind == "mps" else f"torch {torch.__version__} " + (
            f"(CUDA {torch.version.cuda}) sees no GPU" if torch.version.cuda else "is a CPU-only build")
        raise UserError(f"device={name!r} but this torch has no {kind.upper()}: {why}; "
                        "use --device=cpu or auto")
    return name if kind != "auto" else next((k for k, ok in available.items() if ok()), "cpu")


def parse_list(text, name, convert, allowed=None):
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise UserError(f"--{name} is empty")
    if allowed and (bad := [t for t in items if t not in allowed]):
        raise UserError(f"unknown --{name} {', '.join(bad)}; allowed: {', '.join(allowed)}")
    try:
        values = list(dict.fromkeys(convert(t) for t in items))  # keep order, drop repeats
    except ValueError:
        raise UserError(f"--{name} {text!r} is not a comma-separated list of numbers") from None
    # inf and nan pass range checks
    if bad := [t for t, v in zip(items, map(convert, items))
               if isinstance(v, float) and not math.isfinite(v)]:
        raise UserError(f"--{name} {text!r}: {', '.join(bad)} is not a finite number")
    return values


def parse_number(text, name, convert, minimum, maximum=None):
    try:
        value = convert(text)
    except ValueError:
        raise UserError(f"--{name} {text!r} is not a{'n integer' if convert is int else ' number'}") from None
    if not math.isfinite(value):  # inf passes `>= minimum`
        raise UserError(f"--{name} {text!r} is not a finite number; use a number >= {minimum}")
    if not value >= minimum:  # also catches nan
        raise UserError(f"--{name} must be >= {minimum}, got {text}")
    if maximum is not None and value > maximum:
        raise UserError(f"--{name} {text} is too large: use a number <= {maximum:g}")
    return value


def run_home(run_dir):
    """The folder of a run given as its folder or its ckpt.pt: where its evaluations are written by
    default."""
    return Path(run_dir).parent if Path(run_dir).is_file() else Path(run_dir)


def data_dir(dataset):
    return Path(dataset) if Path(dataset).is_absolute() else ROOT / "data" / dataset


# ----------------------------------------------------------------------------- strict JSON

def json_safe(obj):
    """obj with every non-finite float as None, for strict JSON (Infinity and NaN are not JSON; strict parsers
    refuse them)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def json_text(obj, indent=None):
    """Strict JSON of obj: what every file the project writes holds (a non-finite number as null)."""
    return json.dumps(json_safe(obj), indent=indent, allow_nan=False)


# ----------------------------------------------------------------------------- the one lock system

def open_locked(path):
    """path opened (emptied once held), holding its exclusive flock; None where another open file holds it, or
    where the file it opened was removed meanwhile (release_outputs removes an output folder's lock as it
    ends: the command that opened it then is refused, not retried). The lock is the operating system's: it
    goes when the file is closed or its process ends."""
    f = open(path, "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if os.path.samestat(os.fstat(f.fileno()), os.stat(path)):
            f.truncate(0)  # held: the last holder's name goes, for its holder's own
            return f
    except (BlockingIOError, FileNotFoundError):
        pass
    f.close()
    return None


_CLAIMED = []  # (folder, lock path, its open file, folders made for it), released by run_cli, write_all, exit


SOURCE_FOLDERS = ("configs", "data", "eval", "lab", "tests", ".git")  # the repository's own, beside its root


def source_folder(folder, corpus=False):
    """The repository folder `folder` lies in where no output belongs (its root, a source folder; data/ and
    the corpora in it, unless corpus: a data/<name> folder for prepare.py), else None."""
    # the folder as written, and with links followed
    for path in {Path(os.path.abspath(folder)), Path(folder).resolve()}:
        if path == ROOT or path == ROOT / "data" or (
                path.is_relative_to(ROOT) and path.relative_to(ROOT).parts[0] in SOURCE_FOLDERS
                and not (corpus and path.parent == ROOT / "data")):
            return ROOT if path == ROOT else ROOT / path.relative_to(ROOT).parts[0]
    return None


def claim_output(folder, name, lock=None, in_use=None, option="--out", corpus=False):
    """Make folder and hold the lock folder/.<name>.lock (or lock) until the command ends: the one way into
    the project's locks. A second command writing the same outputs there meanwhile is refused (in_use: what
    its error says). A folder that cannot be written, or one of the repository's own (source_folder; corpus:
    prepare.py's data/<name>), fails now, not after the whole computation. option: the option that names the
    folder."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise UserError(f"output folder {folder} is a file: choose another {option}")
    if inside := source_folder(folder, corpus):
        raise UserError(f"output folder {folder} is inside the repository's "
                        f"{'root' if inside == ROOT else inside.name + '/'} "
                        f"folder, which holds its source{' and corpora' * (inside.name == 'data')}: "
                        f"choose another {option} "
                        "(out/... is meant for outputs)")
    made = [p for p in (folder, *folder.parents) if not p.exists()]  # deepest first
    lock = Path(lock or folder / f".{name}.lock")
    if any(held == lock for _, held, _, _ in _CLAIMED):  # this process holds it already
        return folder
    try:
        folder.mkdir(parents=True, exist_ok=True)
        f = open_locked(lock)
    except OSError as e:  # read-only, or under a file: found now, not after the whole computation
        raise UserError(f"output folder {folder} cannot be written ({e.strerror or e}: {e.filename}); "
                        f"give another {option}") from None
    if f is None:
        in_use = in_use or f"another command writes its {name} outputs there; wait, or give another {option}"
        raise UserError(f"{folder} is in use by {lock_holder(lock)} (its lock {lock}): {in_use}")
    f.write(f"{Path(sys.argv[0]).name or 'python'} (process {os.getpid()})")  # whom a refused command names
    f.flush()
    _CLAIMED.append((folder, lock, f, made))
    remove_leftovers(folder)
    return folder


def lock_holder(lock):
    """What holds lock, as its holder wrote it ("train.py (process 123)")."""
    with suppress(OSError):
        return Path(lock).read_text().strip() or "another command"
    return "another command"


def release_outputs(folder=None):
    """Release this process's output locks (of folder, or all); remove the folders made for no outputs. A lock
    inside the folder it guards goes with it (the folder holds outputs only); a run folder's, beside it,
    stays."""
    for item in [c for c in _CLAIMED if folder is None or c[0] == Path(folder)]:
        _CLAIMED.remove(item)
        claimed, lock, f, made = item
        if lock.parent == claimed:
            # before the lock goes: one who opened it meanwhile is refused (open_locked)
            lock.unlink(missing_ok=True)
        f.close()
        with suppress(OSError):
            for p in made:
                p.rmdir()  # only if empty


atexit.register(release_outputs)
os.register_at_fork(after_in_child=_CLAIMED.clear)  # a forked worker holds no claim of its own to release


# ----------------------------------------------------------------------------- the one atomic writer

def remove_leftovers(folder):
    """Remove the temporary files in folder (atomic's, .<name>.<pid>.tmp) whose writers ended without removing
    them (a kill -9): those of a process that runs no more."""
    for tmp in Path(folder).glob(".*.*.tmp"):
        pid = tmp.name.split(".")[-2]
        if pid.isdecimal() and not running(int(pid)):
            with suppress(OSError):  # gone already, a folder, or a read-only folder
                tmp.unlink()


def running(pid):
    try:
        os.kill(pid, 0)  # signal 0: delivered to nobody, only checked
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


@contextmanager
def atomic(path):
    """A file to write in place of path: a temp file beside it, synced and renamed over path when the block
    ends, removed if it fails. A crash leaves the old file or the new one (and the next write in that folder
    removes a dead writer's temp file)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # same folder: os.replace is then a rename
    remove_leftovers(path.parent)
    try:
        with open(tmp, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
            os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_atomic(path, write):
    """write(f) into path atomically (atomic)."""
    with atomic(path) as f:
        write(f)


# ----------------------------------------------------------------------------- the weights a result describes

def weights_id(path):
    """The identity of a checkpoint (path: a ckpt.pt or its run folder), None where there is none: the first
    16 hex digits of the sha256 of its bytes. Its content, not its path or mtime: a run trained on or replaced
    in the same folder gets another id, so a result that records the id it read can be told from one of the
    weights there now."""
    path = Path(path) / "ckpt.pt" if Path(path).is_dir() else Path(path)
    if not path.is_file():
        return None
    with open(path, "rb") as f:
        return digest_id(f)


def digest_id(f):
    """weights_id of the bytes of an open file, read from where it is."""
    return hashlib.file_digest(f, "sha256").hexdigest()[:16]


def file_sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
