"""lab/study.py: the statistics against numbers worked out by hand, and the runner end to end on a tiny corpus."""
import json
import math
import os
import shlex
import subprocess
import sys

import numpy as np
import pytest
import torch

from lab import family, stats, study
from common import ROOT
from eval.reading import weights_id



def entry(method, eval_len=64, protocol="windows", **per_unit):
    """An extrapolation.json entry from its per-window values (a metric not given: None), its scalars their means."""
    per_unit = {m: None if per_unit.get(m) is None else list(per_unit[m]) for m in study.METRICS}
    return dict(protocol=protocol, method=method, mode=None, eval_len=eval_len, per_unit=per_unit,
                **{m: None if v is None else float(np.mean(v)) for m, v in per_unit.items()})


def fake_report(loss_none, loss_yarn, windows=(0.1, -0.1, 0.2, -0.2)):
    """One seed at 2x a training length of 32: none, yarn and crop (loss 3.8) on the same 4 windows."""
    none, yarn, crop = np.add(loss_none, windows), np.add(loss_yarn, np.multiply(windows, 0.5)), np.add(3.8, windows)
    return dict(run="fake", train_len=32, units={}, results=[
        entry("none", loss=none, diff_crop=none - crop), entry("yarn", loss=yarn, diff_none=yarn - none, diff_crop=yarn - crop),
        entry("crop", loss=crop)])


def test_aggregate_is_the_two_way_bootstrap_over_seeds_x_windows():
    rng = np.random.default_rng(0)
    loss = 4 + rng.normal(0, 0.3, (3, 8)) + rng.normal(0, 0.2, (3, 1))  # 3 seeds x 8 windows, a per-seed shift
    reports = {"rope_small": [dict(run=f"s{k}", train_len=32, results=[entry("yarn", loss=v, diff_crop=v - 4.1)])
                              for k, v in enumerate(loss)]}
    (row,) = study.aggregate(reports)
    # no documents recorded (fake reports): windows are resampled on their own, and the page says so
    assert row["loss"] == dict(stats.interval(loss), unit="window") and row["diff_crop"]["mean"] == pytest.approx(loss.mean() - 4.1)
    assert row["loss"]["mean"] == pytest.approx(loss.mean()) and (row["loss"]["seeds"], row["loss"]["units"]) == (3, 8)
    assert row["loss"]["lo"] < row["loss"]["mean"] < row["loss"]["hi"]
    assert row["per_seed"]["loss"] == pytest.approx(loss.mean(axis=1).tolist()) and row["diff_none"] is None
    md = study.markdown([row], 3)
    assert "### perplexity over all targets, windows protocol\n\nmean [95% bootstrap interval over 3 seeds x 8 windows]; " \
           "the documents are not recorded: each unit resampled on its own" in md
    assert f"| rope_small | yarn | {math.exp(row['loss']['mean']):.1f} [{math.exp(row['loss']['lo']):.1f}, " in md
    assert "loss minus none over the targets past L" not in md  # no row has it: no table


def test_a_method_a_run_cannot_apply_is_not_available_in_the_study():
    # a learned table past its length: extrapolate.py writes the entry with its reason and no metrics
    unavailable = dict(protocol="windows", method="none", mode=None, eval_len=64, available=False, per_unit=None,
                       loss=None, loss_beyond_train=None, reason="a learned position table has 32 entries")
    reports = {"learned_small": [dict(run=f"s{k}", train_len=32, results=[unavailable, entry("crop", loss=[3.0, 3.2])])
                                 for k in range(2)]}
    rows = {r["method"]: r for r in study.aggregate(reports)}
    assert rows["none"]["loss"] is None and rows["none"]["diff_crop"] is None and rows["crop"]["loss"]["mean"] == pytest.approx(3.1)
    assert "| learned_small | none | n/a |" in study.markdown(list(rows.values()), 2)


def test_paired_differences_vary_less_than_the_losses():
    reports = {"rope_small": [fake_report(4.0, 3.5), fake_report(4.2, 3.6), fake_report(4.4, 3.7)]}
    rows = {r["method"]: r for r in study.aggregate(reports)}
    assert rows["none"]["loss"]["mean"] == pytest.approx(4.2) and rows["yarn"]["diff_none"]["mean"] == pytest.approx(-0.6)
    # the seeds move both methods together: yarn - none spreads over -0.5..-0.7 and half the windows' spread
    width = {m: rows[m][k]["hi"] - rows[m][k]["lo"] for m, k in (("none", "loss"), ("yarn", "diff_none"))}
    assert width["yarn"] < width["none"] / 2
    assert rows["yarn"]["per_seed"]["loss"] == pytest.approx([3.5, 3.6, 3.7]) and rows["none"]["diff_none"] is None
    md = study.markdown(study.aggregate(reports), 3)
    assert "| rope_small | yarn |" in md and f"{math.exp(3.6):.1f} [" in md and "| 2x (64) |" in md


