"""Every relative link in the README and docs/ names a file or folder that exists (pages are moved and replaced often);
the README stays a short guide whose set-up commands CI runs; what the docs state that the code can report (the methods,
the test count, a default, where options are documented) agrees with it, and the docs agree with each other."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_every_relative_link_resolves():
    broken = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            path = target.split("#")[0]
            if path and not re.match(r"[a-z]+:", path) and not (page.parent / path).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, broken


def test_the_readme_is_short_and_ci_runs_its_test_command_exactly():
    readme = (ROOT / "README.md").read_text()
    quick = "pip install -r requirements.txt && python train.py configs/rope_small.py && python eval/extrapolate.py out/rope_small"
    tests = "pip install -r requirements.txt && python -m pytest -q"
    assert len(readme.splitlines()) <= 160 and f"\n{quick}\n" in readme and f"\n{tests}\n" in readme
    assert f"\n{tests}\n" in (ROOT / ".ci" / "run").read_text()


def test_the_readme_lists_exactly_the_methods_of_eval_methods_in_their_order():
    from eval.methods import METHODS
    readme = (ROOT / "README.md").read_text()
    assert re.findall(r"^\| `([^`]+)` \|", readme, flags=re.M) == list(METHODS)


def test_the_readme_and_the_reference_state_the_same_measured_quick_start():
    said = [re.findall(r"took (\d+) minutes \((\d+) to train, (\d+) to evaluate\) on the ([\w -]+machine)",
                       (ROOT / page).read_text()) for page in ("README.md", "docs/reference.md", "docs/benchmarks.md")]
    assert all(len(s) == 1 for s in said) and said[0] == said[1] == said[2], said


def test_scripts_send_their_options_to_the_reference_and_the_schedule_follows_max_iters_there():
    import sample
    from eval import extrapolate
    assert all("Options and outputs: docs/reference.md" in m.__doc__ for m in (sample, extrapolate))
    assert not [p for p in ROOT.rglob("*.py") if "tests" not in p.parts and "Options: README" in p.read_text()]
    reference = (ROOT / "docs" / "reference.md").read_text()
    assert reference.count("| 2e-3, 2e-4, 100, `max_iters` (unless given), 1500 |") == 2  # both key tables: config.py's


def test_the_reference_states_the_number_of_tests_the_suite_collects(request):
    """Checked where the whole suite runs (every test file, nothing deselected), as CI runs it."""
    items, files = request.session.items, {p.name for p in (ROOT / "tests").glob("test_*.py")}
    if {i.path.name for i in items} != files or request.config.option.keyword or request.config.option.markexpr:
        pytest.skip("the whole suite was not collected")
    stated = re.findall(r"runs exactly this command: (\d+) tests", (ROOT / "docs" / "reference.md").read_text())
    assert stated == [str(len(items))], f"docs/reference.md states {stated} tests, the suite collects {len(items)}: update it"
