"""Issue 53: every result names the weights it read (eval.reading.weights_id, the checkpoint's bytes) and no reader
uses one made from other weights or other options; options that apply to nothing, and duplicates, are refused
in one line."""
import json
import os
import shutil

import pytest
import torch

import train
from common import UserError
from eval import compare, extrapolate
from eval.reading import weights_id
from lab import context, ladder, probes, recipes, study
from test_promises import CONFIG, error, tiny_run
from test_safety import one_line
from tests.conftest import held_out_corpus

FAST = ["--lengths", "1,2", "--methods", "none,crop", "--protocols", "windows", "--tokens", "64",
        "--no-wandb"]


def other_weights(run_dir, name="ckpt.pt"):
    """run_dir's checkpoint retrained: the same run, other weights (its iteration and config as they were)."""
    ckpt = torch.load(run_dir / name, weights_only=True)
    for w in ckpt["model"].values():
        w += 0.01
    torch.save(ckpt, run_dir / name)


def test_the_weights_id_is_the_checkpoints_content_not_its_path(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "ckpt.pt").write_bytes(b"weights")
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    assert weights_id(tmp_path / "a") == weights_id(tmp_path / "b" / "ckpt.pt")
    assert len(weights_id(tmp_path / "a")) == 16
    (tmp_path / "b" / "ckpt.pt").write_bytes(b"weights, trained on")
    assert weights_id(tmp_path / "b") != weights_id(tmp_path / "a") and weights_id(tmp_path / "none") is None


def numbers(report):
    return [{k: v for k, v in r.items() if k != "seconds"} for r in report["results"]]


def test_a_checkpoint_replaced_as_it_is_read_is_named_by_the_weights_read(dataset, tmp_path, monkeypatch):
    # issue 61: a training checkpoints as a command reads its run; the id a result records names the weights it scored
    run = tiny_run(tmp_path / "run", dataset)
    first, newer = (run / "ckpt.pt").read_bytes(), tmp_path / "newer.pt"
    commands = {"extrapolation": (extrapolate.main, [str(run), *FAST]),
                "context": (context.main, [str(run), "--units", "2", "--contexts", "0.5,1", "--methods", "none,crop"]),
                "probes": (probes.main, [str(run), "--probes", "copy", "--distances", "0.5", "--trials", "2",
                                         "--segment", "4", "--methods", "none", "--device", "cpu", "--no-wandb"])}
    scored = {}
    for name, (main, argv) in commands.items():
        main(argv)
        scored[name] = json.loads((run / f"{name}.json").read_text())
    shutil.copy(run / "ckpt.pt", newer)
    other_weights(newer.parent, newer.name)
    second, real_load = newer.read_bytes(), torch.load

    def written_meanwhile(*args, **kwargs):  # the newer checkpoint renamed over ckpt.pt, after its hash
        if newer.exists():
            os.replace(newer, run / "ckpt.pt")
        return real_load(*args, **kwargs)
    monkeypatch.setattr(torch, "load", written_meanwhile)
    for name, (main, argv) in commands.items():
        (run / "ckpt.pt").write_bytes(first)
        newer.write_bytes(second)
        main(argv)
        report = json.loads((run / f"{name}.json").read_text())
        assert report["weights_id"] == scored[name]["weights_id"] != weights_id(run), name
        assert numbers(report) == numbers(scored[name]), name  # the numbers of the weights it names