def test_holm_decides_the_declared_contrasts_against_crop_past_the_training_length():
    rng = np.random.default_rng(1)
    noise = rng.normal(0, 0.5, (3, 16))
    diffs = dict(yarn=-1 + rng.normal(0, 0.2, (3, 16)), pi=1 + rng.normal(0, 0.2, (3, 16)), ntk=noise - noise.mean())
    reports = {"rope_small": [dict(run=f"s{k}", train_len=32, results=[
        entry("crop", loss=[4.0] * 16), *(entry(m, loss=4 + d[k], diff_crop=d[k]) for m, d in diffs.items()),
        entry("yarn", eval_len=32, loss=[3.0] * 16, diff_crop=[-1.0] * 16),  # at L: not in the family
        entry("yarn", protocol="sliding", loss=[3.0] * 16, diff_crop=[-1.0] * 16)])  # sliding: not in the family
        for k in range(3)]}
    declared = {c["method"]: c for c in study.contrasts(reports)["rows"]}
    assert {m: c["decision"] for m, c in declared.items()} == dict(yarn="lower than crop", pi="higher than crop",
                                                                    ntk="undecided")
    assert declared["ntk"]["p"] > 0.5 and declared["yarn"]["hi"] < 0 < declared["pi"]["lo"] and declared["yarn"]["eval_len"] == 64
    assert declared["ntk"]["equivalence"] == "no difference found" and declared["yarn"]["equivalence"] is None
    assert declared["yarn"]["seeds"] == 3 and declared["yarn"]["p_seed"] < 0.05 / 3
    md = study.markdown(study.aggregate(reports), 3, declared=study.contrasts(reports))
    assert "(m = 3)" in md and "Holm's procedure at 0.05 family-wise" in md
    assert f"| rope_small | yarn | {declared['yarn']['mean']:.3f} [{declared['yarn']['lo']:.3f}, " in md
    assert md.split("### Declared contrasts")[1].count(" lower, 3 seeds |") == 1


def test_three_seeds_that_agree_in_sign_are_not_enough_for_the_bootstrap_alone():
    # every window of a seed gives that seed's difference 0.001, 0.002 or 0.003: every bootstrap replicate is > 0 (p = 0),
    # but the t-test on 3 seed means has p = 1 - sqrt(12/14) = 0.074, so the contrast is not decided; both one-sided
    # tests against +-0.01 reject (seed-level p 0.0026, test_stats.py), so it is equivalent within the margin
    reports = {"rope_small": [dict(run=f"s{k}", train_len=32, results=[
        entry("crop", loss=[4.0] * 8), entry("yarn", loss=[4.0 + d] * 8, diff_crop=[d] * 8)])
        for k, d in enumerate((0.001, 0.002, 0.003))]}
    (c,) = study.contrasts(reports)["rows"]
    assert c["p"] == 0 and c["p_seed"] == pytest.approx(1 - math.sqrt(12 / 14))
    assert (c["decision"], c["equivalence"]) == ("undecided", "equivalent within +-0.01")
    (wide,) = study.contrasts(reports, margin=0.002)["rows"]  # the mean 0.002 is on the margin: not within it
    assert wide["equivalence"] == "no difference found"
    one = {"rope_small": reports["rope_small"][:1]}  # one seed: no seed-level test, nothing decided
    assert study.contrasts(one)["rows"][0]["decision"] == "undecided" and study.contrasts(one)["rows"][0]["p_seed"] is None


def test_duplicates_and_zeros_leave_the_family_and_the_page_says_so():
    # dynamic-ntk in sequence mode scores a full window as ntk does: the same per-window values, one contrast
    rng = np.random.default_rng(4)
    d = -0.5 + rng.normal(0, 0.1, (3, 8))
    reports = {"rope_small": [dict(run=f"s{k}", train_len=32, results=[
        entry("crop", loss=[4.0] * 8), entry("ntk", loss=4 + d[k], diff_crop=d[k]),
        dict(entry("dynamic-ntk", loss=4 + d[k], diff_crop=d[k]), mode="sequence"),
        entry("window", loss=[4.0] * 8, diff_crop=[0.0] * 8)]) for k in range(3)]}
    declared = study.contrasts(reports)
    assert [c["method"] for c in declared["rows"]] == ["ntk"] and declared["family_size"] == 1
    assert "minus ntk-by-parts" not in declared["family"]  # the runs have no yarn: the page does not name that pair
    assert declared["dropped"] == [
        dict(config="rope_small", method="dynamic-ntk (sequence)", at=64, reason="the same per-unit values as ntk"),
        dict(config="rope_small", method="window", at=64, reason="zero in every unit of every seed")]
    md = study.markdown(study.aggregate(reports), 3, declared=declared)
    assert "(m = 1)" in md and "Left out of the family: dynamic-ntk (sequence) in rope_small at 64: the same per-unit " \
                               "values as ntk; window in rope_small at 64: zero in every unit of every seed." in md
    assert declared["replicates"] == stats.replicates(1)


