"""train.py: configs, a real (tiny) run, exact resume, DDP, and every bad input as a one-line error."""
import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import train
from common import open_locked
from eval.reading import weights_id
from model import GPT, GPTConfig
from runtime import model_from_checkpoint

ROOT = Path(__file__).resolve().parents[1]


def args(dataset, out_dir, **kw):
    cfg = dict(dataset=dataset, out_dir=str(out_dir), batch_size=4, block_size=32, n_layer=1, n_head=2, n_embd=32,
               max_iters=10, lr_decay_iters=20, warmup_iters=2, eval_interval=10, eval_iters=2, log_interval=5,
               wandb_log=False, device="cpu")
    return [f"--{k}={v}" for k, v in {**cfg, **kw}.items()]


def run_main(argv):
    with pytest.raises(SystemExit) as e:
        train.main(argv)
    return str(e.value)


def weights(out_dir):
    return torch.load(Path(out_dir) / "ckpt.pt", weights_only=True)


def test_config_file_and_overrides(tmp_path):
    cfg = tmp_path / "c.py"
    cfg.write_text("pos_emb = 'learned'\nn_layer = 2\nlearning_rate = 1\n")
    config = train.load_config([str(cfg), "--n_layer=3", "--device=cpu", "--pos_emb=rope",
                                "--rope_scaling={'rope_type': 'linear', 'factor': 2}"])
    assert (config["pos_emb"], config["n_layer"], config["device"]) == ("rope", 3, "cpu")
    assert config["learning_rate"] == 1.0 and isinstance(config["learning_rate"], float)
    assert config["rope_scaling"] == {"rope_type": "linear", "factor": 2}
    assert config["wandb_run_name"] == "default"


def test_the_learning_rate_decays_to_min_lr_by_max_iters_unless_lr_decay_iters_is_given():
    short = train.load_config([str(ROOT / "configs/rope_small.py"), "--max_iters=300"])
    assert short["lr_decay_iters"] == 300 and train.lr_at(300, short) == pytest.approx(short["min_lr"])
    assert train.lr_at(150, short) > train.lr_at(250, short) > short["min_lr"]  # a cosine over the run's own length
    given = train.load_config([str(ROOT / "configs/rope_small.py"), "--max_iters=300", "--lr_decay_iters=1500"])
    assert given["lr_decay_iters"] == 1500 and train.lr_at(300, given) > 0.9 * given["learning_rate"]  # as asked
    assert train.load_config([str(ROOT / "configs/rope_small_pi4x.py"), "--max_iters=600"])["lr_decay_iters"] == 300  # the file's


@pytest.mark.parametrize("content, argv, message", [
    ("n_layers = 4\n", [], "unknown config key 'n_layers'"),
    ("", ["--batchsize=4"], "unknown config key 'batchsize'"),
    ("", ["--n_layer=2.5"], "n_layer=2.5 (from --n_layer=2.5) should be a int"),
    ("", ["--compile=1"], "compile=1 (from --compile=1) should be a bool"),
    ("", ["--keep_iters=(10, -1)"], "keep_iters=(10, -1) (from --keep_iters=(10, -1)) should be iterations"),
    ("", ["--keep_iters=(10, 3000)"], "keep_iters [3000] come after max_iters=1500"),
    ("pos_emb = 'xpos'\n", [], "unknown pos_emb 'xpos'; allowed: learned, sinusoidal, rope, alibi, none"),
    ("", ["--rope_scaling=yarn"], "rope_scaling must be a dict"),
    ("n_layer = = 2\n", [], "c.py failed: SyntaxError"),
    ("import nonexistent_module\n", [], "c.py failed: ModuleNotFoundError"),
    ("", ["--max_iters=-5"], "max_iters=-5 (from --max_iters=-5) must be >= 1"),
    ("", ["--eval_interval=0"], "eval_interval=0 (from --eval_interval=0) must be >= 1"),
    ("", ["--n_layer=0"], "n_layer=0: model sizes must be >= 1"),
    ("", ["--device=tpu"], "device='tpu' is not one of: auto, cpu, cuda, cuda:N, mps"),
    ("", ["--n_layer"], "expected --key=value, got '--n_layer'"),
    ("", ["--pos_emb=alibi", "--nope_every=2"], "nope_every=2 sets the layers of a RoPE model"),
    ("", ["--rope_window=0"], "rope_window must be an integer >= 1 (or None), got 0"),
])
def test_bad_config_is_a_one_line_error(tmp_path, content, argv, message):
    cfg = tmp_path / "c.py"
    cfg.write_text(content)
    error = run_main([str(cfg), *argv])
    assert message in error and "\n" not in error


