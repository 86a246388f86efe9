"""Every relative link in the README and docs/ names a file or folder that exists (pages are moved and replaced often);
the README stays a short guide whose set-up commands CI runs."""
import re
from pathlib import Path

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