def test_yarn_minus_ntk_by_parts_is_paired_on_the_same_windows_and_declared_too():
    # YaRN's temperature alone: per window, yarn's diff_crop minus ntk-by-parts'; the window effects cancel
    rng = np.random.default_rng(2)
    window = rng.normal(0, 0.5, (3, 16))  # shared by both methods: a paired difference removes it
    reports = {"rope_small": [dict(run=f"s{k}", train_len=32, results=[
        entry("crop", loss=[4.0] * 16), entry("ntk-by-parts", loss=4.2 + window[k], diff_crop=0.2 + window[k]),
        entry("yarn", loss=4.1 + window[k] + rng.normal(0, 0.01, 16), diff_crop=0.1 + window[k] + rng.normal(0, 0.01, 16))])
        for k in range(3)]}
    family = study.contrasts(reports)
    assert "yarn minus ntk-by-parts past L" in family["family"]
    declared = {c["method"]: c for c in family["rows"]}
    pair = declared["yarn - ntk-by-parts"]
    assert pair["mean"] == pytest.approx(declared["yarn"]["mean"] - declared["ntk-by-parts"]["mean"])
    assert pair["decision"] == "lower than ntk-by-parts" and pair["hi"] < 0 and pair["hi"] - pair["lo"] < 0.02
    assert declared["yarn"]["decision"] == "undecided"  # against crop the window spread hides the same 0.1
    assert study.contrasts(reports, pairs=())["family_size"] == 2  # no pairs declared: none
    # declared on the command line: --contrasts ntk-by-parts-yarn is the same difference, the other way round
    other = {c["method"]: c for c in study.contrasts(reports, pairs=study.parse_contrasts("ntk-by-parts-yarn"))["rows"]}
    assert other["ntk-by-parts - yarn"]["mean"] == pytest.approx(-pair["mean"]) and "yarn - ntk-by-parts" not in other


def test_a_control_config_is_paired_with_each_fine_tune_on_seeds_and_windows():
    # a fine-tune (ft) and its control (cont) start from the same seed: their seed and window effects cancel
    rng = np.random.default_rng(3)
    shared = rng.normal(0, 0.3, (3, 1)) + rng.normal(0, 0.5, (3, 16))
    def seed(k, **loss):
        return dict(run=f"s{k}", train_len=32, results=[entry(m, loss=v, loss_beyond_train=v) for m, v in loss.items()])
    reports = {"ft": [seed(k, none=4.0 + shared[k] + rng.normal(0, 0.01, 16), crop=4.1 + shared[k]) for k in range(3)],
               "cont": [seed(k, crop=4.1 + shared[k]) for k in range(3)]}
    family = study.contrasts(reports, control="cont")
    declared = {(c["config"], c["method"]): c for c in family["rows"]}
    assert set(declared) == {("ft", "none - cont crop")}  # the control is not paired with itself
    # ft's crop is the control's crop on every window: zero by construction, out of the family
    assert family["dropped"] == [dict(config="ft", method="crop - cont crop", at=64, reason="zero in every unit of every seed")]
    none = declared["ft", "none - cont crop"]
    assert none["mean"] == pytest.approx(-0.1, abs=0.01) and none["hi"] - none["lo"] < 0.02
    assert none["decision"] == "lower than cont crop"
    assert "every method of the other configs minus cont's crop past L (m = 1)" in \
        study.markdown(study.aggregate(reports), 3, declared=family)
    with pytest.raises(ValueError, match=r"--control 'configs/rope_small_cont.py' is not one of the study's configs"):
        study.parse_args(["configs/rope_small_pi4x.py", "--control", "configs/rope_small_cont.py"])


def test_the_command_names_a_linked_out_folder_as_written(tmp_path, monkeypatch):
    (root := tmp_path / "repo").mkdir()
    (elsewhere := tmp_path / "disk").mkdir()
    (root / "out").symlink_to(elsewhere)
    monkeypatch.setattr(study, "ROOT", root)
    monkeypatch.chdir(root)
    assert study.from_root("out/study") == "out/study" and study.from_root(elsewhere / "x") == str(elsewhere / "x")
    assert study.from_root("configs/rope_small.py") == "configs/rope_small.py"


