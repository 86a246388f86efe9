"""lab/long_context.py and its page (lab/long_context_page.py): a model read past L (passkey, loss against crop,
bojone's protocol with the crop-preserving swap) on a tiny run, its items cached as they land and its page written
from them."""
import json

import numpy as np
import pytest

import train
from common import UserError
from data.tokenizer import gpt2_tokenizer
from lab import long_context, long_context_page
from tests.conftest import held_out_corpus

L = 128  # the passkey prompt needs a few hundred tokens of a 300-token vocabulary


def test_the_passkey_prompt_is_yarns_with_the_key_at_its_depth_and_last():
    enc = gpt2_tokenizer(50257)
    for depth in (0.0, 0.5, 1.0):
        row, m = long_context.passkey_row(enc.encode_ordinary, 400, depth, 31337)
        text = enc.decode(row.tolist())
        assert len(row) == 401 and enc.decode(row[-m:].tolist()) == " 31337"
        assert text.startswith(long_context.TASK) and text.endswith(long_context.QUESTION + " 31337")
        needle = text.index(long_context.NEEDLE.format(key=31337))
        filler = text.count(long_context.GARBAGE[:20])
        before = text[:needle].count(long_context.GARBAGE[:20])
        assert before == pytest.approx(depth * filler, abs=1.5)  # the needle's place among the filler's sentences
    with pytest.raises(UserError, match="shorter than its task"):
        long_context.passkey_row(enc.encode_ordinary, 20, 0.5, 1)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    data = held_out_corpus(tmp_path_factory, 5)
    out = tmp_path_factory.mktemp("lc") / "run"
    train.main([f"--{k}={v}" for k, v in dict(dataset=str(data), batch_size=8, n_layer=1, n_head=2, n_embd=32,
                                              block_size=L, max_iters=6, warmup_iters=1, eval_interval=6, eval_iters=1,
                                              log_interval=6, wandb_log=False, device="cpu", seed=0, out_dir=out).items()])
    return out


def test_every_reading_lands_as_an_item_resumes_and_makes_a_page(run, tmp_path):
    out = tmp_path / "readings"
    argv = [str(run), "--out", str(out), "--lengths", "3", "--units", "2", "--crop_stride", "32", "--trials", "1",
            "--methods", "none,crop,yarn,rerope:window=32+logn"]
    long_context.main(argv)
    items = {p.name: json.loads(p.read_text()) for p in (out / "test" / "items").glob("*.json")}
    assert "passkey__yarn@3x__d0.5__t0.json" in items and "loss__crop@3x__u1.json" in items
    # the swap leaves every token crop reads: at 1L nothing is swapped, so only the real arm is read there
    assert "bojone__same__yarn@1L__u0.json" in items and "bojone__swapped__yarn@1L__u0.json" not in items
    assert items["bojone__same__none@3L__u0.json"]["nll"] != items["bojone__swapped__none@3L__u0.json"]["nll"]
    # the own-document control (the prefix from the document's own text kL further back): read past L only
    assert "bojone__own__yarn@3L__u1.json" in items and "bojone__own__yarn@1L__u0.json" not in items
    assert items["bojone__own__none@3L__u0.json"]["nll"] != items["bojone__same__none@3L__u0.json"]["nll"]
    assert len(items["loss__crop@3x__u0.json"]["nll"]) == 2 * L and len(items["loss__none@3x__u0.json"]["nll"]) == 3 * L
    stamps = {p.name: p.stat().st_mtime_ns for p in (out / "test" / "items").glob("*.json")}
    long_context.main(argv)  # everything landed: nothing is read again
    assert stamps == {p.name: p.stat().st_mtime_ns for p in (out / "test" / "items").glob("*.json")}
    page = tmp_path / "page" / "lc.md"
    long_context.main(argv + ["--page", str(page)])
    text = page.read_text()
    assert "| all depths |" in text and text.count("/5 [") == 4  # each method at 3x
    assert "## Passkey" in text and "reads past L" in text and "(2 units) |" in text and "`rerope:window=32+logn` (3L) | 2 |" in text
    assert page.with_suffix(".png").is_file() and json.loads(page.with_suffix(".json").read_text())["items"]
    # the passkey heatmap and the loss by position are drawn, and the page shows them
    assert (page.parent / "lc_loss.png").read_bytes()[:4] == b"\x89PNG"
    assert "![passkey, accuracy by length and depth](lc.png)" in text and "![loss by position](lc_loss.png)" in text
    with pytest.raises(UserError, match="readings of other weights or options"):
        long_context.main([str(run), "--out", str(out), "--crop_stride", "64", "--lengths", "3"])
    # a folder holds readings of one dtype (auto: float32 on a CPU), and its page says which
    assert "read in float32" in text and json.loads((out / "test" / "ids.json").read_text())["dtype"] == "float32"
    with pytest.raises(UserError, match="readings of other weights or options"):
        long_context.main(argv + ["--dtype", "bfloat16"])


