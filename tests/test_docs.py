"""What the docs state that the repository can check: every relative link in the README and docs/ reaches
an existing file and heading, every script and config a quoted command runs exists, CI runs the README's
test command, the README's methods are eval/methods.py's, the reference's training table holds every config
key, and every doc section a module names exists."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```.*?^```", flags=re.M | re.S)


def prose(page):
    # links and headings inside fenced code are neither
    return FENCE.sub("", page.read_text())


def headings(page):
    return [h.strip() for h in re.findall(r"^#{1,6} (.+)$", prose(page), flags=re.M)]


def anchors(page):
    """The ids GitHub gives a page's headings: lower case, punctuation but - and _ dropped, spaces to
    hyphens, and -1, -2, ... on a repeated one."""
    seen, ids = {}, set()
    for title in headings(page):
        slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        ids.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return ids


def commands(page):
    """Each `python ...` or `torchrun ...` command quoted on a page, in code blocks and inline code alike."""
    text = page.read_text().replace("\\\n", " ")
    blocks = re.findall(r"^```\n(.*?)^```", text, flags=re.M | re.S)
    quoted = [line for block in blocks for line in block.splitlines()]
    quoted += re.findall(r"`([^`\n]+)`", FENCE.sub("", text))
    return [c.strip() for line in quoted for c in re.findall(r"(?:python|torchrun) [^&;|]+", line)]


def test_anchors_follow_githubs_rule():
    page = ROOT / "docs" / "reference.md"
    assert {"options-every-command-shares", "configsgpt2_124mpy", "weights--biases"} <= anchors(page)


def test_every_relative_link_reaches_an_existing_file_and_heading():
    broken = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", prose(page)):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = page.parent / path if path else page
            if not dest.exists() or (anchor and dest.suffix == ".md" and anchor not in anchors(dest)):
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, broken


def test_every_script_and_config_a_quoted_command_runs_exists():
    missing = []
    for page in PAGES:
        for command in commands(page):
            # whole path words only: a shell pattern (configs/*_small.py, base{100,500}.py) names no one file
            for path in re.findall(r"(?<![\w/.{}$*-])((?:[\w.-]+/)*[\w.-]+\.(?:py|sh))(?![\w{])", command):
                if not Path(path).stem.isupper() and not (ROOT / path).exists():  # CONFIG.py: a placeholder
                    missing.append(f"{page.relative_to(ROOT)}: {path} in `{command}`")
    assert not missing, missing


def test_ci_runs_the_readmes_set_up_and_test_commands_exactly():
    readme = (ROOT / "README.md").read_text()
    quick = ("pip install -r requirements.txt && python train.py configs/rope_small.py"
             " && python eval/extrapolate.py out/rope_small")
    tests = "pip install -r requirements.txt && python -m pytest -q"
    assert f"\n{quick}\n" in readme and f"\n{tests}\n" in readme
    assert f"\n{tests}\n" in (ROOT / ".ci" / "run").read_text()


def test_the_readme_lists_exactly_the_methods_of_eval_methods_in_their_order():
    from eval.methods import METHODS
    readme = (ROOT / "README.md").read_text()
    assert re.findall(r"^\| `([^`]+)` \|", readme, flags=re.M) == list(METHODS)


def test_the_reference_training_table_holds_every_config_key_and_no_other():
    from config import DEFAULTS
    text = (ROOT / "docs" / "reference.md").read_text()
    table = re.search(r"^\| key \| default \| meaning \|\n((?:\|.*\n)+)", text, flags=re.M).group(1)
    first_cells = re.findall(r"^\| ([^|]+) \|", table, flags=re.M)
    keys = {key for cell in first_cells for key in re.findall(r"`(\w+)`", cell)}
    assert keys == set(DEFAULTS), (sorted(set(DEFAULTS) - keys), sorted(keys - set(DEFAULTS)))


def test_every_doc_page_and_section_a_module_names_exists():
    named = re.compile(r'(docs/[\w/]+\.md)(?:[,\s#(]*"([^"\n]+)")?')
    missing = []
    for module in sorted(ROOT.rglob("*.py")):
        if {"out", ".git"} & set(module.relative_to(ROOT).parts) or module.name == "test_docs.py":
            continue
        for page, section in named.findall(module.read_text()):
            titles = [t.replace("`", "") for t in headings(ROOT / page)] if (ROOT / page).exists() else None
            if titles is None or (section and not any(t.startswith(section) for t in titles)):
                missing.append(f"{module.relative_to(ROOT)}: {page} {section}".strip())
    assert not missing, missing