def test_missing_config_file_and_missing_data_are_clear(tmp_path):
    assert "config file nope.py not found" in run_main(["nope.py"])
    error = run_main(args(str(tmp_path / "nodata"), tmp_path / "out"))
    assert "no prepared data" in error and "prepare.py" in error


def test_training_lowers_the_loss_and_writes_a_checkpoint(dataset, tmp_path, capsys):
    train.main(args(dataset, tmp_path, max_iters=40, eval_interval=40, learning_rate=3e-3, lr_decay_iters=40))
    out = capsys.readouterr().out
    first, last = (float(line.split("val loss ")[1]) for line in out.splitlines() if "val loss" in line)
    assert last < first - 1.0
    ckpt = weights(tmp_path)
    assert ckpt["iter_num"] == 40 and ckpt["model_args"]["vocab_size"] == 512 and ckpt["best_val_loss"] == pytest.approx(last, abs=1e-4)
    assert not list(tmp_path.glob("*.tmp"))


def test_resume_continues_exactly_where_it_stopped(dataset, tmp_path, capsys):
    straight, split = tmp_path / "straight", tmp_path / "split"
    train.main(args(dataset, straight, max_iters=20))
    train.main(args(dataset, split, max_iters=10))
    train.main(args(dataset, split, max_iters=20, init_from="resume"))
    assert "resuming from" in capsys.readouterr().out
    a, b = weights(straight), weights(split)
    assert b["iter_num"] == 20
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


def test_kept_checkpoints_are_runs_of_their_own(dataset, tmp_path, capsys):
    run = tmp_path / "run"
    train.main(args(dataset, run, max_iters=20, keep_iters="(0, 5, 20)"))
    assert sorted(p.name for p in run.glob("iter_*")) == ["iter_0", "iter_20", "iter_5"]
    at5 = weights(run / "iter_5")
    assert at5["iter_num"] == 5 and [e for e in (run / "iter_5/log.jsonl").read_text().splitlines()][-1].startswith('{"iter": 5')
    assert weights(run / "iter_0")["iter_num"] == 0 and not (run / "iter_0" / "wandb.json").exists()
    end = weights(run)
    assert all(torch.equal(end["model"][k], weights(run / "iter_20")["model"][k]) for k in end["model"])
    train.main(args(dataset, run / "iter_5", max_iters=20, keep_iters="(0, 5, 20)", init_from="resume"))  # resumed there
    again = weights(run / "iter_5")
    assert again["iter_num"] == 20 and all(torch.equal(end["model"][k], again["model"][k]) for k in end["model"])
    message = run_main(args(dataset, run, max_iters=3, overwrite=True))  # iter_5 is a run of its own now
    assert "iter_5 was trained on to iter 20" in message and weights(run / "iter_5")["iter_num"] == 20
    for lock in run.glob(".*.lock"):  # released, each (a lock file stays)
        assert (held := open_locked(lock)) is not None
        held.close()
    (run / "iter_5").rename(tmp_path / "continued")
    train.main(args(dataset, run, max_iters=3, overwrite=True))  # a replaced run's kept checkpoints go with it
    assert not list(run.glob("iter_*")) and weights(tmp_path / "continued")["iter_num"] == 20


