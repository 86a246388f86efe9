"""Scalable-Softmax and interleaved NoPE / local RoPE layers (iRoPE, RNoPE-SWA), each against a computation written
out here or built from plain models with the same weights."""
import math
from pathlib import Path

import pytest
import torch

from config import load_config, model_config
from sample import KVCache
from positions import PositionArgs
from test_model import L, checked, sharpen, tiny  # pytest puts tests/ on the path

ROOT = Path(__file__).resolve().parents[1]

PI = {"rope_scaling": {"rope_type": "linear", "factor": 4.0}}


def same_weights(model, **kw):
    other = tiny(**kw)
    other.load_state_dict(model.state_dict())
    return other


# ----------------------------------------------------------------------------- SSMax

@pytest.mark.parametrize("window", [None, 5])
def test_ssmax_attention_is_softmax_of_s_h_log_n_times_the_scaled_scores(window):
    model = tiny(pos_emb="none", n_layer=1, ssmax=True)
    attn, T, H, D = model.transformer.h[0].attn, 12, 2, 16
    s = torch.tensor([0.3, 1.7])  # one scale per head
    with torch.no_grad():
        attn.ssmax.copy_(s)
    idx, out = torch.randint(0, 97, (2, T)), {}
    attn.register_forward_hook(lambda module, inputs, output: out.setdefault("y", output))
    with torch.no_grad():
        model(idx, method=PositionArgs(window=window))
        # by hand: query i sees the n_i keys j <= i (within the window); its logits are s_h * log(n_i) * q.k / sqrt(d)
        x = model.transformer.h[0].ln_1(model.transformer.wte(idx))
        q, k, v = (t.view(2, T, H, D).transpose(1, 2) for t in attn.c_attn(x).split(32, dim=2))
        i, j = torch.arange(T)[:, None], torch.arange(T)
        sees = (j <= i) & (j > i - window) if window else j <= i
        n = sees.sum(-1, keepdim=True).double()
        logits = s[:, None, None] * n.log() * (q @ k.transpose(-1, -2)) / math.sqrt(D)
        y = logits.float().masked_fill(~sees, -math.inf).softmax(-1) @ v
        expected = attn.c_proj(y.transpose(1, 2).reshape(2, T, 32))
    assert torch.allclose(out["y"], expected, atol=1e-6)


@pytest.mark.parametrize("pos_emb", ["rope", "alibi", "none"])
def test_ssmax_starts_as_softmax_at_the_training_length_and_as_logn_past_it(pos_emb):
    # s_h = 1 / log L: at n = L keys s_h * log n is 1, past it log n / log L, the log-n method's scale. With one layer
    # a position's logits depend on its own query only, so from position L - 1 on the two models agree
    ssmax = sharpen(tiny(pos_emb=pos_emb, n_layer=1, ssmax=True))
    assert torch.allclose(ssmax.transformer.h[0].attn.ssmax, torch.full((2,), 1 / math.log(L)))
    plain = tiny(pos_emb=pos_emb, n_layer=1)
    plain.load_state_dict({k: v for k, v in ssmax.state_dict().items() if not k.endswith("ssmax")})
    idx = torch.randint(0, 97, (2, 3 * L))
    got, logn = ssmax(idx)[0], plain(idx, method=PositionArgs(logn_len=L))[0]
    assert torch.allclose(got[:, L - 1:], logn[:, L - 1:], atol=1e-5)
    assert not torch.allclose(got[:, :L - 1], logn[:, :L - 1], atol=1e-3)  # fewer keys: softer than softmax


def test_ssmax_scales_are_learned_per_head_without_weight_decay():
    model = tiny(ssmax=True).train()
    x = torch.randint(0, 97, (4, L + 1))
    model(x[:, :-1], x[:, 1:])[1].backward()
    for block in model.transformer.h:
        assert block.attn.ssmax.shape == (2,) and (block.attn.ssmax.grad != 0).all()
    decayed = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu").param_groups[0]["params"]
    assert not any(p is block.attn.ssmax for block in model.transformer.h for p in decayed)


# ----------------------------------------------------------------------------- interleaved NoPE / local RoPE layers

def test_nope_every_k_makes_every_kth_layer_nope_counting_from_one():
    def kinds(k):
        return [block.attn.nope for block in tiny(n_layer=4, nope_every=k).transformer.h]
    assert kinds(4) == [False, False, False, True]  # iRoPE's pattern: the 4th layer of every 4
    assert kinds(2) == [False, True, False, True] and kinds(1) == [True] * 4 and kinds(5) == [False] * 4


def test_all_nope_layers_are_a_nope_model_and_no_nope_layer_is_a_rope_model():
    idx = torch.randint(0, 97, (2, 3 * L))
    every = sharpen(tiny(nope_every=1))
    nope = same_weights(every, pos_emb="none")
    assert torch.allclose(every(idx)[0], nope(idx)[0], atol=1e-6)
    assert torch.allclose(every(idx, method=PositionArgs(**PI))[0], nope(idx)[0], atol=1e-6)  # RoPE scaling: no RoPE layer to act on
    never = sharpen(tiny(nope_every=3))  # 2 layers: none is the 3rd
    assert torch.allclose(never(idx)[0], same_weights(never)(idx)[0], atol=1e-6)


