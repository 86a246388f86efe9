"""lab/ladder.py: the rungs' facts against hand-computed values, and the whole ladder on one tiny rung."""
import json

import pytest
import torch

import train
from model import GPT, GPTConfig
from lab import ladder
from tests.conftest import held_out_corpus


def test_pair_turns_match_the_regimes_the_methods_were_built_for():
    # L * base^(-2i/d) / (2 pi): at L = 64, base 10,000, d = 32 the fastest pair turns 64 / 2 pi = 10.19 times and
    # 5 of 16 complete a period (pair 4: 10.19 * 10^-1 = 1.02; pair 5: 0.57); LLaMA-2 at 4k, d = 128: 46 of 64
    t = ladder.turns(64, 1e4, 32)
    assert t[0] == pytest.approx(10.186, abs=1e-3) and (t >= 1).sum() == 5 and t[4] == pytest.approx(1.0186, abs=1e-4)
    assert (ladder.turns(4096, 1e4, 128) >= 1).sum() == 46
    # a base of 40 gives LLaMA-2's share at L = 64: 10.19 * 40^(-i/16) >= 1 up to i = 10, so 11 of 16
    assert (ladder.turns(64, 40, 32) >= 1).sum() == 11


@pytest.fixture(scope="module")
def rung(tmp_path_factory):
    """One tiny rung: a model trained at 16 and its YaRN fine-tune at 64, on a corpus of 4 held-out documents."""
    data = held_out_corpus(tmp_path_factory, 1)
    root = tmp_path_factory.mktemp("ladder") / "tiny"
    shape = dict(dataset=str(data), n_layer=1, n_head=2, n_embd=32, wandb_log=False, device="cpu", eval_iters=1,
                 warmup_iters=2, learning_rate=3e-3)
    for name, kw in (("code_small_seed0", dict(block_size=16, batch_size=8, max_iters=20)),
                     ("code_yarn4x_seed0", dict(block_size=64, batch_size=2, max_iters=10, init_from=str(root / "code_small_seed0"),
                                                rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}))):
        cfg = dict(shape, out_dir=str(root / name), lr_decay_iters=kw["max_iters"], eval_interval=kw["max_iters"], **kw)
        train.main([f"--{k}={v!r}" if isinstance(v, dict) else f"--{k}={v}" for k, v in cfg.items()])
    return root


def test_the_ladder_chooses_on_dev_and_reports_test(rung, tmp_path):
    ladder.main([str(rung), "--seeds", "1", "--out", str(tmp_path), "--no-wandb"])
    page, result = (tmp_path / "ladder.md").read_text(), json.loads((tmp_path / "ladder.json").read_text())
    assert result["rungs"][0]["L"] == 16 and result["rungs"][0]["periods"] == 1  # head dim 16: 16 / 2 pi = 2.55 turns, then 0.81
    args = torch.load(rung / "code_small_seed0" / "ckpt.pt", weights_only=True)["model_args"]
    assert result["rungs"][0]["params"] == GPT(GPTConfig(**args)).num_params()  # the tied embedding counted once
    chosen = result["chosen"]["tiny"]
    assert set(chosen) == set(ladder.DEFAULTS) and all(c.split(":")[0] == m for m, c in chosen.items())
    for m, c in chosen.items():  # the chosen setting is the lowest on dev
        assert result["dev"]["tiny"][c] == min(v for s, v in result["dev"]["tiny"].items() if s.split(":")[0] == m)
    dev = json.loads((rung / "code_small_seed0" / "ladder_dev" / "extrapolation.json").read_text())
    test = json.loads((rung / "code_small_seed0" / "ladder_test" / "extrapolation.json").read_text())
    assert dev["docs"] == "dev" and test["docs"] == "test" and set(dev["units"]["windows 32"]).isdisjoint(test["units"]["windows 32"])
    rows = {(r["method"], r["eval_len"]) for r in result["rows"]}
    assert {("ceiling: full context - crop-L", 32), ("ceiling: full context - crop-L", 64), ("yarn", 64)} <= rows
    assert "| tiny | `ceiling: full context - crop-L` |" in page and (tmp_path / "ladder.png").stat().st_size > 0
    assert not (tmp_path / "shapes.md").exists()  # the published tables are lab/protocols.py's, in their protocols