def probes_report(hit):
    """One seed's probes: copy at distance 32 (5 trials), passkey at 64 over 2 depths (3 trials each), all hits = hit;
    an older copy entry without per-trial hits, and MQAR at 32 (4 trials)."""
    copy = dict(probe="copy", eval_len=64, distance=32, available=True)
    return dict(train_len=32, retrieval=dict(retrieves=bool(hit)), results=[
        dict(copy, method="none", top1=float(hit), hits=[float(hit)] * 5), dict(copy, method="yarn", top1=0.5),
        *(dict(probe="passkey", method="none", eval_len=64, depth=d, available=True, exact=float(hit), hits=[hit] * 3)
          for d in (0, 1)), dict(copy, probe="mqar", method="none", top1=0.25, hits=[0.25, 0.0, 0.5, 0.25])])


def test_probe_proportions_stay_inside_0_1():
    rows = {(r["probe"], r["method"]): r for r in study.aggregate_probes({"rope_small": [probes_report(1), probes_report(0)]})}
    # two seeds, one copying every trial, one none: a t interval would be 0.5 +- 6.35; the bootstrap's is [0, 1]
    copy, passkey = rows["copy", "none"]["value"], rows["passkey", "none"]["value"]
    assert (copy["mean"], copy["lo"], copy["hi"], copy["seeds"], copy["units"]) == (0.5, 0.0, 1.0, 2, 5)
    assert (passkey["lo"], passkey["hi"], passkey["units"]) == (0.0, 1.0, 6)  # depths x trials
    assert rows["copy", "yarn"]["value"]["units"] == 1 and rows["copy", "none"]["seeds_that_copy"] == 1
    md = study.markdown(study.aggregate({"rope_small": [fake_report(4.0, 3.5)] * 2}), 2, list(rows.values()))
    assert "### copy probe: top-1 on the repeat, by distance\n\nmean [95% bootstrap interval over 2 seeds x 5 trials]" in md
    assert "| rope_small (1/2 copy) | none | 0.50 [0.00, 1.00] |" in md
    assert rows["mqar", "none"]["value"]["mean"] == 0.25 and rows["mqar", "none"]["value"]["units"] == 4
    assert "### MQAR probe: top-1 on the values after the queries, by distance" in md


def test_an_old_report_or_seeds_on_different_windows_are_a_one_line_error(tmp_path, monkeypatch):
    old = fake_report(4.0, 3.5)
    for r in old["results"]:
        del r["per_unit"]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "extrapolation.json").write_text(json.dumps(old))
    monkeypatch.setattr(study, "run_one", lambda *args: run_dir)
    message = error_of(["configs/rope_small.py", "--seeds", "2", "--out", str(tmp_path / "s"), "--wandb_log", "false"])
    assert "fake has no per-unit values" in message and "run the study again" in message and not (tmp_path / "s").exists()
    with pytest.raises(ValueError) as e:
        study.aggregate({"rope_small": [fake_report(4.0, 3.5), fake_report(4.0, 3.5, windows=(0.1, -0.1))]})
    assert "seeds were scored on different units (4, 2 of them)" in str(e.value) and "\n" not in str(e.value)


def trained_already(tmp_path, monkeypatch):
    """A study's run folder whose training is done: a checkpoint's bytes (reuse compares their weights_id)."""
    run_dir = tmp_path / "rope_small_seed0"
    run_dir.mkdir()
    (run_dir / "ckpt.pt").write_bytes(b"the weights")
    monkeypatch.setattr(study, "last_iter", lambda run_dir: (6, 6))
    return run_dir


def test_the_study_re_evaluates_a_report_without_per_unit_values(tmp_path, monkeypatch):
    run_dir, calls = trained_already(tmp_path, monkeypatch), []
    monkeypatch.setattr(study, "step", lambda what, cmd, wandb_log: calls.append(what))
    for report in (fake_report(4.0, 3.5), dict(fake_report(4.0, 3.5), results=[dict(entry("none"), per_unit=None)]),
                   dict(fake_report(4.0, 3.5), results=[{k: v for k, v in entry("none").items() if k != "per_unit"}])):
        report = dict(report, weights_id=weights_id(run_dir), options=[])
        (run_dir / "extrapolation.json").write_text(json.dumps(report))
        study.run_one("configs/rope_small.py", 0, tmp_path, [], [])
    assert calls == ["evaluate rope_small_seed0"]  # only the last: an older extrapolate.py's