@pytest.mark.parametrize("rope_window, method, rope_args, nope_args", [
    (None, {}, {}, {}),
    (None, PI, PI, {}),  # RoPE scaling acts on the RoPE layers only
    (None, {"window": 8}, {"window": 8}, {"window": 8}),  # window, sinks and logn on every layer
    (None, {"window": 8, "sinks": 4}, {"window": 8, "sinks": 4}, {"window": 8, "sinks": 4}),
    (None, {"logn_len": L}, {"logn_len": L}, {"logn_len": L}),
    (6, {}, {"window": 6}, {}),  # RNoPE-SWA: the RoPE layer sees its last 6 positions, the NoPE layer all
    (6, PI, {"window": 6, **PI}, {}),
    (6, {"window": 8}, {"window": 6}, {"window": 8}),  # the smaller window of the two
    (6, {"window": 4}, {"window": 4}, {"window": 4}),
    (6, {"window": 8, "sinks": 2}, {"window": 6}, {"window": 8, "sinks": 2}),  # sinks only with the method's window
    (6, {"window": 4, "sinks": 2}, {"window": 4, "sinks": 2}, {"window": 4, "sinks": 2}),
    (6, {"logn_len": L}, {"window": 6}, {"logn_len": L}),  # a query that sees at most 6 <= L keys is not scaled
])
def test_a_hybrid_is_a_rope_models_layer_then_a_nope_models_layer(rope_window, method, rope_args, nope_args):
    # nope_every=2 with 2 layers: layer 1 RoPE, layer 2 NoPE. Written out with two plain models of the same weights:
    # layer 1 of a RoPE model (rope_window as its method window), its output fed into layer 2 of a NoPE model
    hybrid = sharpen(tiny(nope_every=2, rope_window=rope_window))
    rope, nope = same_weights(hybrid), same_weights(hybrid, pos_emb="none")
    idx, first = torch.randint(0, 97, (2, 3 * L)), {}
    rope.transformer.h[0].register_forward_hook(lambda module, inputs, output: first.setdefault("x", output))
    rope_logits, _ = rope(idx, method=PositionArgs(**rope_args))
    nope.transformer.h[0].register_forward_hook(lambda module, inputs, output: first["x"])  # replaces its layer 1
    expected, _ = nope(idx, method=PositionArgs(**nope_args))
    logits, _ = hybrid(idx, method=PositionArgs(**method))
    assert torch.allclose(logits, expected, atol=1e-5)
    assert not torch.allclose(logits, rope_logits, atol=1e-3)  # layer 2 is not RoPE's


def test_a_rope_window_layer_predicts_from_its_last_rope_window_tokens():
    # one layer: the output at i depends on its keys and their distances only, so with rope_window w it is the last
    # output of a plain forward over tokens i - w + 1 .. i (fewer than w tokens: no window to apply)
    w, idx = 6, torch.randint(0, 97, (2, 3 * L))
    local = sharpen(tiny(n_layer=1, rope_window=w))
    logits, _ = local(idx)
    for i in (0, w - 1, w, L, 3 * L - 1):
        assert torch.allclose(logits[:, i], local(idx[:, max(0, i - w + 1):i + 1])[0][:, -1], atol=1e-5), i
    assert not torch.allclose(logits, same_weights(local, n_layer=1)(idx)[0], atol=1e-3)


@pytest.mark.parametrize("method", [{}, {"window": L, "sinks": 4}, {"window": 4, "sinks": 2}, PI, {"logn_len": L},
                                    {"rope_scaling": {"rope_type": "dynamic", "factor": 1.0}}])
def test_hybrid_with_ssmax_through_the_kv_cache_equals_the_full_forward(method, one_thread):
    model = sharpen(tiny(n_layer=4, nope_every=2, rope_window=6, ssmax=True))
    idx = torch.randint(0, 97, (2, 3 * L))
    full, _ = model(idx, method=PositionArgs(causal_dynamic="rope_scaling" in method and "sinks" not in method, **method))
    cache = KVCache(model.config.n_layer)
    steps = torch.cat([model(idx[:, t:t + 1], cache=cache, method=PositionArgs(**method))[0] for t in range(idx.size(1))], dim=1)
    assert torch.allclose(steps, full, atol=1e-5)


@pytest.mark.parametrize("kw, message", [
    (dict(pos_emb="none", nope_every=2), r"nope_every=2 sets the layers of a RoPE model \(iRoPE, RNoPE-SWA\); it needs "
                                         "pos_emb='rope', not 'none'"),
    (dict(pos_emb="alibi", rope_window=64), "rope_window=64 sets the layers of a RoPE model"),
    (dict(nope_every=0), r"nope_every must be an integer >= 1 \(or None\), got 0"),
    (dict(rope_window=2.5), "rope_window must be an integer >= 1"),
    (dict(nope_every=True), "nope_every must be an integer >= 1"),
])
def test_bad_interleaving_is_a_clear_error(kw, message):
    with pytest.raises(ValueError, match=message):
        checked(**kw)


@pytest.mark.parametrize("name, keys", [
    ("ssmax_small", dict(pos_emb="rope", ssmax=True)), ("irope_small", dict(pos_emb="rope", nope_every=4)),
    ("rnope_swa_small", dict(pos_emb="rope", nope_every=4, rope_window=64)),
    ("drope_small", dict(pos_emb="none", init_from="out/rope_small", block_size=256, max_iters=150)),
])
def test_the_small_configs_load_and_differ_from_the_defaults_as_they_say(name, keys):
    config = load_config([str(ROOT / "configs" / f"{name}.py")])
    assert {k: config[k] for k in keys} == keys and config["n_layer"] == 4
    model_config(config, vocab_size=2048)