def test_every_result_names_its_weights_and_compare_refuses_a_report_of_other_weights(dataset, tmp_path):
    run = tiny_run(tmp_path / "run", dataset)
    extrapolate.main([str(run), *FAST])
    probes.main([str(run), "--probes", "copy", "--distances", "0.5", "--trials", "2", "--segment", "4",
                 "--methods", "none", "--device", "cpu", "--no-wandb"])
    context.main([str(run), "--units", "2", "--contexts", "0.5,1", "--methods", "none,crop"])
    for name in ("extrapolation", "probes", "context"):
        assert json.loads((run / f"{name}.json").read_text())["weights_id"] == weights_id(run), name
    compare.main([str(run), "--out", str(tmp_path / "cmp")])
    # the run trained on (a report made at iter 700 of a run now at 2,500), or replaced by another encoding
    other_weights(run)
    one_line(error("compare.py", compare.main, [str(run), "--out", str(tmp_path / "cmp2")]), "other weights",
             f"re-run eval/extrapolate.py {run}")
    assert not (tmp_path / "cmp2").exists()
    report = json.loads((run / "extrapolation.json").read_text())
    del report["weights_id"]
    (run / "extrapolation.json").write_text(json.dumps(report))
    one_line(error("compare.py", compare.main, [str(run), "--out", str(tmp_path / "cmp2")]),
             "does not name the weights")


def test_an_evaluation_still_running_when_its_run_is_replaced_is_not_read_as_current(dataset, tmp_path,
                                                                                      monkeypatch):
    run = tiny_run(tmp_path / "run", dataset)
    replacement = tiny_run(tmp_path / "new", dataset, pos_emb="alibi")
    grid = extrapolate.run_grid

    def replaced_meanwhile(*a):  # train.py --overwrite=True of the run, while its old weights are scored
        shutil.copy(replacement / "ckpt.pt", run / "ckpt.pt")
        return grid(*a)
    monkeypatch.setattr(extrapolate, "run_grid", replaced_meanwhile)
    extrapolate.main([str(run), *FAST])
    assert json.loads((run / "extrapolation.json").read_text())["pos_emb"] == "rope"  # the old weights'
    one_line(error("compare.py", compare.main, [str(run), "--out", str(tmp_path / "cmp")]), "other weights")
    assert study.reusable(run / "extrapolation.json", run, FAST) is None


def test_a_hand_edited_report_is_one_line_in_compare(tmp_path):
    result = dict(protocol="windows", method="none", mode=None, eval_len=64, ppl=5.0, diff_crop=0.1)
    report = dict(run="run", train_len=32, units={}, results=[result])
    for edit, message in ((dict(train_len=0), "train_len=0"), (dict(train_len="32"), "train_len='32'"),
                          (dict(results=[dict(report["results"][0], diff_crop="0.1")]), "diff_crop='0.1'"),
                          (dict(results=[dict(report["results"][0], eval_len=64.5)]), "eval_len=64.5")):
        (tmp_path / "run").mkdir(exist_ok=True)
        (tmp_path / "run" / "extrapolation.json").write_text(json.dumps(dict(report, **edit)))
        argv = [str(tmp_path / "run"), "--out", str(tmp_path / "cmp")]
        one_line(error("compare.py", compare.main, argv), message)


def test_compare_refuses_reports_of_dev_and_test_documents_together(tmp_path):
    result = dict(protocol="windows", method="none", mode=None, eval_len=64, ppl=5.0, diff_crop=0.1)
    for docs in ("dev", "test"):
        (tmp_path / docs).mkdir()
        report = dict(run=docs, train_len=32, units={}, docs=docs, results=[result])
        (tmp_path / docs / "extrapolation.json").write_text(json.dumps(report))
    argv = [str(tmp_path / "dev"), str(tmp_path / "test"), "--out", str(tmp_path / "c")]
    one_line(error("compare.py", compare.main, argv), "different held-out documents", "on dev", "on test")


def test_options_that_apply_to_no_method_evaluated_are_refused():
    for argv, message in ((["--methods", "none,pi", "--pair_factors", "2,2"], "--pair_factors applies to the "
                                                                                "method pairs"),
                          (["--methods", "none,pi", "--dynamic_factor", "2"], "--dynamic_factor applies to"),
                          (["--methods", "none", "--dynamic_modes", "causal"], "--dynamic_modes applies"),
                          (["--methods", "none,pi", "--plot", "yarn"], "--plot yarn: not in --methods"),
                          (["--methods", "none,pairs"], "--methods pairs needs --pair_factors")):
        one_line(error("extrapolate.py", extrapolate.main, ["out/x", "--check", *argv]), message)
    extrapolate.main(["out/x", "--check", "--methods", "none,dynamic-ntk", "--dynamic_factor", "2", "--plot",
                      "none"])


