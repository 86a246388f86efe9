"""The core's contracts: a user error is one line and a bug keeps its traceback; throughput and MFU count every
process; a fine-tune never deletes the run it starts from; the core imports no lab module."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import train
from common import UserError, command_parser, run_cli
from test_train import args, run_main, weights

ROOT = Path(__file__).resolve().parents[1]


def test_a_user_error_is_one_line_and_a_bug_keeps_its_traceback():
    def bad_input():
        raise UserError("--lengths must be positive, got -1")
    with pytest.raises(SystemExit, match="^x.py: error: --lengths must be positive, got -1$"):
        run_cli("x.py", bad_input)
    with pytest.raises(SystemExit, match="^x.py: error: unrecognized arguments: --nope$"):
        run_cli("x.py", lambda: command_parser("doc").parse_args(["--nope"]))
    with pytest.raises(ValueError, match="broadcast"):  # numpy's shape error is a bug: not turned into one line
        run_cli("x.py", lambda: np.ones(3) + np.ones(4))


def test_mfu_divides_by_the_peak_of_every_process():
    # two processes, each at its device's peak: 2 x 100 tokens/s x 10 FLOP/token = 2 x 1000 FLOP/s
    tok_s, flops, mfu = train.throughput(tokens=200, seconds=1.0, flops_per_token=10, peak=1000.0, world=2)
    assert (tok_s, flops, mfu) == (200.0, 2000.0, 1.0)
    assert train.throughput(100, 1.0, 10, None, 1)[2] is None  # an unknown device: no MFU


def test_tokens_per_second_counts_the_iterations_since_the_last_evaluation(dataset, tmp_path, monkeypatch):
    counted = []
    monkeypatch.setattr(train, "throughput", lambda tokens, *rest: counted.append(tokens) or (1.0, 1.0, None))
    # evaluations (which restart the clock) at 0, 3, 6; logs at 2, 4, 6: 2, 1 and 2 iterations timed
    train.main(args(dataset, tmp_path, max_iters=6, eval_interval=3, log_interval=2))
    assert counted == [4 * 32 * n for n in (2, 1, 2)]  # batch_size 4 x block_size 32 tokens per iteration


def test_a_fine_tune_with_overwrite_into_its_own_run_is_refused(dataset, tmp_path):
    train.main(args(dataset, tmp_path, max_iters=4, eval_interval=4))
    before = (tmp_path / "ckpt.pt").read_bytes()
    for init_from in (tmp_path, tmp_path / "ckpt.pt"):
        error = run_main(args(dataset, tmp_path, init_from=str(init_from), overwrite=True, block_size=64))
        assert "\n" not in error and "is out_dir's own checkpoint" in error and "another --out_dir" in error, error
    assert (tmp_path / "ckpt.pt").read_bytes() == before and weights(tmp_path)["iter_num"] == 4


def test_the_core_imports_no_lab_module():
    # what the quick start and sample.py load, in a fresh interpreter
    code = ("import sys, train, sample, bench, eval.extrapolate, eval.compare; "
            "print(sorted(m for m in sys.modules if m == 'lab' or m.startswith('lab.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]"


def test_the_training_path_imports_nothing_from_eval():
    code = "import sys, train; print(sorted(m for m in sys.modules if m == 'eval' or m.startswith('eval.')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]"


def test_rope_tables_are_built_once_per_scaling_and_device_with_the_same_numbers(monkeypatch):
    import rope as rope_module
    from model import GPT, GPTConfig
    from positions import PositionArgs
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(block_size=16, vocab_size=64, n_layer=1, n_head=2, n_embd=16)).eval()
    idx = torch.randint(0, 64, (2, 48))
    yarn = {"rope_type": "yarn", "factor": 3.0}
    def fresh(n, scaling):  # tables built for this forward alone
        gpt.rope_cache.clear()
        return gpt(idx[:, :n], method=PositionArgs(rope_scaling=scaling))[0]
    with torch.no_grad():
        fresh = [fresh(n, s) for s in (None, yarn) for n in (48, 20)]
    builds = []
    real = rope_module.rope_frequencies
    monkeypatch.setattr(rope_module, "rope_frequencies", lambda *a: builds.append(a) or real(*a))
    gpt.rope_cache.clear()
    with torch.no_grad():
        cached = [gpt(idx[:, :n], method=PositionArgs(rope_scaling=s))[0] for s in (None, yarn) for n in (48, 20, 48)]
    assert len(builds) == 2  # one per scaling: a shorter forward reads the first rows of the longer one's tables
    for a, b in zip(fresh, [c for i, c in enumerate(cached) if i % 3 != 2]):
        assert torch.equal(a, b)
    gpt(idx[:, :20], method=PositionArgs(rope_scaling={"rope_type": "dynamic", "factor": 1.0}))
    gpt(idx[:, :30], method=PositionArgs(rope_scaling={"rope_type": "dynamic", "factor": 1.0}))
    assert len(builds) == 4  # dynamic NTK's frequencies follow the length: one set per length


def test_the_repository_is_installed_and_no_script_edits_sys_path(tmp_path):
    # the README's set-up command installs it editable (requirements.txt's -e .): scripts import the core by name
    assert "-e ." in (ROOT / "requirements.txt").read_text().splitlines()
    assert not [p for p in ROOT.rglob("*.py") if "sys.path.insert" in p.read_text() and "tests" not in p.parts]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    for script in ("eval/extrapolate.py", "eval/compare.py", "lab/study.py", "data/text/prepare.py"):
        out = subprocess.run([sys.executable, str(ROOT / script), "--help"], capture_output=True, text=True,
                             cwd=tmp_path, env=env)
        assert out.returncode == 0 and "usage:" in out.stdout, (script, out.stderr[-300:])


def test_a_config_builds_on_another_by_importing_it_and_states_only_what_differs():
    from config import load_config
    copier, base100 = load_config(["lab/configs/retrieval_small.py"]), load_config(["lab/configs/retrieval_base100.py"])
    differ = {k: v for k, v in base100.items() if copier[k] != v}
    assert differ == dict(out_dir="out/retrieval_base100", wandb_run_name="retrieval_base100", rope_base=100.0)
