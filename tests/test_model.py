"""The GPT: position encodings, KV cache, exact causal dynamic scaling, clear errors."""
import math

import pytest
import torch

from eval.methods import applicable, forward_args, unavailable
from eval.score import score_rows
from config import gpt_config
from model import GPT, GPTConfig
from sample import KVCache, generate
from positions import PositionArgs, Positions, alibi_bias, alibi_slopes, sinusoidal_embedding

L = 16


def tiny(**kw):
    torch.manual_seed(0)
    cfg = dict(block_size=L, vocab_size=97, n_layer=2, n_head=2, n_embd=32)
    return GPT(GPTConfig(**{**cfg, **kw})).eval()


def checked(**kw):
    """tiny's config as a user's keys come in: checked once, by config.gpt_config (the model trusts its config)."""
    return gpt_config({**dict(block_size=L, vocab_size=97, n_layer=2, n_head=2, n_embd=32), **kw})



def sharpen(model):
    # random init attends almost uniformly; scaled q/k make the position encoding matter
    with torch.no_grad():
        for block in model.transformer.h:
            block.attn.c_attn.weight[:2 * model.config.n_embd] *= 20
    return model


def token_by_token(model, idx):
    cache = KVCache(model.config.n_layer)
    return torch.cat([model(idx[:, t:t + 1], cache=cache)[0] for t in range(idx.size(1))], dim=1)


@pytest.mark.parametrize("kw", [
    dict(pos_emb="learned"), dict(pos_emb="sinusoidal"), dict(pos_emb="none"), dict(pos_emb="rope"),
    dict(pos_emb="rope", rope_layout="interleaved"),
    dict(pos_emb="rope", rope_scaling={"rope_type": "yarn", "factor": 4.0}),
    dict(pos_emb="rope", rope_scaling={"rope_type": "linear", "factor": 2.0}),
    dict(pos_emb="alibi"), dict(pos_emb="rope", rope_fraction=0.5),
    dict(pos_emb="rope", nope_every=2), dict(pos_emb="rope", nope_every=2, rope_window=5),  # iRoPE, RNoPE-SWA
    dict(pos_emb="rope", rope_window=5), dict(pos_emb="rope", ssmax=True), dict(pos_emb="alibi", ssmax=True),
    dict(pos_emb="learned", ssmax=True), dict(pos_emb="sinusoidal", ssmax=True), dict(pos_emb="none", ssmax=True),
])
def test_kv_cache_logits_equal_full_forward(kw, one_thread):
    model = tiny(**kw)
    idx = torch.randint(0, 97, (2, L))
    full, _ = model(idx)
    assert torch.allclose(token_by_token(model, idx), full, atol=1e-5)
    # a prompt prefilled in one go, then continued
    cache = KVCache(model.config.n_layer)
    head, _ = model(idx[:, :5], cache=cache)
    tail, _ = model(idx[:, 5:], cache=cache)
    assert torch.allclose(torch.cat((head, tail), dim=1), full, atol=1e-5)


def test_logits_of_the_last_positions_only_are_those_of_the_full_forward():
    model, idx = tiny(pos_emb="alibi"), torch.randint(0, 97, (2, L))
    full, _ = model(idx)
    last, _ = model(idx, last=3)
    assert last.shape == (2, 3, 97) and torch.allclose(last, full[:, -3:], atol=1e-6, rtol=0)  # a matmul over fewer rows


def test_causal_dynamic_equals_token_by_token_with_pre_rotation_key_cache(one_thread):
    model = sharpen(tiny(rope_scaling={"rope_type": "dynamic", "factor": 1.0}))
    idx = torch.randint(0, 97, (2, 4 * L))
    causal, _ = model(idx, method=PositionArgs(causal_dynamic=True))
    assert torch.allclose(causal, token_by_token(model, idx), atol=1e-4)
    # up to L it is the unscaled model; the sequence mode instead scales every token for length 4L
    assert torch.allclose(causal[:, :L], model(idx[:, :L])[0], atol=1e-5)
    assert not torch.allclose(causal, model(idx)[0], atol=1e-3)