def test_a_units_donor_is_another_document_and_stays_whatever_the_number_of_units_read():
    # a resumed run with more --units keeps every landed unit's swapped arm: its donor is drawn from its index alone
    few, more = long_context.unit_donors(2, 6), long_context.unit_donors(5, 6)
    assert few == more[:2] and all(d != i and 0 <= d < 6 for i, d in enumerate(more))
    assert len(set(long_context.unit_donors(6, 6))) > 1  # drawn, not one fixed document


def test_a_passkey_trials_key_is_drawn_from_its_length_depth_and_trial_alone():
    # a resumed run with more lengths, depths or trials keeps every landed item's key, and each trial draws its own
    keys = [long_context.passkey_key(k, d, t) for k in (1, 1.5, 2) for d in long_context.DEPTHS for t in range(4)]
    assert all(1 <= v <= 50000 for v in keys) and len(set(keys)) == len(keys)


def test_the_loss_figure_draws_1x_beside_the_lengths_past_L(recwarn):
    # at 1x nothing lies past L (no crop): its lower panel is left out, not drawn empty
    rng, n = np.random.default_rng(0), 64
    found = {f"loss/{spec}@{k}x/u{u}": dict(nll=(2 + rng.random(n * (k - (spec == "crop")))).tolist())
             for u in range(3) for spec, k in (("none", 1), ("none", 2), ("crop", 2), ("yarn", 2))}
    assert long_context_page.loss_plot(found, n, ["none", "crop", "yarn"], width=16)[:4] == b"\x89PNG"
    assert not [w for w in recwarn if "legend" in str(w.message)]


def test_crop_at_another_stride_is_read_beside_the_folders_and_its_page_says_so(run, tmp_path):
    # crop:stride=S beside crop (auto: L/8 = 16) is the folder option's crop at S; the page reads the decomposition
    # against it too
    common = ["--lengths", "3", "--units", "2", "--stages", "loss,bojone"]
    long_context.main([str(run), "--out", str(tmp_path / "a"), *common, "--methods", "crop,crop:stride=4,yarn"])
    long_context.main([str(run), "--out", str(tmp_path / "b"), *common, "--methods", "crop", "--crop_stride", "4"])
    a, b = tmp_path / "a" / "test" / "items", tmp_path / "b" / "test" / "items"
    for name in ("bojone__crop__u1.json", "loss__crop@3x__u0.json"):
        finer = json.loads((a / name.replace("crop", "crop:stride=4", 1)).read_text())["nll"]
        assert finer == json.loads((b / name).read_text())["nll"] != json.loads((a / name).read_text())["nll"]
    page = tmp_path / "lc.md"
    long_context.main([str(run), "--out", str(tmp_path / "a"), *common, "--methods", "crop,crop:stride=4,yarn",
                       "--page", str(page)])
    text = page.read_text()
    assert "## Passkey" not in text and not page.with_suffix(".png").exists()  # no passkey item, no section
    assert "**Against crop strided at 4** (`crop:stride=4`: each target sees 125 to 128 tokens" in text
    assert "| `crop:stride=4` | 2 |  | " in text and text.count("| `yarn` (3L) | 2 |") == 2


@pytest.mark.parametrize("spec, message", [("crop:stride=0", "--methods crop:stride must be >= 1, got 0"),
                                           ("crop:stride=129", "--methods crop:stride 129 is too large"),
                                           ("crop:width=3", "unknown setting 'width' of --methods crop:width=3"),
                                           ("yarnn", "unknown --methods yarnn"),
                                           ("rerope:window=0", "window must be >= 1, got 0"),
                                           ("ntk-mixed:k=x+logn", "ntk-mixed:k=x: k 'x' is not a number"),
                                           ("ntk-mixed:k=0.5", "k must be >= 1, got 0.5"),
                                           ("ntk-mixed:c=2", "ntk-mixed takes no setting 'c'")])
def test_a_bad_method_is_refused_before_anything_is_written(run, tmp_path, spec, message):
    with pytest.raises(UserError, match=message):
        long_context.main([str(run), "--out", str(tmp_path / "r"), "--lengths", "3", "--methods", f"none,{spec}"])
    assert not (tmp_path / "r").exists()


def test_a_passkey_rate_has_the_exact_binomial_interval():
    # Clopper-Pearson at the ends, by hand: 0 of n has upper bound 1 - (alpha/2)^(1/n), n of n lower (alpha/2)^(1/n)
    assert long_context_page.rate([False] * 5) == f"0/5 [0%, {1 - 0.025 ** (1 / 5):.0%}]" == "0/5 [0%, 52%]"
    assert long_context_page.rate([True] * 5) == "5/5 [48%, 100%]"
    assert long_context_page.rate([True, False, True, True]) == "3/4 [19%, 99%]"
