"""The torch-free helpers every command shares: one-line user errors, the CLI parser, output locks, atomic
writes, strict JSON (data preparation and reports import this, never torch)."""
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
MAX_FACTOR = 1e6  # a scaling factor's largest: past it NTK's base * factor ** (d / (d - 2)) overflows
OOM_HINT = {"train.py": "lower --batch_size (and raise --gradient_accumulation_steps to keep the tokens per "
                         "iteration), --block_size or the model size",
            "sample.py": "lower --num_samples or --max_new_tokens",
            "extrapolate.py": "lower --lengths (the longest window is one forward) or --tokens"}


class UserError(ValueError):
    """Bad input (an option, a config, a file): one line from run_cli, where a bug keeps its traceback."""


def out_of_memory(e):  # torch's is a RuntimeError, and any other RuntimeError is a bug
    torch = sys.modules.get("torch")  # only a command that imported torch can meet its allocator
    return (isinstance(e, MemoryError) or (torch is not None and isinstance(e, torch.OutOfMemoryError))
            or "can't allocate memory" in str(e))


def run_cli(prog, fn, *args):
    """fn(*args), a UserError or OSError as one line (exit 1), a bug with its traceback; outputs released."""
    try:
        return fn(*args)
    except (UserError, OSError) as e:
        sys.exit(f"{prog}: error: {' '.join(str(e).split())}")
    except KeyboardInterrupt as e:  # e: what the command was doing, if it said (train.py: how to resume)
        print(f"{prog}: interrupted{' ' + str(e) if str(e) else ''}", file=sys.stderr)
        sys.exit(130)
    except (MemoryError, RuntimeError) as e:
        if not out_of_memory(e):
            raise
        hint = OOM_HINT.get(prog, "use a smaller batch, length or model")
        sys.exit(f"{prog}: error: out of memory; {hint}")
    finally:
        release_outputs()


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # run_cli's one line, not argparse's two with the usage
        raise UserError(re.sub(r"^argument (--[\w-]+): (?=.*\1)", "", message))  # a type's message names it


def command_parser(doc, *shared, out=None, seed=0, wandb_log=None):
    """A parser with the options in shared, each meaning the same in every command (see shared_values)."""
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
        p.add_argument("--check", action="store_true", help="check the options and exit, computing nothing "
                       "(what a study runs before its first training)")
    if "wandb" in shared:
        p.add_argument("--wandb_log", default=wandb_log,
                       help=f"log to wandb: true | false (default {wandb_log or 'as the run'})")
        p.add_argument("--no-wandb", dest="wandb_log", action="store_const", const="false",
                       help="--wandb_log false")
    return p


def shared_values(a):
    """command_parser's shared options as values (--out: the run folder if not given)."""
    if getattr(a, "out", None) is not None and not a.out.strip():  # "" is the current folder: nobody means it
        raise UserError("--out is empty; name the folder to write into")
    if getattr(a, "wandb_log", None) is not None and a.wandb_log.lower() not in ("true", "false"):
        raise UserError(f"--wandb_log {a.wandb_log!r} is not true or false")
    values = dict(run_dir=lambda: Path(a.run_dir),
                  out=lambda: run_home(a.run_dir) if a.out is None else Path(a.out),
                  device=lambda: pick_device(a.device), seed=lambda: parse_number(a.seed, "seed", int, 0),
                  wandb_log=lambda: None if a.wandb_log is None else a.wandb_log.lower() == "true",
                  check=lambda: a.check)
    return {k: value() for k, value in values.items() if k in a}


def unless_check(fn, args):  # --check: a study checks its commands' options so
    if not args.get("check"):
        return fn(args)
    print("options checked")


def pick_device(name):
    import torch  # only a command that runs the model picks a device, and it has torch loaded already
    kind = name.split(":")[0]
    available = dict(cuda=torch.cuda.is_available, mps=torch.backends.mps.is_available)
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
        values = [convert(t) for t in items]
    except ValueError:
        raise UserError(f"--{name} {text!r} is not a comma-separated list of numbers") from None
    # inf and nan pass range checks
    if bad := [t for t, v in zip(items, values) if isinstance(v, float) and not math.isfinite(v)]:
        raise UserError(f"--{name} {text!r}: {', '.join(bad)} is not a finite number")
    return list(dict.fromkeys(values))  # in order, once each


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


def run_home(run_dir):  # a run given as its folder or its ckpt.pt: where its evaluations go by default
    return Path(run_dir).parent if Path(run_dir).is_file() else Path(run_dir)


def data_dir(dataset):
    return Path(dataset) if Path(dataset).is_absolute() else ROOT / "data" / dataset