def test_the_same_options_in_another_order_are_not_evaluated_again(tmp_path, monkeypatch):
    run_dir, calls = trained_already(tmp_path, monkeypatch), []
    monkeypatch.setattr(study, "step", lambda what, cmd, wandb_log: calls.append(cmd[3:]))
    given = ["--lengths", "1,2", "--methods", "none,crop", "--no-wandb"]
    report = dict(fake_report(4.0, 3.5), weights_id=weights_id(run_dir), options=given)
    (run_dir / "extrapolation.json").write_text(json.dumps(report))
    for options in (["--no-wandb", "--methods", "none,crop", "--lengths", "1,2"], ["--methods=none,crop", "--lengths", "1,2", "--no-wandb"],
                    ["--lengths", "1,2", "--methods", "none", "--no-wandb"], ["--lengths", "1,2", "--methods", "none,crop"]):
        study.run_one("configs/rope_small.py", 0, tmp_path, [], options)
    assert calls == [["--methods=none,crop", "--lengths", "1,2", "--no-wandb"],  # '=' is another spelling: evaluated once more
                     ["--lengths", "1,2", "--methods", "none", "--no-wandb"], ["--lengths", "1,2", "--methods", "none,crop"]]


def test_a_study_that_does_not_log_keeps_its_runs_from_logging(monkeypatch):
    envs = []
    monkeypatch.setattr(study.subprocess, "run", lambda cmd, env: envs.append(env) or subprocess.CompletedProcess(cmd, 0))
    study.step("train", ["python", "train.py"], wandb_log=False)
    study.step("train", ["python", "train.py"])
    assert envs[0]["WANDB_MODE"] == "disabled" and envs[0]["PATH"] == os.environ["PATH"] and envs[1] is None


def tiny_config(dataset, folder):
    cfg = folder / "tiny_rope.py"
    cfg.write_text(f"dataset = {dataset!r}\nbatch_size = 4\nblock_size = 32\nn_layer = 1\nn_head = 2\nn_embd = 32\n"
                   "max_iters = 6\nlr_decay_iters = 6\nwarmup_iters = 1\neval_interval = 3\neval_iters = 1\n"
                   "log_interval = 3\nwandb_log = False\ndevice = 'cpu'\n")
    return cfg


def test_a_study_trains_evaluates_aggregates_and_resumes(dataset, tmp_path, capsys):
    cfg = tiny_config(dataset, tmp_path)
    argv = [str(cfg), "--seeds", "2", "--out", str(tmp_path / "s"), "--wandb_log", "false",
            "--eval_args", "--lengths 1,2 --methods none,crop,yarn --tokens 128 --no-wandb"]
    result = study.main(argv)
    runs = [tmp_path / "s" / f"tiny_rope_seed{k}" for k in (0, 1)]
    assert all((r / "extrapolation.json").is_file() for r in runs)
    assert result["seeds"] == 2 and result["configs"] == ["tiny_rope"]
    row = next(r for r in result["rows"] if r["method"] == "yarn" and r["eval_len"] == 64 and r["protocol"] == "windows")
    windows = len(json.loads((runs[0] / "extrapolation.json").read_text())["units"]["windows 64"])
    assert (row["loss"]["seeds"], row["loss"]["units"]) == (2, windows)
    assert row["loss"]["lo"] < row["loss"]["mean"] < row["loss"]["hi"]
    assert len(set(row["per_seed"]["loss"])) == 2  # the seeds really differ
    # the declared family: none and yarn against crop at 2x, each decided
    contrasts = result["contrasts"]
    assert contrasts["family_size"] == 2
    assert {(c["method"], c["eval_len"]) for c in contrasts["rows"]} == {("none", 64), ("yarn", 64)}
    assert {c["decision"] for c in contrasts["rows"]} <= {"lower than crop", "higher than crop", "undecided"}
    assert json.loads((tmp_path / "s" / "study.json").read_text())["rows"] == json.loads(json.dumps(result["rows"]))
    md = (tmp_path / "s" / "study.md").read_text()
    assert (tmp_path / "s" / "study.png").stat().st_size > 10_000 and "crop" in md
    assert "### perplexity over all targets, windows protocol\n\nmean [95% bootstrap interval over 2 seeds x " in md
    assert "### Declared contrasts" in md and "m = 2" in md
    # headed by the command that regenerates it: outside the repo the paths are absolute, the defaults left out
    command = shlex.join(["python", "lab/study.py", str(cfg.resolve()), f"--out={(tmp_path / 's').resolve()}",
                          "--wandb_log=false", "--seeds=2", "--eval_args=--lengths 1,2 --methods none,crop,yarn --tokens 128 --no-wandb"])
    assert md.startswith(f"# Study of tiny_rope: 2 seeds\n\nGenerated by `{command}`; regenerate it with that command.\n\n### ")
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


