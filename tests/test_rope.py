"""RoPE math, each formula checked against an independent computation or a property."""
import math

import pytest
import torch

from rope import apply_rope, rope_cos_sin, rope_frequencies

D, BASE, L = 32, 10000.0, 256
STATIC = [None,
          {"rope_type": "linear", "factor": 4.0},
          {"rope_type": "ntk", "factor": 4.0},
          {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": L}]


def rotate(x, pos, scaling=None, layout="half", dim=D):
    inv_freq, factor = rope_frequencies(dim, BASE, scaling)
    cos, sin = rope_cos_sin(inv_freq, torch.tensor([pos]), factor)
    return apply_rope(x.double(), cos.double(), sin.double(), layout)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("scaling", STATIC)
def test_score_depends_only_on_relative_position(scaling, layout):
    q, k = torch.randn(2, D, dtype=torch.float64)
    for m, n in [(5, 2), (300, 120), (1000, 10)]:
        ref = (rotate(q, m, scaling, layout) * rotate(k, n, scaling, layout)).sum()
        for shift in (1, 37, 2000):
            moved = (rotate(q, m + shift, scaling, layout) * rotate(k, n + shift, scaling, layout)).sum()
            assert torch.allclose(ref, moved, atol=1e-3)  # float32 angles, as in transformers


def test_interleaved_rotation_is_complex_multiplication_by_exp_i_m_theta():
    x, m = torch.randn(D, dtype=torch.float64), 7
    theta = torch.tensor([BASE ** (-2 * i / D) for i in range(D // 2)], dtype=torch.float64)
    expected = torch.view_as_real(torch.view_as_complex(x.view(-1, 2)) * torch.exp(1j * m * theta)).flatten()
    assert torch.allclose(rotate(x, m, layout="interleaved"), expected, atol=1e-5)


def test_half_and_interleaved_give_the_same_scores_up_to_a_channel_permutation():
    q, k = torch.randn(2, D, dtype=torch.float64)
    perm = torch.stack([torch.arange(D // 2), torch.arange(D // 2) + D // 2], dim=1).flatten()  # (i, i+d/2) -> (2i, 2i+1)
    for m, n in [(3, 0), (500, 17)]:
        half = (rotate(q, m) * rotate(k, n)).sum()
        inter = (rotate(q[perm], m, layout="interleaved") * rotate(k[perm], n, layout="interleaved")).sum()
        assert torch.allclose(half, inter, atol=1e-3)


def test_linear_equals_positions_divided_by_factor():
    inv_freq, _ = rope_frequencies(D, BASE, {"rope_type": "linear", "factor": 4.0})
    base_freq, _ = rope_frequencies(D, BASE)
    pos = torch.arange(0, 64)
    assert torch.allclose(rope_cos_sin(inv_freq, pos)[0], rope_cos_sin(base_freq, pos / 4.0)[0], atol=1e-6)


@pytest.mark.parametrize("rope_type", ["linear", "ntk", "dynamic", "yarn"])
def test_factor_one_equals_default(rope_type):
    scaling = {"rope_type": rope_type, "factor": 1.0, "original_max_position_embeddings": L}
    inv_freq, attention = rope_frequencies(D, BASE, scaling, seq_len=4 * L)
    if rope_type == "dynamic":  # here factor is the NTK multiplier a; a = 1 still scales with length
        inv_freq, attention = rope_frequencies(D, BASE, scaling, seq_len=L)
    assert torch.allclose(inv_freq, rope_frequencies(D, BASE)[0]) and attention == 1.0


def test_ntk_base_by_hand():
    # d = 4, base = 100, s = 4: base' = 100 * 4^(4/2) = 1600, inv_freq = [1, 1600^(-1/2)]
    inv_freq, _ = rope_frequencies(4, 100.0, {"rope_type": "ntk", "factor": 4.0})
    assert torch.allclose(inv_freq, torch.tensor([1.0, 0.025]))


def test_ntk_interpolates_lowest_frequency_by_factor_and_keeps_highest():
    inv_freq, _ = rope_frequencies(D, BASE, {"rope_type": "ntk", "factor": 8.0})
    default, _ = rope_frequencies(D, BASE)
    assert inv_freq[0] == default[0]
    assert torch.isclose(inv_freq[-1], default[-1] / 8.0, rtol=1e-5)


def test_dynamic_equals_default_up_to_original_length():
    scaling = {"rope_type": "dynamic", "factor": 1.0, "original_max_position_embeddings": L}
    for n in (1, L // 2, L):
        assert torch.equal(rope_frequencies(D, BASE, scaling, seq_len=n)[0], rope_frequencies(D, BASE)[0])


def test_dynamic_beyond_original_length_is_ntk_with_the_length_ratio():
    # plain dynamic NTK (a = 1): base * (n/L)^(d/(d-2)); a = 2: scale (2n/L - 1)
    for a, n, scale in [(1.0, 4 * L, 4.0), (2.0, 3 * L, 5.0)]:
        dyn, _ = rope_frequencies(D, BASE, {"rope_type": "dynamic", "factor": a, "original_max_position_embeddings": L}, seq_len=n)
        ntk, _ = rope_frequencies(D, BASE, {"rope_type": "ntk", "factor": scale})
        assert torch.allclose(dyn, ntk)


def test_yarn_keeps_fast_dimensions_and_interpolates_slow_ones_exactly_like_pi():
    # LLaMA-like: d = 128, L = 4096. A pair rotating more than beta_fast = 32 times over L keeps its
    # frequency; one rotating less than beta_slow = 1 time is exactly PI; the band between is a blend.
    d, orig, s = 128, 4096, 16.0
    yarn, _ = rope_frequencies(d, BASE, {"rope_type": "yarn", "factor": s, "original_max_position_embeddings": orig})
    default, _ = rope_frequencies(d, BASE)
    rotations = [orig / (2 * math.pi * BASE ** (2 * i / d)) for i in range(d // 2)]
    fast = [i for i, r in enumerate(rotations) if r > 32]
    slow = [i for i, r in enumerate(rotations) if r < 1]
    assert len(fast) > 10 and len(slow) > 10
    assert torch.equal(yarn[fast], default[fast])
    assert torch.allclose(yarn[slow], default[slow] / s)
    band = [i for i in range(d // 2) if i not in fast + slow]
    assert all(default[i] / s <= yarn[i] <= default[i] for i in band)
    assert (yarn[band] < default[band]).any()


def test_yarn_attention_factor_scales_logits_by_its_square():
    s = 8.0
    _, factor = rope_frequencies(D, BASE, {"rope_type": "yarn", "factor": s, "original_max_position_embeddings": L})
    assert factor == pytest.approx(0.1 * math.log(8.0) + 1)  # 1.2079...
    q, k = torch.randn(2, D, dtype=torch.float64)
    yarn = {"rope_type": "yarn", "factor": s, "original_max_position_embeddings": L}
    ratio = (rotate(q, 0, yarn) * rotate(k, 0, yarn)).sum() / (q * k).sum()
    assert ratio.item() == pytest.approx(factor ** 2, rel=1e-5)


@pytest.mark.parametrize("scaling, message", [
    ({"rope_type": "nope"}, "unknown rope_type 'nope'"),
    ({"rope_type": "linear", "factor": 0.5}, "factor must be a number >= 1, got 0.5"),
    ({"rope_type": "yarn", "factor": 2.0}, "needs 'original_max_position_embeddings'"),
])
def test_bad_scaling_is_a_clear_error(scaling, message):
    with pytest.raises(ValueError, match=message):
        rope_frequencies(D, BASE, scaling)


def test_odd_head_dim_is_a_clear_error():
    with pytest.raises(ValueError, match="even head dimension, got head_dim=33"):
        rope_frequencies(33, BASE)
