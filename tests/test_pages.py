"""lab/pages.py: what the lab's pages share, against text and numbers written out by hand."""
import json

import numpy as np
import pytest

from lab import pages


def test_an_intervals_text_is_mean_then_bounds_in_one_format():
    c = dict(mean=0.0123, lo=-0.0031, hi=0.0274)
    assert pages.interval_text(c) == "+0.012 [-0.003, +0.027]"  # a difference: its sign shown
    assert pages.interval_text(c, ".2f") == "0.01 [-0.00, 0.03]"
    assert pages.interval_text(dict(mean=233.33, lo=-146.2, hi=612.9), ".0f") == "233 [-146, 613]"
    assert pages.interval_text(dict(mean=np.float64(60.456), lo=55.91, hi=65.4), ".1f") == \
        "60.5 [55.9, 65.4]"
    assert pages.interval_text(None) == "n/a"
    assert pages.interval_text(dict(mean=None, lo=-1.0, hi=2.0)) == "n/a"


@pytest.mark.parametrize("decision, equivalence, said", [
    ("lower than crop", None, "lower than crop"),
    ("higher than cont crop", None, "higher than cont crop"),
    ("undecided", "equivalent within +-0.01", "equivalent within +-0.01"),
    ("undecided", "no difference found", "no difference found")])
def test_a_verdict_is_the_decision_else_the_equivalence_test(decision, equivalence, said):
    assert pages.verdict(dict(decision=decision, equivalence=equivalence)) == said


def test_contrast_metrics_name_each_contrast_by_config_sides_and_multiple_of_l():
    row = dict(config="ft", ref="crop", at=64, mean=-0.02, lo=-0.03, hi=-0.01, p=0.001,
               decision="lower than crop", equivalence=None)
    rows = [dict(row, method="yarn"), dict(row, method="yarn - ntk-by-parts", ref="ntk-by-parts", at=128),
            dict(row, method="copy: yarn - none", ref="none", at=16, decision="undecided",
                 equivalence="no difference found")]
    summary = pages.contrast_metrics(rows, {"ft": 32})
    assert summary["contrast/ft/yarn_minus_crop/2x/mean"] == -0.02
    assert summary["contrast/ft/yarn_minus_crop/2x/p"] == 0.001
    assert summary["contrast/ft/yarn_minus_ntk-by-parts/4x/decision"] == "lower than crop"
    assert summary["contrast/ft/copy_yarn_minus_none/0.5x/decision"] == "no difference found"
    assert len(summary) == 15  # mean, lo, hi, p, decision of each


def test_probe_metrics_average_passkey_over_depths_and_say_whether_the_run_copies():
    copy = dict(probe="copy", method="none", available=True, eval_len=64)
    passkey = dict(probe="passkey", method="yarn", available=True, eval_len=64)
    report = dict(train_len=32, retrieval=dict(inside_top1=0.9, retrieves=True), results=[
        dict(copy, distance=16, top1=0.75), dict(copy, distance=64, top1=0.25),
        dict(copy, distance=64, top1=0.5, method="yarn", available=False),
        dict(passkey, depth=0, exact=1.0), dict(passkey, depth=1, exact=0.5)])
    assert pages.probe_metrics(report) == {"copy_top1/0.5x/none": 0.75, "copy_top1/2x/none": 0.25,
                                           "passkey_exact/2x/yarn": 0.75, "copy_top1_inside_L": 0.9,
                                           "copies": 1}


def test_a_page_is_its_markdown_json_and_figure_said_where_they_went(tmp_path, capsys):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    pages.write_page(a, "page", "# A page\n", {"x": [1, 2]}, b"\x89PNG")
    assert (a / "page.md").read_text() == "# A page\n" and (a / "page.png").read_bytes() == b"\x89PNG"
    assert (a / "page.json").read_text() == '{\n "x": [\n  1,\n  2\n ]\n}\n'
    assert capsys.readouterr().out == f"# A page\n-> {a}/page.{{json,md,png}}\n"
    # no figure: none written or named; compact JSON
    pages.write_page(b, "page", "text\n", {"x": [1, 2]}, None, indent=None)
    assert sorted(p.name for p in b.iterdir()) == ["page.json", "page.md"]
    assert (b / "page.json").read_text() == '{"x": [1, 2]}\n'
    assert capsys.readouterr().out.endswith("page.{json,md}\n")
    # rows as CSV beside the JSON
    pages.write_page(c, "page", "text\n", {"rows": 1}, csv=([dict(a=1, b=None)], ("a", "b")))
    assert (c / "page.csv").read_bytes() == b"a,b\r\n1,\r\n"
    assert json.loads((c / "page.json").read_text()) == {"rows": 1}
    assert capsys.readouterr().out.endswith("page.{json,csv,md}\n")