def test_a_study_reuses_only_runs_trained_as_it_would_train_them(dataset, tmp_path, capsys):
    cfg = tiny_config(dataset, tmp_path)
    argv = [str(cfg), "--seeds", "1", "--out", str(tmp_path / "s"), "--no-wandb",
            "--eval_args", "--lengths 1 --methods none,crop --tokens 128 --no-wandb"]
    study.main(argv)
    run = tmp_path / "s" / "tiny_rope_seed0"
    before = (run / "ckpt.pt").read_bytes()
    # other --train_args, or a config changed since: one line before anything trains, naming what differs
    for more, differs in ((["--train_args", "--learning_rate=0.001"], "learning_rate=0.002 (now 0.001)"),
                          (["--train_args", "--n_embd=64"], "n_embd=32 (now 64)")):
        message = error_of([*argv, *more])
        assert differs in message and str(run) in message and "another --out" in message
    capsys.readouterr()
    assert (run / "ckpt.pt").read_bytes() == before
    # a run replaced in its folder (train.py --overwrite=True) goes whole, its evaluations with it: evaluated again;
    # then the same weights keep their report, and other weights in the same folder are evaluated again
    subprocess.run([sys.executable, str(ROOT / "train.py"), str(cfg), f"--out_dir={run}", "--seed=0", "--overwrite=True",
                    "--wandb_group=s", "--wandb_run_name=tiny_rope_seed0"], check=True, capture_output=True)
    assert not (run / "extrapolation.json").exists() and (run / "ckpt.pt").read_bytes() == before
    study.main(argv)
    assert "study: evaluate tiny_rope_seed0" in capsys.readouterr().out
    study.main(argv)
    assert "tiny_rope_seed0: trained and evaluated already" in capsys.readouterr().out
    ckpt = torch.load(run / "ckpt.pt", weights_only=True)
    ckpt["model"]["lm_head.weight"] += 0.01
    torch.save(ckpt, run / "ckpt.pt")
    study.main(argv)
    assert "study: evaluate tiny_rope_seed0" in capsys.readouterr().out


def test_bad_eval_or_probe_options_fail_before_the_first_training(dataset, tmp_path, capfd):
    # the study imports no other command to check their options: it runs each command's --check before training
    argv = [str(tiny_config(dataset, tmp_path)), "--seeds", "2", "--out", str(tmp_path / "s"), "--no-wandb"]
    message = error_of([*argv, "--eval_args", "--methods none,foo"])
    out, err = capfd.readouterr()
    assert "check the evaluation options failed" in message and "extrapolate.py: error: unknown --methods foo" in err
    assert "study: train" not in out and not (tmp_path / "s" / "tiny_rope_seed0").exists()
    message = error_of([*argv, "--eval_args", "--lengths 1 --methods none,crop --tokens 128 --no-wandb",
                        "--probe_args", "--probes copy,bar"])
    out, err = capfd.readouterr()
    assert "check the probe options failed" in message and "probes.py: error: unknown --probes bar" in err
    assert "study: train" not in out and not (tmp_path / "s" / "tiny_rope_seed0").exists()


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


def test_the_command_names_paths_from_the_repo_root_and_parses_back_to_the_same_study(monkeypatch):
    monkeypatch.chdir(ROOT / "configs")
    args = study.parse_args(["rope_small.py", "../configs/nope_small.py", "--out", "../out/x", "--seeds", "2",
                             "--eval_args", "--lengths 1,4", "--probe_args", ""])
    assert args["command"] == ("python lab/study.py configs/rope_small.py configs/nope_small.py --out=out/x --seeds=2 "
                               "'--eval_args=--lengths 1,4' --probe_args=")
    monkeypatch.chdir(ROOT)  # where the command is meant to run
    again = study.parse_args(shlex.split(args["command"])[2:])
    assert again == dict(args, configs=["configs/rope_small.py", "configs/nope_small.py"], out=again["out"])
    assert (ROOT / again["out"]).resolve() == (ROOT / "configs" / args["out"]).resolve() and again["command"] == args["command"]
    assert study.parse_args(["configs/rope_small.py", "--out", "out/study"])["command"] == "python lab/study.py configs/rope_small.py"


@pytest.mark.parametrize("option, message", [
    (["--train_args=--max_iter=5"], "unknown config key 'max_iter' (from --max_iter=5)"),
    (["--train_args=--seed={seed} --dtype=float8"], "dtype='float8' (from --dtype=float8) is not one of"),
])
def test_bad_options_fail_before_the_first_run_trains(tmp_path, option, message):
    assert message in error_of(["configs/rope_small.py", "configs/nope_small.py", "--out", str(tmp_path / "s"), *option])
    assert not (tmp_path / "s").exists()  # nothing trained, nothing written


def test_the_figure_puts_three_configs_a_row(tmp_path):
    from matplotlib.image import imread
    rows = study.aggregate({f"config{i}": [fake_report(4.0, 3.5), fake_report(4.2, 3.6)] for i in range(4)})
    (tmp_path / "study.png").write_bytes(study.plot(rows))
    # two rows of three configs, each config over two panels (5.5 x 8 inches at 100 dpi)
    assert imread(tmp_path / "study.png").shape[:2] == (1600, 1650)


