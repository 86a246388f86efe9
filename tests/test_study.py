"""eval/study.py: the statistics against numbers worked out by hand, and the runner end to end on a tiny corpus."""
import json
import math

import pytest

from eval import study

# t quantile 0.975 with 2 degrees of freedom, from a printed t table: t = sqrt(2) * 3.0424... = 4.302653
T_975_DF2 = 4.302653


def test_interval_of_three_seeds_is_the_t_interval():
    s = study.interval([1.0, 2.0, 3.0])  # mean 2, sample std 1
    half = T_975_DF2 * 1.0 / math.sqrt(3)  # 2.484138
    assert s["n"] == 3 and s["mean"] == pytest.approx(2.0)
    assert (s["lo"], s["hi"]) == pytest.approx((2.0 - half, 2.0 + half), rel=1e-6)
    assert study.interval([5.0]) == dict(n=1, mean=5.0, lo=None, hi=None)  # one seed: no interval
    assert study.interval([None, None]) is None  # not available in any seed


def fake_report(loss_none, loss_yarn):
    entry = dict(protocol="windows", mode=None, eval_len=64, loss_beyond_train=None, diff_crop=None)
    return dict(train_len=32, results=[dict(entry, method="none", loss=loss_none, diff_none=None),
                                       dict(entry, method="yarn", loss=loss_yarn, diff_none=loss_yarn - loss_none)])


def test_aggregate_gives_mean_interval_and_paired_differences_across_seeds():
    reports = {"rope_small": [fake_report(4.0, 3.5), fake_report(4.2, 3.6), fake_report(4.4, 3.7)]}
    rows = {r["method"]: r for r in study.aggregate(reports)}
    assert rows["none"]["loss"]["mean"] == pytest.approx(4.2)
    half = T_975_DF2 * 0.2 / math.sqrt(3)  # std of 4.0, 4.2, 4.4 is 0.2
    assert rows["none"]["loss"]["hi"] == pytest.approx(4.2 + half, rel=1e-6)
    # paired: the differences -0.5, -0.6, -0.7 vary far less than the losses themselves
    diff = rows["yarn"]["diff_none"]
    assert diff["mean"] == pytest.approx(-0.6) and diff["hi"] - diff["lo"] == pytest.approx(2 * T_975_DF2 * 0.1 / math.sqrt(3), rel=1e-6)
    assert rows["yarn"]["per_seed"]["loss"] == [3.5, 3.6, 3.7] and rows["none"]["diff_none"] is None
    md = study.markdown(study.aggregate(reports), 3)
    assert "| rope_small | yarn |" in md and f"{math.exp(3.6):.1f} [" in md


def test_a_study_trains_evaluates_aggregates_and_resumes(dataset, tmp_path, capsys):
    cfg = tmp_path / "tiny_rope.py"
    cfg.write_text(f"dataset = {dataset!r}\nbatch_size = 4\nblock_size = 32\nn_layer = 1\nn_head = 2\nn_embd = 32\n"
                   "max_iters = 6\nlr_decay_iters = 6\nwarmup_iters = 1\neval_interval = 3\neval_iters = 1\n"
                   "log_interval = 3\nwandb_log = False\ndevice = 'cpu'\n")
    argv = [str(cfg), "--seeds", "2", "--out", str(tmp_path / "s"), "--wandb_log", "false",
            "--eval_args", "--lengths 1,2 --methods none,crop,yarn --tokens 128 --no-wandb"]
    result = study.main(argv)
    runs = [tmp_path / "s" / f"tiny_rope_seed{k}" for k in (0, 1)]
    assert all((r / "extrapolation.json").is_file() for r in runs)
    assert result["seeds"] == 2 and result["configs"] == ["tiny_rope"]
    row = next(r for r in result["rows"] if r["method"] == "yarn" and r["eval_len"] == 64 and r["protocol"] == "windows")
    assert row["loss"]["n"] == 2 and row["loss"]["lo"] < row["loss"]["mean"] < row["loss"]["hi"]
    assert len(set(row["per_seed"]["loss"])) == 2  # the seeds really differ
    assert json.loads((tmp_path / "s" / "study.json").read_text())["rows"] == json.loads(json.dumps(result["rows"]))
    assert (tmp_path / "s" / "study.png").stat().st_size > 10_000 and "crop" in (tmp_path / "s" / "study.md").read_text()
    capsys.readouterr()
    # resumed: nothing is redone but what is missing
    (runs[1] / "extrapolation.json").unlink()
    study.main(argv)
    out = capsys.readouterr().out
    assert "tiny_rope_seed0: trained and evaluated already" in out and "study: evaluate tiny_rope_seed1" in out
    assert "study: train" not in out
    # other evaluation options: every run is scored again, so that all seeds share the same windows
    study.main(argv[:-1] + ["--lengths 1 --methods none,crop --tokens 128 --no-wandb"])
    out = capsys.readouterr().out
    assert out.count("study: evaluate") == 2 and "study: train" not in out


def error_of(argv):
    with pytest.raises(SystemExit) as e:
        study.main(argv)
    message = str(e.value)
    assert message.startswith("study.py: error: ") and "\n" not in message
    return message


def test_bad_input_is_a_one_line_error(tmp_path):
    assert "config file configs/nope.py not found" in error_of(["configs/nope.py"])
    assert "--seeds must be >= 1, got 0" in error_of(["configs/rope_small.py", "--seeds", "0"])
    assert "--seeds 'two' is not an integer" in error_of(["configs/rope_small.py", "--seeds", "two"])


def test_the_figure_puts_three_configs_a_row(tmp_path):
    from matplotlib.image import imread
    rows = study.aggregate({f"config{i}": [fake_report(4.0, 3.5), fake_report(4.2, 3.6)] for i in range(4)})
    study.plot(rows, tmp_path / "study.png")
    # two rows of three configs, each config over two panels (5.5 x 8 inches at 100 dpi)
    assert imread(tmp_path / "study.png").shape[:2] == (1600, 1650)


def test_the_study_logs_to_wandb_offline_without_a_login(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    rows = study.aggregate({"rope_small": [fake_report(4.0, 3.5), fake_report(4.2, 3.6)]})
    study.plot(rows, tmp_path / "study.png")
    study.log_wandb(dict(configs=["rope_small"], seeds=2, rows=rows), tmp_path / "mystudy", tmp_path / "study.png",
                    study.markdown(rows, 2))
    import wandb
    wandb.teardown()  # wandb keeps process-wide settings (its dir) from the first init: leave none behind
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))
