"""The run folder: one training at a time (an operating-system lock that dies with its process);
--overwrite=True moving the old run aside whole, settled from whole folders after a kill; kept checkpoints
never written again; the training options a resume or a schedule could get wrong refused in one line."""
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import runfolder
import train
from common import open_locked
from config import load_config
from eval import extrapolate
from test_promises import error
from test_safety import log_iters, one_line
from test_train import args, run_main, weights

ROOT = Path(__file__).resolve().parents[1]


def lock_of(run):
    return run.with_name(f".{run.name}.lock")


def tree(folder):
    """Every file under folder, by its path relative to it, with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in Path(folder).rglob("*") if p.is_file()}


def kept_run(dataset, run):
    """A run at iter 10 with a kept checkpoint at 5 and a wandb run file, as an --overwrite=True finds it."""
    train.main(args(dataset, run, max_iters=10, eval_interval=5, keep_iters="(5,)"))
    (run / "wandb.json").write_text('{"id": "abc"}')
    return tree(run)


# ----------------------------------------------------------------------------- one training at a time

def test_a_lock_held_by_another_process_refuses_and_goes_with_it_when_killed(dataset, tmp_path):
    run = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from common import claim_output
        claim_output({str(run)!r}, "train", lock={str(lock_of(run))!r})
        print("held", flush=True)
        time.sleep(120)""")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        message = one_line(run_main(args(dataset, run)), f"in use by -c (process {holder.pid})",
                           str(lock_of(run)), "one training per out_dir")
        assert "delete" not in message and not (run / "ckpt.pt").exists()
    finally:
        holder.kill()  # kill -9: its lock file stays, its lock goes
        holder.wait()
    assert lock_of(run).exists()
    train.main(args(dataset, run))
    assert weights(run)["iter_num"] == 10 and lock_of(run).exists()  # the lock goes, its file is never removed


# ----------------------------------------------------------------------------- overwrite, whole folders

def test_an_overwrite_killed_after_the_move_brings_the_old_run_back_whole(dataset, tmp_path):
    run = tmp_path / "run"
    before = kept_run(dataset, run)
    run.rename(runfolder.replaced(run))  # killed right after the move
    message = one_line(error("extrapolate.py", extrapolate.main, [str(run), "--device", "cpu"]), "waits in",
                       str(runfolder.replaced(run)), f"--out_dir={run}")
    assert "train one first" not in message
    one_line(run_main(args(dataset, run, max_iters=10)), "already holds a run")  # any training puts it back
    assert tree(run) == before and not runfolder.replaced(run).exists()


def test_an_overwrite_killed_while_restoring_brings_the_old_run_back_whole(dataset, tmp_path):
    run = tmp_path / "run"
    before = kept_run(dataset, run)
    run.rename(runfolder.replaced(run))
    run.mkdir()  # the new run, stopped before its first checkpoint, half removed by a restore that was killed
    (run / "log.jsonl").write_text('{"iter": 0, "train": 9.0, "val": 9.0}\n')
    train.main(args(dataset, run, max_iters=15, eval_interval=5, keep_iters="(5,)", init_from="resume"))
    assert weights(run)["iter_num"] == 15 and log_iters(run) == [0, 5, 10, 15]
    after = tree(run)
    assert after["wandb.json"] == before["wandb.json"] and not runfolder.replaced(run).exists()
    assert {k for k in after if "iter_5" in k} == {"iter_5/ckpt.pt", "iter_5/log.jsonl"}
    assert all(after[k] == before[k] for k in after if "iter_5" in k)


def test_an_overwrite_killed_after_its_first_checkpoint_keeps_the_new_run(dataset, tmp_path):
    run = tmp_path / "run"
    kept_run(dataset, run)
    train.main(args(dataset, run, max_iters=10, eval_interval=5, keep_iters="(5,)", overwrite=True))
    shutil.copytree(run, runfolder.replaced(run))  # the new run has its checkpoint; the old one half removed
    (runfolder.replaced(run) / "iter_5" / "ckpt.pt").unlink()
    new = tree(run)
    one_line(run_main(args(dataset, run, max_iters=10)), "already holds a run")
    assert tree(run) == new and runfolder.replaced(run).exists()  # a refused command removes nothing
    train.main(args(dataset, run, max_iters=15, eval_interval=5, keep_iters="(5,)", init_from="resume"))
    assert weights(run)["iter_num"] == 15 and not runfolder.replaced(run).exists()  # one that writes settles it


def test_a_checkpoint_that_is_not_the_overwrites_new_run_never_replaces_the_run_that_waits(dataset, tmp_path):
    run, other = tmp_path / "run", tmp_path / "other"
    before = kept_run(dataset, run)
    run.rename(runfolder.replaced(run))  # an --overwrite=True killed before its first checkpoint
    run.mkdir()
    train.main(args(dataset, other, max_iters=2, eval_interval=2))
    shutil.copy(other / "ckpt.pt", run / "ckpt.pt")  # then a checkpoint put there otherwise (by hand, say)
    one_line(run_main(args(dataset, run)), "is not the first checkpoint of the --overwrite=True", "move one of the two")
    assert tree(runfolder.replaced(run)) == before and tree(run) == {"ckpt.pt": (other / "ckpt.pt").read_bytes()}