def test_a_crop_stride_past_the_context_and_lengths_equal_in_tokens_are_refused(dataset, tmp_path):
    run = tiny_run(tmp_path / "run", dataset)
    for argv, message in ((["--crop_stride", "100000"], "--crop_stride 100000 is longer than the run's"),
                          (["--lengths", "1,1.00001"], "--lengths 1 and 1.00001 are both 32 tokens")):
        one_line(error("extrapolate.py", extrapolate.main, [str(run), *FAST, *argv]), message)
    assert not (run / "extrapolation.json").exists()
    extrapolate.main([str(run), *FAST, "--crop_stride", "32"])


def test_probe_distances_that_a_segment_makes_one_cell_are_refused(dataset, tmp_path):
    run = tiny_run(tmp_path / "run", dataset)
    argv = [str(run), "--probes", "copy", "--distances", "0.25,0.5", "--trials", "2", "--methods", "none",
            "--no-wandb"]
    one_line(error("probes.py", probes.main, [*argv, "--segment", "64"]),
             "--distances 0.25 and 0.5 are both 64 tokens", "--segment 64")
    mqar = [argv[0], "--probes", "mqar", *argv[3:], "--segment", "40"]
    one_line(error("probes.py", probes.main, mqar), "both 40 tokens")
    one_line(error("probes.py", probes.main, [*argv, "--pair_factors", "2"]), "--pair_factors applies to")
    one_line(error("probes.py", probes.main, [*argv[:-2], "none,pairs", "--check"]), "needs --pair_factors")
    assert not (run / "probes.json").exists()
    # the default distances at a short L: the repeats the segment makes are dropped, not refused
    probes.main([str(run), "--probes", "copy", "--trials", "2", "--methods", "none", "--segment", "64", "--no-wandb"])
    report = json.loads((run / "probes.json").read_text())
    distances = [r["distance"] for r in report["results"] if r["probe"] == "copy" and r["method"] == "none"]
    assert distances and len(distances) == len(set(distances)) and min(distances) == 64


def test_a_study_refuses_eval_args_that_would_read_another_report(tmp_path):
    for option, given in (("--eval_args", "--out elsewhere"), ("--eval_args", "--check"),
                          ("--probe_args", "--out=x")):
        one_line(error("study.py", study.parse_args, [CONFIG, option, given, "--out", str(tmp_path / "s")]),
                 f"{option} {given.split()[0]}")


def test_a_study_in_a_folder_named_as_a_number_gives_its_runs_a_string_group(tmp_path):
    from config import load_config
    run_dir = tmp_path / "2024" / "rope_small_seed0"
    config = load_config(study.train_argv(CONFIG, 0, run_dir, []))
    assert config["wandb_group"] == "2024" and config["wandb_run_name"] == "rope_small_seed0"


def test_a_study_checks_the_eval_options_meaning_before_training(dataset, tmp_path, capfd):
    from test_study import tiny_config
    argv = [str(tiny_config(dataset, tmp_path)), "--seeds", "1", "--out", str(tmp_path / "s"), "--no-wandb"]
    one_line(error("study.py", study.main, [*argv, "--eval_args", "--methods pairs"]),
             "check the evaluation options failed")
    assert "--methods pairs needs --pair_factors" in capfd.readouterr().err
    assert not (tmp_path / "s" / "tiny_rope_seed0").exists()


