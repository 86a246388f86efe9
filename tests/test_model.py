"""The GPT: position encodings, KV cache, exact causal dynamic scaling, clear errors."""
import math

import pytest
import torch

from model import GPT, GPTConfig, KVCache, sinusoidal_embedding

L = 16


def tiny(**kw):
    torch.manual_seed(0)
    cfg = dict(block_size=L, vocab_size=97, n_layer=2, n_head=2, n_embd=32)
    return GPT(GPTConfig(**{**cfg, **kw})).eval()


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
])
def test_kv_cache_logits_equal_full_forward(kw):
    model = tiny(**kw)
    idx = torch.randint(0, 97, (2, L))
    full, _ = model(idx)
    assert torch.allclose(token_by_token(model, idx), full, atol=1e-5)
    # a prompt prefilled in one go, then continued
    cache = KVCache(model.config.n_layer)
    head, _ = model(idx[:, :5], cache=cache)
    tail, _ = model(idx[:, 5:], cache=cache)
    assert torch.allclose(torch.cat((head, tail), dim=1), full, atol=1e-5)


def test_causal_dynamic_equals_token_by_token_with_pre_rotation_key_cache():
    model = sharpen(tiny(rope_scaling={"rope_type": "dynamic", "factor": 1.0}))
    idx = torch.randint(0, 97, (2, 4 * L))
    causal, _ = model(idx, causal_dynamic=True)
    assert torch.allclose(causal, token_by_token(model, idx), atol=1e-4)
    # up to L it is the unscaled model; the sequence mode instead scales every token for length 4L
    assert torch.allclose(causal[:, :L], model(idx[:, :L])[0], atol=1e-5)
    assert not torch.allclose(causal, model(idx)[0], atol=1e-3)


def test_causal_dynamic_with_a_static_scaling_equals_the_plain_forward():
    model = tiny(rope_scaling={"rope_type": "yarn", "factor": 4.0})
    idx = torch.randint(0, 97, (1, 3 * L))
    assert torch.allclose(model(idx, causal_dynamic=True)[0], model(idx)[0], atol=1e-5)


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
    (dict(pos_emb="alibi"), "unknown pos_emb 'alibi'"),
    (dict(rope_layout="complex"), "unknown rope_layout 'complex'"),
    (dict(n_embd=30, n_head=2), "RoPE needs an even head dimension, got n_embd/n_head = 15"),
    (dict(rope_scaling={"rope_type": "yarn", "factor": 0.5}), "factor must be a number >= 1, got 0.5"),
])
def test_bad_model_config_is_a_clear_error(kw, message):
    with pytest.raises(ValueError, match=message):
        tiny(**kw)


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
    out = tiny().generate(torch.zeros(1, 3, dtype=torch.long), max_new_tokens=2 * L, top_k=5)
    assert out.shape == (1, 3 + 2 * L) and out.max() < 97
