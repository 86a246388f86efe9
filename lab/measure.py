"""A forward's time and peak memory, and work done in a forked process whose failure is the caller's: what the lab's
cost benchmarks (lab/read_cost.py, lab/hf_bench.py) share."""
import signal
import time
import traceback
from multiprocessing import get_context

import torch

from common import UserError, out_of_memory


def memory_kib_of(path, field):
    with open(path) as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def memory_kib(field):
    return memory_kib_of("/proc/self/status", field)


def measured(fn, device):
    """(seconds, peak MiB above the start) of fn()."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start, t0 = torch.cuda.memory_allocated(), time.perf_counter()
        fn()
        torch.cuda.synchronize()
        return time.perf_counter() - t0, (torch.cuda.max_memory_allocated() - start) / 2**20
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM, the peak resident set, to the current one
    start, t0 = memory_kib("VmRSS"), time.perf_counter()
    fn()
    return time.perf_counter() - t0, (memory_kib("VmHWM") - start) / 1024


def in_child(fn):
    """fn() in a forked process (on the CPU: one reading's freed memory is not the next one's peak). The child's
    failure is the parent's: a UserError as itself, running out of memory as a MemoryError, a bug with the child's
    traceback."""
    parent, child = get_context("fork").Pipe(duplex=False)

    def report():
        try:
            outcome = "done", fn()
        except Exception as e:  # every failure goes back to the parent, which decides
            kind = "user" if isinstance(e, UserError) else "memory" if out_of_memory(e) else "bug"
            outcome = kind, str(e) if kind != "bug" else traceback.format_exc()
        child.send(outcome)

    process = get_context("fork").Process(target=report)
    process.start()
    child.close()  # the parent's copy: a child that dies without a word closes the pipe, and recv raises EOFError
    try:
        kind, value = parent.recv()
    except EOFError:
        kind, value = "died", None
    process.join()
    if kind == "done":
        return value
    if kind == "user":
        raise UserError(value)
    if kind == "memory" or process.exitcode == -signal.SIGKILL:  # SIGKILL: most likely the kernel's OOM killer
        raise MemoryError(value or "the measuring process was killed (SIGKILL)")
    raise RuntimeError(f"the measuring process failed: {value or f'exit code {process.exitcode}'}")