def test_a_study_of_a_fine_tune_refuses_it_once_its_source_is_retrained(dataset, tmp_path, capsys):
    from test_study import tiny_config
    cfg = tiny_config(dataset, tmp_path)
    train.main([str(cfg), f"--out_dir={tmp_path / 'base'}"])
    argv = [str(cfg), "--seeds", "1", "--out", str(tmp_path / "s"), "--no-wandb", "--train_args",
            f"--init_from={tmp_path / 'base'}", "--eval_args", " ".join(FAST)]
    study.main(argv)
    study.main(argv)  # the same source: reused
    assert "tiny_rope_seed0: trained and evaluated already" in capsys.readouterr().out
    other_weights(tmp_path / "base")
    one_line(error("study.py", study.main, argv), "holds other weights now", "remove that folder")


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A tiny run at L = 16 on a corpus with dev and test documents (the ladder's and recipes' windows)."""
    data = held_out_corpus(tmp_path_factory, 3)
    run_dir = tmp_path_factory.mktemp("small") / "code_small_seed0"
    cfg = dict(dataset=str(data), out_dir=run_dir, block_size=16, batch_size=4, n_layer=1, n_head=2,
               n_embd=32, max_iters=2, eval_interval=2, eval_iters=1, warmup_iters=1, wandb_log=False,
               device="cpu")
    train.main([f"--{k}={v}" for k, v in cfg.items()])
    return run_dir


def test_the_ladder_evaluates_a_retrained_rung_again_and_refuses_a_rung_given_twice(small, tmp_path, capsys):
    first = ladder.evaluate(small, "dev", ["none", "crop"])
    capsys.readouterr()
    assert ladder.evaluate(small, "dev", ["none", "crop"]) == first
    assert "evaluate" not in capsys.readouterr().out
    other_weights(small)
    again = ladder.evaluate(small, "dev", ["none", "crop"])
    assert f"ladder: evaluate {small} on dev" in capsys.readouterr().out
    assert again["weights_id"] == weights_id(small) != first["weights_id"]
    rung = str(small.parent)
    one_line(error("ladder.py", ladder.main, [rung, f"{rung}/", "--out", str(tmp_path / "page")]),
             "given twice")


def test_recipes_score_a_retrained_checkpoint_again(small, monkeypatch):
    monkeypatch.setattr(recipes, "TOKENS", 64)
    first = recipes.score(small, [("none", 2)])
    other_weights(small)
    again = recipes.score(small, [("none", 2)])
    assert again["none@2"]["weights_id"] == weights_id(small) != first["none@2"]["weights_id"]


def test_recipes_read_the_method_from_the_checkpoint_not_the_folder(dataset, tmp_path, monkeypatch):
    for recipe, (scaling, _) in recipes.RECIPES.items():
        run = tiny_run(tmp_path / "f" / f"{recipe}_seed0", dataset)
        given = recipes.RECIPES["yarn"][0] if recipe == "pi" else scaling  # a YaRN fine-tune in pi_seed0
        ckpt = torch.load(run / "ckpt.pt", weights_only=True)
        ckpt["config"]["rope_scaling"] = given and dict(given, original_max_position_embeddings=8)
        torch.save(ckpt, run / "ckpt.pt")
        shutil.copytree(run, run / "iter_0", ignore=shutil.ignore_patterns("iter_0"))
    monkeypatch.setattr(recipes, "score", lambda *a: pytest.fail("scored before the folders were checked"))
    with pytest.raises(UserError) as e:
        recipes.collect(tmp_path / "f", 1)
    one_line(str(e.value), "pi_seed0 was fine-tuned as yarn", "not as pi")


def test_recipes_refuse_an_out_that_is_a_file_before_any_work(tmp_path, monkeypatch):
    (tmp_path / "page").write_text("a file")
    monkeypatch.setattr(recipes, "collect", lambda *a: pytest.fail("worked before checking its --out"))
    one_line(error("recipes.py", recipes.main, [str(tmp_path), "--out", str(tmp_path / "page")]), "is a file")