def test_resume_rejects_a_mismatched_or_corrupted_checkpoint(dataset, tmp_path):
    train.main(args(dataset, tmp_path, max_iters=10))
    error = run_main(args(dataset, tmp_path, init_from="resume", n_layer=2))
    assert "does not match this run: n_layer=1 (config: 2)" in error
    (tmp_path / "ckpt.pt").write_bytes(b"not a checkpoint")
    assert "is corrupted or not a ropelab checkpoint" in run_main(args(dataset, tmp_path, init_from="resume"))
    assert "no checkpoint at" in run_main(args(dataset, tmp_path / "empty", init_from="resume"))


def test_fine_tune_starts_from_a_run_at_a_longer_length(dataset, tmp_path, capsys):
    base, tuned, again = tmp_path / "base", tmp_path / "tuned", tmp_path / "again"
    train.main(args(dataset, base, max_iters=10))
    pi = {"rope_type": "linear", "factor": 2.0}
    # learning rate 0: the fine-tune's weights are exactly the run it starts from, at twice the length with PI
    train.main(args(dataset, tuned, init_from=str(base), block_size=64, rope_scaling=pi, max_iters=2,
                    learning_rate=0, min_lr=0, eval_interval=2))
    assert "fine-tuning from" in capsys.readouterr().out
    a, b = weights(base), weights(tuned)
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert b["iter_num"] == 2 and b["model_args"]["block_size"] == 64 and b["model_args"]["rope_scaling"] == pi
    assert b["origin"] == dict(init_from=str(base), iter_num=10, train_len=32, pos_emb="rope",
                               weights_id=weights_id(base))  # the source's weights, which a study compares
    assert b["optimizer"]["state"][0]["step"] == 2  # a fresh optimizer: only the fine-tune's own steps
    # a fine-tune of a fine-tune keeps the first run's length
    train.main(args(dataset, again, init_from=str(tuned / "ckpt.pt"), block_size=128, max_iters=1, eval_interval=1))
    assert weights(again)["origin"]["train_len"] == 32


def test_fine_tune_bad_input_is_one_line(dataset, tmp_path):
    base = tmp_path / "base"
    train.main(args(dataset, base, max_iters=10))
    assert "no checkpoint at" in run_main(args(dataset, tmp_path / "t", init_from=str(tmp_path / "nope")))
    error = run_main(args(dataset, tmp_path / "t", init_from=str(base), n_layer=2))
    assert "does not match this run (n_layer=1 (config: 2))" in error and "may change only block_size" in error
    ckpt = weights(base)
    ckpt["model_args"]["vocab_size"] = 1000
    torch.save(ckpt, tmp_path / "other_vocab.pt")
    assert "vocab_size=1000 (data/" in run_main(args(dataset, tmp_path / "t", init_from=str(tmp_path / "other_vocab.pt")))
    learned = tmp_path / "learned"
    train.main(args(dataset, learned, max_iters=10, pos_emb="learned"))
    error = run_main(args(dataset, tmp_path / "t", init_from=str(learned), pos_emb="learned", block_size=64))
    assert "a learned table cannot change size" in error
    assert not (tmp_path / "t" / "ckpt.pt").exists()