def test_causal_dynamic_with_a_static_scaling_equals_the_plain_forward():
    model = tiny(rope_scaling={"rope_type": "yarn", "factor": 4.0})
    idx = torch.randint(0, 97, (1, 3 * L))
    assert torch.allclose(model(idx, method=PositionArgs(causal_dynamic=True))[0], model(idx)[0], atol=1e-5)


def test_half_and_interleaved_models_agree_when_q_k_channels_are_permuted():
    half, inter = tiny(), tiny(rope_layout="interleaved")
    hd, C = 16, 32
    perm = torch.stack([torch.arange(hd // 2), torch.arange(hd // 2) + hd // 2], dim=1).flatten()
    rows = torch.cat([h * hd + perm for h in range(2)])  # per head, within q and within k
    state = sharpen(half).state_dict()
    for i in range(2):
        w = state[f"transformer.h.{i}.attn.c_attn.weight"] = state[f"transformer.h.{i}.attn.c_attn.weight"].clone()
        w[:C], w[C:2 * C] = w[:C][rows], w[C:2 * C][rows]
    inter.load_state_dict(state)
    idx = torch.randint(0, 97, (2, 3 * L))
    assert torch.allclose(half(idx)[0], inter(idx)[0], atol=1e-4)
    half.load_state_dict(inter.state_dict())  # same weights without the permutation: different model
    assert not torch.allclose(half(idx)[0], inter(idx)[0], atol=1e-2)


def test_sinusoidal_table_by_hand():
    pe = sinusoidal_embedding(torch.arange(3), 4)  # PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(...)
    expected = [[0, 1, 0, 1], [math.sin(1), math.cos(1), math.sin(0.01), math.cos(0.01)],
                [math.sin(2), math.cos(2), math.sin(0.02), math.cos(0.02)]]
    assert torch.allclose(pe, torch.tensor(expected), atol=1e-6)


def test_learned_positions_past_the_table_are_a_clear_error():
    with pytest.raises(ValueError, match="learned position table has 16 entries; cannot encode position 16"):
        tiny(pos_emb="learned")(torch.zeros(1, L + 1, dtype=torch.long))


def test_rope_models_run_past_the_training_length():
    logits, _ = tiny()(torch.zeros(1, 4 * L, dtype=torch.long))
    assert logits.shape == (1, 4 * L, 97) and torch.isfinite(logits).all()


@pytest.mark.parametrize("kw, message", [
    (dict(pos_emb="xpos"), "unknown pos_emb 'xpos'; allowed: learned, sinusoidal, rope, alibi, none"),
    (dict(pos_emb="alibi", rope_scaling={"rope_type": "linear", "factor": 2.0}),
     "given to pos_emb='alibi': ALiBi has no rotation to scale"),
    (dict(pos_emb="none", rope_fraction=0.5), "rope_fraction=0.5 is p-RoPE's; it needs pos_emb='rope', not 'none'"),
    (dict(rope_fraction=0.0), r"rope_fraction must be a number in \(0, 1\] \(or None: every pair rotates\), got 0.0"),
    (dict(rope_fraction=1.5), r"rope_fraction must be a number in \(0, 1\]"),
    (dict(rope_fraction="half"), r"rope_fraction must be a number in \(0, 1\]"),
    (dict(rope_fraction=0.01), r"rope_fraction=0.01 rotates round\(0.01 \* 8\) = 0 of the 8 pairs"),
    (dict(rope_layout="complex"), "unknown rope_layout 'complex'"),
    (dict(n_embd=30, n_head=2), "RoPE needs an even head dimension, got n_embd/n_head = 15"),
    (dict(rope_scaling={"rope_type": "yarn", "factor": 0.5}), "factor must be a number >= 1, got 0.5"),
])
def test_bad_model_config_is_a_clear_error(kw, message):
    with pytest.raises(ValueError, match=message):
        checked(**kw)


def test_alibi_slopes_by_hand():
    # a power of two: 2^(-8/n), 2^(-16/n), ..., 2^(-8)
    assert alibi_slopes(8).tolist() == [1 / 2, 1 / 4, 1 / 8, 1 / 16, 1 / 32, 1 / 64, 1 / 128, 1 / 256]
    assert alibi_slopes(1).tolist() == [1 / 256]
    # 6 heads: the 4 of n = 4 (1/4, 1/16, 1/64, 1/256), then from n = 8's (1/2, 1/4, ..., 1/256) every other
    # one, 1/2, 1/8, 1/32, 1/128, the first 6 - 4 = 2 of them
    assert alibi_slopes(6).tolist() == [1 / 4, 1 / 16, 1 / 64, 1 / 256, 1 / 2, 1 / 8]
    # 12 heads: the 8 of n = 8, then n = 16's 2^-0.5, 2^-1, 2^-1.5, ... taken 1st, 3rd, ...: 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5
    expected = [2.0 ** -k for k in (1, 2, 3, 4, 5, 6, 7, 8, 0.5, 1.5, 2.5, 3.5)]
    assert torch.allclose(alibi_slopes(12), torch.tensor(expected), rtol=1e-7, atol=0)


def test_alibi_bias_matrix_by_hand():
    inf = float("inf")
    bias = alibi_bias(torch.tensor([0.5, 0.25]), 3, 3, None, "cpu")
    assert bias.tolist() == [[[0, -inf, -inf], [-0.5, 0, -inf], [-1, -0.5, 0]],
                             [[0, -inf, -inf], [-0.25, 0, -inf], [-0.5, -0.25, 0]]]
    # with a cache: the 2 newest of 5 positions (queries 3 and 4), and a window of 2 (the crop baseline)
    bias = alibi_bias(torch.tensor([0.5]), 2, 5, 2, "cpu")
    assert bias.tolist() == [[[-inf, -inf, -0.5, 0, -inf], [-inf, -inf, -inf, -0.5, 0]]]


def test_alibi_attention_is_softmax_of_scaled_scores_plus_the_bias():
    model = tiny(pos_emb="alibi", n_head=4, n_embd=32)
    attn, T, H, D = model.transformer.h[0].attn, 6, 4, 8
    slopes = [2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8]
    x = torch.randn(2, T, 32)
    q, k, v = (t.view(2, T, H, D).transpose(1, 2) for t in attn.c_attn(x).split(32, dim=2))
    bias = torch.tensor([[[-slopes[h] * (i - j) if j <= i else -math.inf for j in range(T)] for i in range(T)]
                         for h in range(H)])
    y = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(D) + bias, dim=-1) @ v
    expected = attn.c_proj(y.transpose(1, 2).reshape(2, T, 32))
    with torch.no_grad():
        out = attn(x, Positions(mask=alibi_bias(alibi_slopes(H), T, T, None, "cpu")), None)
    assert torch.allclose(out, expected, atol=1e-6)


def test_alibi_biases_matter_and_run_past_the_training_length_and_through_the_cache_with_a_window(one_thread):
    alibi, nope = tiny(pos_emb="alibi"), tiny(pos_emb="none")  # the same weights: ALiBi has no parameters
    idx = torch.randint(0, 97, (2, 4 * L))
    logits, _ = sharpen(alibi)(idx)
    assert torch.isfinite(logits).all() and not torch.allclose(logits, sharpen(nope)(idx)[0], atol=1e-3)
    crop, _ = alibi(idx, method=PositionArgs(window=L))
    assert torch.allclose(crop[:, :L], logits[:, :L], atol=1e-5) and not torch.allclose(crop, logits, atol=1e-3)
    cache = KVCache(alibi.config.n_layer)
    head, _ = alibi(idx[:, :L], cache=cache, method=PositionArgs(window=L))
    steps = [alibi(idx[:, t:t + 1], cache=cache, method=PositionArgs(window=L))[0] for t in range(L, 4 * L)]
    assert torch.allclose(torch.cat([head] + steps, dim=1), crop, atol=1e-5)


def test_alibi_is_evaluated_past_the_training_length_with_the_methods_that_act_on_attention():
    model = tiny(pos_emb="alibi")
    assert (applicable(("none", "crop", "window", "sinks", "pi", "ntk", "yarn", "logn", "ntk+logn"), "alibi")
            == ["none", "crop", "window", "sinks", "logn"])
    assert unavailable(model.config, "none", 16 * L) is None and unavailable(model.config, "sinks", 16 * L) is None
    assert "rescales RoPE" in unavailable(model.config, "yarn", 16 * L)
    assert "masks relative positions" in unavailable(tiny(pos_emb="sinusoidal").config, "window", 2 * L)


def test_p_rope_with_every_pair_is_rope_and_with_half_differs():
    idx = torch.randint(0, 97, (2, 3 * L))
    rope = sharpen(tiny())(idx)[0]
    assert torch.equal(sharpen(tiny(rope_fraction=1.0))(idx)[0], rope)
    assert not torch.allclose(sharpen(tiny(rope_fraction=0.5))(idx)[0], rope, atol=1e-3)


def test_a_few_steps_lower_the_loss_on_a_tiny_batch():
    model = tiny().train()
    opt = model.configure_optimizers(0.1, 3e-3, (0.9, 0.95), "cpu")
    x = torch.randint(0, 97, (4, L + 1))
    losses = []
    for _ in range(20):
        _, loss = model(x[:, :-1], x[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0]


def test_generate_extends_the_prompt():
    out = generate(tiny(), torch.zeros(1, 3, dtype=torch.long), max_new_tokens=2 * L, top_k=5)
    assert out.shape == (1, 3 + 2 * L) and out.max() < 97


@pytest.mark.parametrize("pos_emb", ["rope", "alibi", "none"])
def test_sinks_predict_as_streaming_llm_cache_that_evicts_and_reindexes(pos_emb):
    # StreamingLLM (Xiao et al. 2023) by hand: for query i the cache holds the first 4 tokens and the last L - 4,
    # at cache positions 0 .. L-1. With one layer a key depends only on its token and its cache position, so
    # that cache is a plain forward over those L tokens: the query's logits are that forward's last ones.
    model = sharpen(tiny(pos_emb=pos_emb, n_layer=1))
    idx, sinks = torch.randint(0, 97, (2, 4 * L)), 4
    logits, _ = model(idx, method=PositionArgs(window=L, sinks=sinks))
    for i in (L - 1, L, L + 3, 2 * L + 5, 4 * L - 1):
        cache = torch.cat((idx[:, :sinks], idx[:, max(sinks, i - L + sinks + 1):i + 1]), dim=1)
        assert torch.allclose(logits[:, i], model(cache)[0][:, -1], atol=1e-5), i
    # differs from the plain window (the sinks are seen) and from none (far keys are not)
    assert not torch.allclose(logits, model(idx, method=PositionArgs(window=L))[0], atol=1e-3)
    assert not torch.allclose(logits, model(idx)[0], atol=1e-3)


@pytest.mark.parametrize("pos_emb", ["rope", "alibi"])
def test_sinks_through_the_kv_cache_equal_the_full_forward(pos_emb, one_thread):
    model, idx = sharpen(tiny(pos_emb=pos_emb)), torch.randint(0, 97, (1, 3 * L))
    cache = KVCache(model.config.n_layer)
    steps = torch.cat([model(idx[:, t:t + 1], cache=cache, method=PositionArgs(window=L, sinks=4))[0] for t in range(idx.size(1))], dim=1)
    assert torch.allclose(steps, model(idx, method=PositionArgs(window=L, sinks=4))[0], atol=1e-5)


def test_crop_is_truncation_in_scoring_and_in_generation_alike():
    # one home: PositionArgs(crop=L) scores a long row as its last L tokens from position 0, and samples as nanoGPT does
    model = tiny()
    crop = forward_args("crop", 4 * L, L, L)
    assert crop == PositionArgs(crop=L)
    rows = torch.randint(0, 97, (2, 4 * L + 1)).numpy()
    assert (score_rows(model, rows, method=crop)[0] == score_rows(model, rows[:, -(L + 1):])[0]).all()
    out = generate(model, torch.zeros(1, 3, dtype=torch.long), 2 * L, top_k=1, method=crop)
    idx = torch.zeros(1, 3, dtype=torch.long)
    with torch.no_grad():
        for _ in range(2 * L):
            idx = torch.cat((idx, model(idx[:, -L:])[0][:, -1:].argmax(-1)), dim=1)
    assert torch.equal(out, idx)


def test_a_config_without_train_len_scales_from_block_size():
    assert GPTConfig(block_size=32).train_len == 32 and GPTConfig(block_size=64, train_len=16).train_len == 16
