"""The options commands share (runtime.command_parser): one meaning of each in every command, and no command that
imports another."""
import ast
from pathlib import Path

import pytest

import sample
from eval import compare, extrapolate
from lab import base_bound, context, curves, pairs, probes, study
from test_promises import error, fake_report, tiny_run
from test_safety import one_line

ROOT = Path(__file__).resolve().parents[1]
CONFIG = str(ROOT / "configs" / "rope_small.py")


@pytest.fixture(scope="module")
def run(tmp_path_factory, dataset):
    """A tiny untrained run with a training log."""
    folder = tiny_run(tmp_path_factory.mktemp("cli") / "run", dataset)
    (folder / "log.jsonl").write_text('{"iter": 0, "val": 5.0}\n{"iter": 5, "val": 4.0}\n')
    return folder


@pytest.mark.parametrize("cli, argv, written", [
    (extrapolate, ["--lengths", "1", "--methods", "none", "--tokens", "64", "--device", "cpu", "--no-wandb"],
     {"extrapolation.json", "extrapolation.csv", "extrapolation.png"}),
    (probes, ["--probes", "copy", "--distances", "0.5", "--trials", "2", "--segment", "4", "--methods", "none",
              "--device", "cpu", "--no-wandb"], {"probes.json", "probes.csv", "probe_copy.png"}),
    (context, ["--contexts", "0.5,1", "--methods", "none", "--units", "2", "--device", "cpu"],
     {"context.json", "context.csv", "context.png"}),
    (curves, [], {"curves.png"}),
    (compare, [], {"compare.md", "compare.png"}),
])  # pairs (--out required) and study: tests/test_pairs.py, tests/test_study.py
def test_every_out_is_the_folder_the_command_writes_into(run, tmp_path, cli, argv, written):
    runs = [str(fake_report(tmp_path / "evaluated", "run", 5.0))] if cli is compare else [str(run)]
    before = sorted(p.name for p in run.iterdir())
    cli.main([*runs, "--out", str(tmp_path / "results" / "here"), *argv])
    assert {p.name for p in (tmp_path / "results" / "here").iterdir()} == written
    assert sorted(p.name for p in run.iterdir()) == before  # nothing beside the run's own files


def test_base_bound_writes_into_its_out_folder(tmp_path):
    base_bound.base_bound(base_bound.parse_args(["--head_dim", "8", "--lengths", "64", "--bases", "100",
                                                 "--out", str(tmp_path / "bound")]))
    assert {p.name for p in (tmp_path / "bound").iterdir()} == {"base_bound.json", "base_bound.png"}


def test_compare_and_curves_write_into_their_default_folders(run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    compare.main([str(fake_report(tmp_path / "evaluated", "run", 5.0))])
    curves.main([str(run)])
    assert sorted(str(p.relative_to(tmp_path / "out")) for p in (tmp_path / "out").rglob("*")) == [
        "compare", "compare/compare.md", "compare/compare.png", "curves", "curves/curves.png"]


def test_wandb_log_is_true_or_false_with_no_wandb_its_short_form(run, tmp_path, monkeypatch):
    for cli, argv, default in ((extrapolate, [str(run)], None), (probes, [str(run)], None), (study, [CONFIG], True)):
        assert cli.parse_args(argv)["wandb_log"] is default  # None: the run's own wandb_log
        assert cli.parse_args([*argv, "--no-wandb"])["wandb_log"] is False
        assert cli.parse_args([*argv, "--wandb_log", "TRUE"])["wandb_log"] is True
        one_line(error(cli.__name__, cli.parse_args, [*argv, "--wandb_log", "maybe"]), "--wandb_log 'maybe' is not true or false")
    logged = []  # probes as extrapolate: the run's own setting (False here) unless --wandb_log says otherwise
    monkeypatch.setattr(probes, "log_wandb", lambda *a: logged.append(a))
    common = [str(run), "--out", str(tmp_path), "--probes", "copy", "--distances", "0.5", "--trials", "2", "--segment",
              "4", "--methods", "none", "--device", "cpu"]
    probes.main(common)
    assert not logged
    probes.main([*common, "--wandb_log", "true"])
    assert len(logged) == 1


def test_device_and_seed_mean_the_same_in_every_command(run, tmp_path):
    for cli, argv in ((extrapolate, [str(run)]), (probes, [str(run)]), (context, [str(run)]), (sample, [str(run)]),
                      (pairs, [str(run), "--out", str(tmp_path)])):
        one_line(error(cli.__name__, cli.parse_args, [*argv, "--device", "bogus"]),
                 "device='bogus' is not one of: auto, cpu, cuda, cuda:N, mps")
        one_line(error(cli.__name__, cli.parse_args, [*argv, "--seed", "-1"]), "--seed must be >= 0, got -1")
        one_line(error(cli.__name__, cli.parse_args, [*argv, "--seed", "one"]), "--seed 'one' is not an integer")
        assert cli.parse_args([*argv, "--device", "cpu", "--seed", "7"])["device"] == "cpu"
        assert cli.parse_args([*argv, "--seed", "7"])["seed"] == 7
    assert (sample.parse_args([str(run)])["seed"], extrapolate.parse_args([str(run)])["seed"]) == (1337, 0)
    assert extrapolate.parse_args([str(run)])["out"] == run  # a command with a run writes into it by default
    one_line(error("pairs.py", pairs.parse_args, [str(run)]), "--out")  # of several runs, none is the default


def command_files():
    """The commands: every file of the repository's code that runs as a script."""
    files = [*ROOT.glob("*.py"), *ROOT.glob("eval/*.py"), *ROOT.glob("lab/*.py"), *ROOT.glob("data/**/*.py")]
    return {".".join(f.relative_to(ROOT).with_suffix("").parts): f for f in files
            if 'if __name__ == "__main__":' in f.read_text()}


def imported(path):
    """The modules a file imports: `from eval import compare` imports eval and eval.compare."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
    return names


def test_no_command_imports_another():
    # a command checks its own options; one that imports another runs (and breaks with) that one's module-level code
    commands = command_files()
    assert {"train", "sample", "bench", "eval.extrapolate", "eval.compare", "lab.probes", "lab.context", "lab.pairs",
            "lab.study", "lab.curves", "lab.base_bound", "data.text.prepare"} <= set(commands)
    assert {"eval.extrapolate", "lab.probes"} <= imported(ROOT / "tests" / "test_cli.py")  # what the check would find
    for name, path in commands.items():
        assert not imported(path) & (set(commands) - {name}), f"{name} imports {imported(path) & set(commands)}"