def test_drope_fine_tunes_a_rope_run_with_its_rotation_dropped(dataset, tmp_path, capsys, monkeypatch):
    base, tuned = tmp_path / "base", tmp_path / "drope"
    train.main(args(dataset, base, max_iters=10))
    capsys.readouterr()
    loaded = []  # the fine-tune's model as train.py loads it, before any step

    def load(ckpt, config):
        model = model_from_checkpoint(ckpt, config)
        loaded.append(copy.deepcopy(model))
        return model
    monkeypatch.setattr(train, "model_from_checkpoint", load)
    train.main(args(dataset, tuned, init_from=str(base), pos_emb="none", max_iters=30, eval_interval=30,
                    learning_rate=3e-3, lr_decay_iters=30))
    out = capsys.readouterr().out
    assert "pos_emb rope -> none (DroPE: the rotation dropped)" in out
    first, last = (float(line.split("val loss ")[1]) for line in out.splitlines() if "val loss" in line)
    assert last < first  # it trains
    # as loaded it is a NoPE GPT with the RoPE run's weights, built here on its own
    ckpt = weights(base)
    nope = GPT(GPTConfig(**{**ckpt["model_args"], "pos_emb": "none"})).eval()
    nope.load_state_dict(ckpt["model"])
    idx = torch.randint(0, 512, (2, 32))
    with torch.no_grad():
        logits = loaded[0].eval()(idx)[0]
        assert torch.allclose(logits, nope(idx)[0], atol=1e-6)
        assert not torch.allclose(logits, model_from_checkpoint(ckpt).eval()(idx)[0], atol=1e-6)  # the rotation is gone
    tuned_ckpt = weights(tuned)
    assert tuned_ckpt["model_args"]["pos_emb"] == "none" and tuned_ckpt["iter_num"] == 30
    assert tuned_ckpt["origin"] == dict(init_from=str(base), iter_num=10, train_len=32, pos_emb="rope",
                                        weights_id=weights_id(base))


def test_a_fine_tune_changes_pos_emb_only_from_rope_to_none(dataset, tmp_path):
    rope, nope, prope = tmp_path / "rope", tmp_path / "nope", tmp_path / "prope"
    train.main(args(dataset, rope, max_iters=1, eval_interval=1))
    train.main(args(dataset, nope, max_iters=1, eval_interval=1, pos_emb="none"))
    for base, pos_emb, was in ((rope, "alibi", "rope"), (rope, "learned", "rope"), (nope, "rope", "none")):
        error = run_main(args(dataset, tmp_path / "t", init_from=str(base), pos_emb=pos_emb))
        assert f"pos_emb='{was}' (config: '{pos_emb}')" in error and "pos_emb from 'rope' to 'none' (DroPE)" in error
        assert "\n" not in error
    assert not (tmp_path / "t" / "ckpt.pt").exists()
    # a checkpoint from before ssmax, nope_every and rope_window existed was trained as their defaults
    ckpt = weights(rope)
    for key in ("ssmax", "nope_every", "rope_window"):
        del ckpt["model_args"][key]
    torch.save(ckpt, tmp_path / "older.pt")
    train.main(args(dataset, tmp_path / "o", init_from=str(tmp_path / "older.pt"), pos_emb="none", max_iters=1, eval_interval=1))
    # p-RoPE's fraction describes the rotation that is dropped
    train.main(args(dataset, prope, max_iters=1, eval_interval=1, rope_fraction=0.5))
    train.main(args(dataset, tmp_path / "t", init_from=str(prope), pos_emb="none", max_iters=1, eval_interval=1))
    assert weights(tmp_path / "t")["model_args"]["rope_fraction"] is None


def test_bad_model_option_is_a_one_line_error(dataset, tmp_path):
    assert "RoPE needs an even head dimension" in run_main(args(dataset, tmp_path, n_embd=30, n_head=2))
    error = run_main(args(dataset, tmp_path, rope_scaling="{'rope_type': 'ntk', 'factor': 0.5}"))
    assert "factor must be a number >= 1, got 0.5" in error


def test_cli_exits_nonzero_with_one_line(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), "--n_layers=2"], capture_output=True, text=True)
    assert proc.returncode != 0
    assert proc.stderr.strip() == ("train.py: error: unknown config key 'n_layers' (from --n_layers=2); the keys are "
                                   "DEFAULTS in config.py and GPTConfig's fields in model.py")