def test_an_overwrite_never_removes_a_kept_checkpoint_being_trained_in(dataset, tmp_path):
    run = tmp_path / "run"
    before = kept_run(dataset, run)
    with open_locked(run / ".iter_5.lock") as lock:  # a training resumed in run/iter_5
        lock.write("train.py (process 4242)")
        lock.flush()
        one_line(run_main(args(dataset, run, overwrite=True)), "--overwrite=True would remove it",
                 f"{run / 'iter_5'} is in use by train.py (process 4242)")
        assert {k: v for k, v in tree(run).items() if k != ".iter_5.lock"} == before
    assert not runfolder.replaced(run).exists()


def test_an_overwrite_of_a_folder_holding_other_runs_is_refused(dataset, tmp_path):
    study = tmp_path / "study"
    train.main(args(dataset, study, max_iters=2, eval_interval=2))
    shutil.copytree(study, study / "rope_seed0", ignore=shutil.ignore_patterns("rope_seed0"))
    before = tree(study)
    one_line(run_main(args(dataset, study, overwrite=True)), "holds folders besides its run's (rope_seed0)",
             "a folder of its own")
    assert tree(study) == before


# ----------------------------------------------------------------------------- kept checkpoints

def test_a_kept_checkpoint_is_never_written_again(dataset, tmp_path, capsys):
    run = tmp_path / "run"
    train.main(args(dataset, run, max_iters=20, eval_interval=10, keep_iters="(20,)"))
    train.main(args(dataset, run / "iter_20", max_iters=40, eval_interval=10, init_from="resume"))  # in place
    continued = tree(run / "iter_20")
    train.main(args(dataset, run, max_iters=30, eval_interval=10, keep_iters="(20,)", init_from="resume"))
    assert "iter_20 is kept already" in capsys.readouterr().out
    assert tree(run / "iter_20") == continued and weights(run / "iter_20")["iter_num"] == 40
    assert log_iters(run / "iter_20") == [0, 10, 20, 30, 40] and weights(run)["iter_num"] == 30


def test_a_kept_checkpoint_is_built_aside_and_renamed_whole(dataset, tmp_path):
    train.main(args(dataset, tmp_path, max_iters=10))
    half = tmp_path / ".iter_20.tmp"  # a copy cut by kill -9
    half.mkdir()
    (half / "ckpt.pt").write_bytes(b"cut")
    train.main(args(dataset, tmp_path, max_iters=20, keep_iters="(20,)", init_from="resume"))
    assert weights(tmp_path / "iter_20")["iter_num"] == 20 and log_iters(tmp_path / "iter_20") == [0, 10, 20]
    assert not half.exists()


def test_a_file_named_like_a_kept_checkpoint_is_one_line(dataset, tmp_path):
    (tmp_path / "iter_10").write_text("my notes")
    one_line(run_main(args(dataset, tmp_path, keep_iters="(10,)")), f"{tmp_path / 'iter_10'} is a file",
             "keep_iters")
    assert (tmp_path / "iter_10").read_text() == "my notes" and not (tmp_path / "ckpt.pt").exists()


# ----------------------------------------------------------------------------- training options

def test_a_resume_that_cannot_continue_as_asked_is_one_line(dataset, tmp_path):
    train.main(args(dataset, tmp_path, max_iters=10))
    before = tree(tmp_path)
    both = args(dataset, tmp_path, max_iters=20, init_from="resume", overwrite=True)
    one_line(run_main(both), "give one of them")
    one_line(run_main(args(dataset, tmp_path, max_iters=5, init_from="resume")), "max_iters=5 is below",
             "(10)", "--max_iters=10 or more")
    assert tree(tmp_path) == before


def test_a_schedule_shorter_than_its_warmup_still_decays_and_a_decay_inside_the_warmup_is_refused():
    short = load_config([str(ROOT / "configs/rope_small.py"), "--max_iters=50", "--warmup_iters=100"])
    rates = [train.lr_at(it, short) for it in range(51)]
    assert max(rates) == rates[25] == short["learning_rate"] and rates[50] == pytest.approx(short["min_lr"])
    assert all(a > b for a, b in zip(rates[25:], rates[26:]))
    one_line(error("train.py", load_config, ["--lr_decay_iters=50", "--warmup_iters=100"]),
             "lr_decay_iters=50", "warmup_iters=100", "lr_decay_iters > 100")
    default = load_config([str(ROOT / "configs/rope_small.py")])  # unchanged where the warmup fits
    rate = default["learning_rate"]
    assert train.lr_at(99, default) == rate * 100 / 101 and train.lr_at(100, default) == rate


def test_train_help_lists_the_keys(capsys):
    train.main(["--help"])
    out = capsys.readouterr().out
    assert out.startswith("Train a small GPT") and "--max_iters=1500" in out and "--keep_iters=()" in out


def test_a_diverged_ddp_training_ends_every_process_with_one_line(dataset, tmp_path):
    script = tmp_path / "diverging.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        import train
        real = train.estimate_loss
        train.estimate_loss = lambda *a: {{**real(*a), "val": float("nan")}}
        train.main(sys.argv[1:])"""))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script),
           *args(dataset, tmp_path / "run")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode != 0
    assert proc.stderr.count("train.py: error: the loss is not finite at iter 0") == 2, proc.stderr[-3000:]
    assert "gloo" not in proc.stderr.lower(), proc.stderr[-3000:]  # no rank left waiting in an all-reduce
    assert not (tmp_path / "run" / "ckpt.pt").exists()