def json_safe(obj):  # Infinity and NaN are not JSON: strict parsers refuse them
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    return [json_safe(v) for v in obj] if isinstance(obj, (list, tuple)) else obj


def json_text(obj, indent=None):  # what every file the project writes holds
    return json.dumps(json_safe(obj), indent=indent, allow_nan=False)


def open_locked(path):
    """path opened and emptied, holding its flock (gone with the file or its process); None where another
    holds it, or where the file was removed meanwhile (by release_outputs: refused, not retried)."""
    f = open(path, "a+")
    with suppress(BlockingIOError, FileNotFoundError):
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if os.path.samestat(os.fstat(f.fileno()), os.stat(path)):
            f.truncate(0)  # held: the last holder's name goes, for its holder's own
            return f
    f.close()


_CLAIMED = []  # (folder, lock path, its open file, folders made for it), released by run_cli, write_all, exit
SOURCE_FOLDERS = ("configs", "data", "eval", "lab", "tests", ".git")  # the repository's own, beside its root


def claim_output(folder, name, lock=None, in_use=None, option="--out", corpus=False):
    """Make folder and hold folder/.<name>.lock (or lock) until the command ends: the one way into the locks.
    Another command writing there meanwhile is refused (in_use: why), and so is, now rather than after the
    computation, a folder that cannot be written or one of the repository's (corpus: data/<name> is not)."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise UserError(f"output folder {folder} is a file: choose another {option}")
    for path in {Path(os.path.abspath(folder)), Path(folder).resolve()}:  # as written, with links followed
        if path == ROOT or path == ROOT / "data" or (
                path.is_relative_to(ROOT) and path.relative_to(ROOT).parts[0] in SOURCE_FOLDERS
                and not (corpus and path.parent == ROOT / "data")):
            inside = "root" if path == ROOT else path.relative_to(ROOT).parts[0] + "/"
            raise UserError(f"output folder {folder} is inside the repository's {inside} folder, which holds "
                            f"its source{' and corpora' * (inside == 'data/')}: choose another {option} "
                            "(out/... is meant for outputs)")
    made = [p for p in (folder, *folder.parents) if not p.exists()]  # deepest first
    lock = Path(lock or folder / f".{name}.lock")
    if any(held == lock for _, held, _, _ in _CLAIMED):  # this process holds it already
        return folder
    try:
        folder.mkdir(parents=True, exist_ok=True)
        f = open_locked(lock)
    except OSError as e:  # read-only, or under a file
        raise UserError(f"output folder {folder} cannot be written ({e.strerror or e}: {e.filename}); "
                        f"give another {option}") from None
    if f is None:
        holder = "another command"
        with suppress(OSError):
            holder = lock.read_text().strip() or holder  # as its holder wrote it: "train.py (process 123)"
        in_use = in_use or f"another command writes its {name} outputs there; wait, or give another {option}"
        raise UserError(f"{folder} is in use by {holder} (its lock {lock}): {in_use}")
    f.write(f"{Path(sys.argv[0]).name or 'python'} (process {os.getpid()})")  # whom a refused command names
    f.flush()
    _CLAIMED.append((folder, lock, f, made))
    remove_leftovers(folder)
    return folder


def release_outputs(folder=None):
    """Release this process's output locks (of folder, or all) and the folders made for no outputs. A lock
    inside its folder goes (the folder holds outputs only); a run folder's, beside it, stays."""
    for item in [c for c in _CLAIMED if folder is None or c[0] == Path(folder)]:
        _CLAIMED.remove(item)
        claimed, lock, f, made = item
        if lock.parent == claimed:  # before the lock goes: one who opened it meanwhile is refused
            lock.unlink(missing_ok=True)
        f.close()
        with suppress(OSError):
            for p in made:
                p.rmdir()  # only if empty


atexit.register(release_outputs)
os.register_at_fork(after_in_child=_CLAIMED.clear)  # a forked worker holds no claim of its own to release


def remove_leftovers(folder):  # atomic's temporary files whose writer ended (a kill -9)
    for tmp in Path(folder).glob(".*.*.tmp"):
        if (pid := tmp.name.split(".")[-2]).isdecimal():
            try:
                os.kill(int(pid), 0)  # signal 0: delivered to nobody, only checked
            except ProcessLookupError:
                with suppress(OSError):  # gone already, a folder, or a read-only folder
                    tmp.unlink()
            except PermissionError:  # another user's process, running
                pass


@contextmanager
def atomic(path):
    """A temp file beside path, synced and renamed over it at the end: a crash leaves the old or the new."""
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
    with atomic(path) as f:
        write(f)


def digest_id(f):  # of an open file, from where it is: the first 16 hex digits of its sha256
    return hashlib.file_digest(f, "sha256").hexdigest()[:16]


def file_sha256(path):
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