def test_a_failed_corpus_download_is_one_line(tmp_path, monkeypatch):
    import data.shakespeare.prepare as shakespeare
    import data.writer as writer
    import runtime
    monkeypatch.setattr(runtime, "data_dir", lambda dataset: tmp_path)  # no prepared data here
    monkeypatch.setattr(shakespeare, "is_prepared", lambda *a, **kw: False)
    monkeypatch.setattr(shakespeare.download, "__defaults__", (tmp_path,))  # an empty download cache
    monkeypatch.setattr(writer.subprocess, "run", lambda cmd: subprocess.CompletedProcess(cmd, 1))  # pip offline
    error = run_main(["--device=cpu", "--wandb_log=False", f"--out_dir={tmp_path / 'out'}"])
    assert error.startswith("train.py: error: `") and "failed (exit 1)" in error and "\n" not in error


def test_ddp_with_two_cpu_processes(dataset, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(ROOT / "train.py"), *args(dataset, tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "256 tokens/iter, device cpu, float32, 2 process(es)" in proc.stdout  # 2 x batch 4 x 32
    assert weights(tmp_path)["iter_num"] == 10


def test_wandb_without_login_logs_offline_and_never_prompts(dataset, tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc, so no login
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    train.main(args(dataset, tmp_path / "out", wandb_log=True, wandb_run_name="w"))
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))


def test_bench_prints_throughput_and_memory():
    cmd = [sys.executable, str(ROOT / "bench.py"), "--n_layer=1", "--block_size=32", "--batch_size=2", "--steps=2", "--vocab_size=300"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "tokens/s" in proc.stdout and "peak memory" in proc.stdout and "vocab 300, batch 2x32" in proc.stdout


def test_bench_beside_nanogpt_times_three_models_and_names_a_bad_checkout(tmp_path):
    # a stand-in for a nanoGPT checkout: its model.py's GPT and GPTConfig (with nanoGPT's bias key)
    (tmp_path / "model.py").write_text(
        "import sys\nsys.path.insert(0, %r)\nimport model as ours\n"
        "def GPTConfig(bias, **shape):\n    return ours.GPTConfig(**shape, pos_emb='learned')\nGPT = ours.GPT\n" % str(ROOT))
    cmd = [sys.executable, str(ROOT / "bench.py"), f"--nanogpt={tmp_path}", "--steps=1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stdout.splitlines() if "ms/step" in line]
    assert [r.split()[0] for r in rows] == ["nanoGPT", "ours,", "ours,"] and rows[0].endswith("1.000x nanoGPT")
    bad = subprocess.run(cmd[:2] + [f"--nanogpt={tmp_path / 'nowhere'}"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1 and "no model.py there" in bad.stderr
    # as whole processes it needs nanoGPT's train.py and configurator.py too, named before any training runs
    whole = subprocess.run(cmd[:3] + ["--processes"], capture_output=True, text=True, timeout=60)
    assert whole.returncode == 1 and "no train.py, configurator.py there" in whole.stderr, whole.stderr


CONFIG_DIRS = (Path(train.__file__).parent / "configs", Path(train.__file__).parent / "lab" / "configs")
CONFIGS = sorted(p for folder in CONFIG_DIRS for p in folder.glob("*.py"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_every_config_loads_and_a_fine_tune_matches_the_run_it_starts_from(path):
    from config import DROPE_KEYS, FINETUNE_KEYS, MODEL_KEYS, model_config
    config = train.load_config([str(path)])
    model_config(config, vocab_size=257 if config["dataset"] == "shakespeare_bytes" else 2048)
    assert Path(config["out_dir"]).name == path.stem  # its output folder is named after it
    if config["init_from"] not in ("scratch", "resume"):  # out/X is configs/X.py's run: the model keys must agree
        origin_path, = [d / f"{Path(config['init_from']).name}.py" for d in CONFIG_DIRS if (d / f"{Path(config['init_from']).name}.py").exists()]
        origin = train.load_config([str(origin_path)])
        free = FINETUNE_KEYS + (DROPE_KEYS if config["pos_emb"] == "none" else ())
        assert {k: config[k] for k in MODEL_KEYS if k not in free} == {k: origin[k] for k in MODEL_KEYS if k not in free}
        assert config["dataset"] == origin["dataset"] and config["block_size"] >= origin["block_size"]