def test_the_study_writes_its_outputs_last(tmp_path, monkeypatch):
    # issue 19: a study that fails while aggregating or drawing leaves no study.json behind it (nor a folder)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "extrapolation.json").write_text(json.dumps(dict(fake_report(4.0, 3.5), run="run", units={})))
    monkeypatch.setattr(study, "run_one", lambda *args: run_dir)
    argv = ["configs/rope_small.py", "--seeds", "2", "--out", str(tmp_path / "s"), "--wandb_log", "false"]

    def broken(rows):
        raise OSError("the figure failed")
    with monkeypatch.context() as m:
        m.setattr(study, "plot", broken)
        assert error_of(argv).endswith("the figure failed") and not (tmp_path / "s").exists()
    study.main(argv)
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == ["study.json", "study.md", "study.png"]
    written = json.loads((tmp_path / "s" / "study.json").read_text())
    assert written["contrasts"]["family_size"] == 2 and written["rows"][0]["loss"]["seeds"] == 2  # none and yarn vs crop


def test_documents_are_the_unit_recorded_or_derived_from_the_dataset(tmp_path):
    # 8 windows in 2 documents, the windows of a document alike: resampling documents gives 2 draws, not 8
    rng = np.random.default_rng(5)
    starts, bounds = [0, 40, 80, 120, 200, 240, 280, 320], np.array([[0, 190], [200, 400]])
    doc_effect = np.repeat([-0.3, 0.3], 4)
    def seed(k, recorded):
        v = 4 + doc_effect + rng.normal(0, 0.01, 8)
        rep = dict(run=f"s{k}", train_len=32, units={"windows 64": starts}, dataset=str(tmp_path),
                   results=[entry("crop", loss=[4.0] * 8), entry("yarn", loss=v, diff_crop=v - 4.0)])
        return dict(rep, unit_docs={"windows 64": [0, 0, 0, 0, 1, 1, 1, 1]}) if recorded else rep
    reports = {"rope_small": [seed(k, True) for k in range(3)]}
    yarn = next(r for r in study.aggregate(reports) if r["method"] == "yarn")["diff_crop"]
    assert (yarn["unit"], yarn["units"], yarn["clusters"]) == ("document", 8, 2)
    windows = stats.interval([r["per_unit"]["diff_crop"] for rep in reports["rope_small"] for r in rep["results"]
                              if r["method"] == "yarn"])
    # two documents: a replicate draws both (mean 0), or one twice (-0.3 or +0.3); 8 windows scatter less
    assert (yarn["lo"], yarn["hi"]) == pytest.approx((-0.3, 0.3), abs=0.02)
    assert yarn["hi"] - yarn["lo"] > 1.25 * (windows["hi"] - windows["lo"])
    md = study.markdown(study.aggregate(reports), 3)
    assert "over 3 seeds x 8 windows from 2 documents]\n" in md
    # an older report: the documents come from the units' starts and the dataset's val_docs.npy
    old = {"rope_small": [seed(k, False) for k in range(3)]}
    assert family.unit_docs(old["rope_small"][0], "windows 64") is None  # no val_docs.npy yet: cannot say
    np.save(tmp_path / "val_docs.npy", bounds)
    family.val_bounds.cache_clear()
    assert family.unit_docs(old["rope_small"][0], "windows 64") == [0, 0, 0, 0, 1, 1, 1, 1]
    # the width table: windows, blocks (of 16L and 64L: larger than a document here, so one block a document), documents
    widths = study.unit_widths(reports)[64]
    assert [(u, n) for u, (n, _) in widths.items()] == [("window", 8), ("16L block", 2), ("64L block", 2), ("document", 2)]
    assert widths["document"][1] > 1.25 * widths["window"][1]
    assert widths["document"][1] == pytest.approx(study.unit_widths(reports, sizes=(1,))[64]["document"][1])
    assert "### How the unit of resampling moves the intervals" in study.markdown(
        study.aggregate(reports), 3, widths=study.unit_widths(reports))


def test_probe_rates_past_l_are_declared_contrasts_paired_on_trials():
    def seed(k):
        hits = dict(none=[0.0] * 10, yarn=[1.0] * 8 + [0.0] * 2, crop=[0.0] * 10)
        return dict(train_len=32, results=[dict(probe="copy", method=m, distance=d, available=True, hits=h, top1=np.mean(h))
                                           for m, h in hits.items() for d in (16, 64)])
    probes = {"rope_small": [seed(k) for k in range(3)]}
    family = study.contrasts({}, probes)
    assert [(c["method"], c["distance"], c["unit"]) for c in family["rows"]] == [("copy: yarn - none", 64, "trial")]
    (c,) = family["rows"]
    assert c["mean"] == pytest.approx(0.8) and c["units"] == 10 and c["margin"] == study.RATE_MARGIN
    assert family["dropped"] == [dict(config="rope_small", method="copy: crop - none", at=64,
                                      reason="zero in every unit of every seed")]


