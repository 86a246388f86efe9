"""lab/recipes.py: the steps-to-a-fraction arithmetic by hand, and the whole page on tiny fine-tunes."""
import json

import numpy as np
import pytest

import train
from common import UserError
from lab import recipes
from tests.conftest import held_out_corpus


def test_steps_to_a_target_interpolate_between_kept_checkpoints():
    steps, per_step = [0, 10, 100], np.array([[0.0, -0.5], [-0.2, -0.6], [-0.4, -0.7]])  # [steps, seeds]
    # seed 0 reaches -0.3 halfway between 10 (-0.2) and 100 (-0.4): step 55; seed 1 is there at step 0
    assert recipes.first_reach(per_step, steps, -0.3) == [pytest.approx(55.0), 0.0]
    assert recipes.first_reach(per_step, steps, -0.65) == [None, pytest.approx(55.0)]  # seed 0 never gets there
    assert recipes.first_reach(per_step, steps, np.array([-0.1, -0.7])) == [pytest.approx(5.0), 100.0]  # a target a seed


def test_steps_mean_counts_never_as_the_last_step():
    # 100, 200 and never (400): mean 233.3, sd 152.8, t(0.975, 2) = 4.303: 233.3 +- 4.303 * 152.8 / sqrt(3) = +-379.5
    assert recipes.steps_mean([100.0, 200.0, None], 400) == "233 [-146, 613]"
    assert recipes.steps_mean([50.0, 50.0], 400) == "50"


def test_steps_test_counts_a_recipe_that_never_gets_there_as_the_last_step():
    t = recipes.steps_test({"yarn": [10.0, 20.0, 30.0], "pi": [None, 40.0, 60.0]}, "yarn", "pi")
    assert t["mean_difference"] == pytest.approx(((10 - 60) + (20 - 40) + (30 - 60)) / 3) and 0 < t["p"] < 1


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """Every recipe fine-tuned from one tiny L = 8 model at 32, two seeds, checkpoints kept at 0, 2 and 4."""
    data = held_out_corpus(tmp_path_factory, 2)
    root = tmp_path_factory.mktemp("recipes")
    shape = dict(dataset=str(data), n_layer=1, n_head=2, n_embd=32, wandb_log=False, device="cpu", eval_iters=1,
                 warmup_iters=1, learning_rate=3e-3)
    train.main([f"--{k}={v}" for k, v in dict(shape, out_dir=root / "base", block_size=8, batch_size=8, max_iters=20).items()])
    for k in range(2):
        for recipe, (scaling, _) in recipes.RECIPES.items():
            cfg = dict(shape, out_dir=root / f"{recipe}_seed{k}", init_from=root / "base", block_size=32, batch_size=2,
                       max_iters=4, eval_interval=4, keep_iters=(0, 2, 4), seed=k, **({"rope_scaling": scaling} if scaling else {}))
            train.main([f"--{k}={v!r}" if isinstance(v, (dict, tuple)) else f"--{k}={v}" for k, v in cfg.items()])
    return root


def test_the_page_reads_every_recipe_along_its_fine_tune(folder, tmp_path, monkeypatch):
    monkeypatch.setattr(recipes, "TOKENS", 512)
    recipes.main([str(folder), "--seeds", "2", "--out", str(tmp_path)])
    result, page = json.loads((tmp_path / "recipes.json").read_text()), (tmp_path / "recipes.md").read_text()
    assert result["steps"] == [0, 2, 4]
    # the best recipe reads past L best at 4x (full context), whatever its gain
    assert result["best"] == min(recipes.RECIPES, key=lambda r: result["curves"][r]["4"]["4"]["loss"]["mean"])
    rows = {(r["config"], r["method"], r["ref"], r["at"]) for r in result["rows"]}
    assert ("yarn", "as fine-tuned", "pi", 16) in rows and ("pi", "pi", "crop", 8) in rows and ("plain", "yarn", "crop", 16) in rows
    assert ("plain", "as fine-tuned", "plain", 2) not in rows
    scores = json.loads((folder / "pi_seed0" / "iter_4" / "recipes_test.json").read_text())
    assert set(scores) == {"none@2", "crop-L@2", "none@4", "crop-L@4", "none@8", "crop@8", "yarn@8", "pi@8",
                           "none@16", "crop@16", "yarn@16", "pi@16"}
    assert not (folder / "pi_seed1" / "iter_0" / "recipes_test.json").exists()  # the same weights as seed 0's: scored once
    assert scores["none@4"]["past_run"] is None and len(scores["none@16"]["past_run"]) == len(scores["none@16"]["docs"])
    # inside the run's own length crop is the full context: past 4L at 8x, crop == none would need the same targets
    # to be read with 32 tokens, which they are not; inside 4x (32 tokens = the run's length) crop-L differs from none
    assert scores["none@4"]["past_L"] != scores["crop-L@4"]["past_L"]
    assert "| `yarn` | `as fine-tuned` | `pi` | 8 |" in page and (tmp_path / "recipes.png").stat().st_size > 0
    before = (folder / "pi_seed0" / "iter_4" / "recipes_test.json").stat().st_mtime_ns
    recipes.main([str(folder), "--seeds", "2", "--out", str(tmp_path / "again")])  # the scores are reused
    assert (folder / "pi_seed0" / "iter_4" / "recipes_test.json").stat().st_mtime_ns == before


def test_a_missing_fine_tune_names_the_command_that_trains_it(folder, tmp_path):
    with pytest.raises(UserError) as e:
        recipes.main([str(folder), "--seeds", "3", "--out", str(tmp_path)])
    assert "plain_seed2 has no fine-tune" in str(e.value) and "lab/configs/code_recipe.py" in str(e.value)


def test_a_scores_file_that_is_not_ours_is_scored_again(tmp_path):
    path = tmp_path / "recipes_test.json"
    for text in ("not json {", "[1, 2]", '{"pi@2": 3}'):
        path.write_text(text)
        assert recipes.read_scores(path) == {}
    path.write_text('{"pi@2": {"tokens": 64}}')
    assert recipes.read_scores(path) == {"pi@2": {"tokens": 64}}
    assert recipes.read_scores(tmp_path / "none.json") == {}