def test_declared_method_contrasts_are_parsed_against_the_method_names():
    assert study.parse_contrasts("llama3-yarn,dynamic-ntk-ntk") == [("llama3", "yarn"), ("dynamic-ntk", "ntk")]
    assert study.parse_contrasts("ntk-by-parts-yarn") == [("ntk-by-parts", "yarn")] and study.parse_contrasts("") == []
    for bad in ("foo-yarn", "yarn-yarn", "yarn"):
        with pytest.raises(ValueError, match="is not a-b for two different methods"):
            study.parse_contrasts(bad)
    args = study.parse_args(["configs/rope_small.py", "--contrasts", "llama3-yarn", "--margin", "0.02"])
    assert args["contrasts"] == [("llama3", "yarn")] and args["margin"] == 0.02 and "--contrasts=llama3-yarn" in args["command"]
    assert "--margin must be >= 0" in error_of(["configs/rope_small.py", "--margin", "-1"])


def test_a_page_says_how_many_documents_each_length_draws_from():
    def row(T, units, docs):
        return dict(eval_len=T, diff_crop=dict(units=units, clusters=docs, unit="document"))
    at = lambda r: r["eval_len"]  # noqa: E731
    assert study.sample([row(64, 44, 4), row(128, 44, 4)], "diff_crop", "windows", 32, at) == "44 windows from 4 documents"
    assert study.sample([row(64, 371, 4), row(512, 44, 3)], "diff_crop", "windows", 32, at) == \
        "U windows, U = 371 at 2x, 44 at 16x, from D documents, D = 4 at 2x, 3 at 16x"
    assert study.sample([row(64, 8, 1)], "diff_crop", "windows", 32, at) == "8 windows from 1 document"


def test_a_control_is_declared_for_probe_rates_too():
    def seed(hits_none):
        return dict(train_len=32, results=[dict(probe="copy", method="none", distance=64, available=True, hits=hits_none)])
    probes = {"ft": [seed([1.0] * 6 + [0.0] * 4) for _ in range(3)], "cont": [seed([0.0] * 10) for _ in range(3)]}
    (c,) = study.contrasts({}, probes, control="cont")["rows"]
    assert (c["config"], c["method"], c["ref"], c["mean"], c["units"]) == ("ft", "copy: none - cont none", "cont none", 0.6, 10)


def test_the_ceiling_share_is_crop_minus_method_over_crop_minus_ceiling():
    # control: crop 3.8, yarn 3.7 past L; ceiling read as trained (none) 3.4: yarn recovers (3.8 - 3.7) / (3.8 - 3.4)
    w = np.array([0.1, -0.1, 0.2, -0.2])
    past = dict(protocol="windows", eval_len=64, mode=None)
    def rep(losses):
        return dict(run="r", train_len=32, units={}, unit_docs={"windows 64": [0, 0, 1, 1]}, results=[
            dict(past, method=m, per_unit=dict(loss_beyond_train=list(v + w), diff_crop=list(v - 3.8 + 0 * w)))
            for m, v in losses.items()])
    reports = {"ctl": [rep({"crop": 3.8, "yarn": 3.7})] * 3, "top": [rep({"none": 3.4, "crop": 3.5})] * 3}
    (row,) = study.ceiling_shares(reports, "ctl", "top")
    assert (row["method"], row["eval_len"]) == ("yarn", 64) and row["mean"] == pytest.approx(0.25)
    assert row["gain"] == pytest.approx(0.4)


def test_a_family_leaves_out_contrasts_no_seed_has():
    values = [np.array([-0.1, -0.12, -0.09, -0.11])] * 3
    c = family.declare("crop", "ft", "yarn", "crop", 64, values, None, 0.01)
    assert family.declare("crop", "ft", "pi", "crop", 64, [None] * 3, None, 0.01) is None
    (row,), n_boot = family.decide([None, c, None])
    assert (row["method"], row["seeds"], row["units"]) == ("yarn", 3, 4) and n_boot == 10000
    assert family.decide([None]) == ([], 0) and family.decide([]) == ([], 0)


@pytest.mark.parametrize("decision, equivalence, word", [
    ("lower than crop", None, "lower"), ("higher than cont crop", None, "higher"),
    ("undecided", "equivalent within +-0.01", "equivalent"),
    ("undecided", "no difference found", "no difference found")])
def test_a_contrast_cell_says_the_decision_without_its_reference_or_margin(decision, equivalence, word):
    c = dict(mean=-0.0123, lo=-0.02, hi=0.0049, seeds=3, decision=decision, equivalence=equivalence)
    assert study.contrast_cell(c) == f"-0.012 [-0.020, 0.005] {word}, 3 seeds"  # no + sign: the study's
