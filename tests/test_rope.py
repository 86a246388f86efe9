"""RoPE math, each formula checked against an independent computation or a property."""
import math
import re

import pytest
import torch

from model import GPTConfig
from rope import apply_rope, check_scaling, rope_cos_sin, rope_frequencies

D, BASE, L = 32, 10000.0, 256
STATIC = [None,
          {"rope_type": "linear", "factor": 4.0},
          {"rope_type": "ntk", "factor": 4.0},
          {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": L}]


def rotate(x, pos, scaling=None, layout="half", dim=D):
    inv_freq, factor = rope_frequencies(dim, BASE, scaling)
    cos, sin = rope_cos_sin(inv_freq, torch.tensor([pos]), factor, layout)
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


def llama3_by_definition(d, base, orig, factor, low_freq_factor, high_freq_factor):
    # Llama 3.1's rule pair by pair, in float64 Python math; also returns which region each pair is in
    freqs, regions = [], []
    for i in range(d // 2):
        freq = base ** (-2 * i / d)
        wavelen = 2 * math.pi / freq
        if wavelen < orig / high_freq_factor:
            freqs.append(freq), regions.append("kept")
        elif wavelen > orig / low_freq_factor:
            freqs.append(freq / factor), regions.append("interpolated")
        else:
            smooth = (orig / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            freqs.append((1 - smooth) * freq / factor + smooth * freq), regions.append("blended")
    return torch.tensor(freqs, dtype=torch.float64), regions


@pytest.mark.parametrize("low_freq_factor, high_freq_factor", [(1.0, 4.0), (2.0, 8.0)])
def test_llama3_matches_its_definition_pair_by_pair(low_freq_factor, high_freq_factor):
    scaling = {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": L,
               "low_freq_factor": low_freq_factor, "high_freq_factor": high_freq_factor}
    expected, regions = llama3_by_definition(D, BASE, L, 8.0, low_freq_factor, high_freq_factor)
    assert {"kept", "blended", "interpolated"} <= set(regions)  # every branch is exercised
    inv_freq, attention = rope_frequencies(D, BASE, scaling)
    assert torch.allclose(inv_freq.double(), expected, rtol=1e-6, atol=0) and attention == 1.0


def test_llama3_keeps_highest_frequency_and_divides_lowest_by_factor():
    scaling = {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": L}
    inv_freq, _ = rope_frequencies(D, BASE, scaling)
    default, _ = rope_frequencies(D, BASE)  # low_freq_factor 1 and high_freq_factor 4 by default
    assert inv_freq[0] == default[0] == 1.0
    assert torch.isclose(inv_freq[-1], default[-1] / 8.0, rtol=1e-6)


def test_ntk_by_parts_is_yarn_frequencies_without_the_temperature():
    s = 8.0
    yarn = {"rope_type": "yarn", "factor": s, "original_max_position_embeddings": L}
    yarn_freq, yarn_attention = rope_frequencies(D, BASE, yarn)
    parts_freq, parts_attention = rope_frequencies(D, BASE, {**yarn, "attention_factor": 1.0})
    assert torch.equal(parts_freq, yarn_freq)
    assert parts_attention == 1.0
    assert yarn_attention == pytest.approx(0.1 * math.log(s) + 1, rel=1e-12)


def test_rope_parameters_dict_carries_the_base():
    # transformers v5: the base travels in the dict as rope_theta, among keys this repo does not use
    params = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": L, "rope_theta": 500000.0,
              "partial_rotary_factor": 1.0, "mscale": 1.0}
    without_theta = {k: v for k, v in params.items() if k != "rope_theta"}
    assert torch.equal(rope_frequencies(D, BASE, params)[0], rope_frequencies(D, 500000.0, without_theta)[0])


def test_default_rope_parameters_with_theta_is_the_default_at_that_base():
    params = {"rope_type": "default", "rope_theta": 500000.0}
    assert check_scaling(params) == ("default", 1.0)
    inv_freq, attention = rope_frequencies(D, BASE, params)
    expected = torch.tensor([500000.0 ** (-2 * i / D) for i in range(D // 2)], dtype=torch.float64)
    assert torch.allclose(inv_freq.double(), expected, rtol=1e-6, atol=0) and attention == 1.0


def test_legacy_type_key_is_rope_type():
    assert torch.equal(rope_frequencies(D, BASE, {"type": "linear", "factor": 4.0})[0],
                       rope_frequencies(D, BASE, {"rope_type": "linear", "factor": 4.0})[0])


def yarn_by_formula(low, high, d=D, base=BASE, factor=8.0):
    # inv_freq_i = theta_i (1 - ramp_i) + theta_i / factor * ramp_i, ramp_i = clamp((i - low) / (high - low), 0, 1)
    freqs = []
    for i in range(d // 2):
        theta, ramp = base ** (-2 * i / d), min(max((i - low) / (high - low), 0.0), 1.0)
        freqs.append(theta * (1 - ramp) + theta / factor * ramp)
    return torch.tensor(freqs, dtype=torch.float64)


def test_yarn_ramp_at_every_pair():
    # d = 32, base = 1e4, L = 256: correction dim(r) = d ln(L / (2 pi r)) / (2 ln base) = 16 ln(40.744 / r) / 9.2103
    #   beta_fast = 32: 16 ln(1.27324) / 9.2103 = 16 * 0.241564 / 9.2103 = 0.41964 -> low = max(floor, 0) = 0
    #   beta_slow = 1:  16 ln(40.7437) / 9.2103 = 16 * 3.707300 / 9.2103 = 6.44024 -> high = min(ceil, 31) = 7
    # Neither is an integer, so floor and ceil differ at both ends and a swapped rounding changes the ramp.
    for r, dim in [(32, 0.41964), (1, 6.44024)]:
        assert D * math.log(L / (2 * math.pi * r)) / (2 * math.log(BASE)) == pytest.approx(dim, abs=1e-5)
    scaling = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": L}
    assert torch.allclose(rope_frequencies(D, BASE, scaling)[0].double(), yarn_by_formula(0, 7), rtol=1e-6, atol=0)
    # "truncate": False (transformers) keeps the exact bounds
    exact = rope_frequencies(D, BASE, {**scaling, "truncate": False})[0].double()
    assert torch.allclose(exact, yarn_by_formula(0.41964047, 6.44024039), rtol=1e-6, atol=0)


@pytest.mark.parametrize("scaling, message", [
    ({"rope_type": "nope"}, "unknown rope_type 'nope'"),
    ({"rope_type": "linear", "factor": 0.5}, "factor must be a number >= 1, got 0.5"),
    ({"rope_type": "linear", "factor": "4"}, "factor must be a number >= 1, got '4'"),
    ({"rope_type": "yarn", "factor": 2.0}, "needs 'original_max_position_embeddings'"),
    ({"rope_type": "llama3", "factor": 8.0}, "needs 'original_max_position_embeddings'"),
    ({"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": L, "low_freq_factor": 4.0,
      "high_freq_factor": 1.0}, "high_freq_factor > low_freq_factor > 0, got high_freq_factor=1.0, low_freq_factor=4"),
    ({"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": L, "low_freq_factor": 0},
     "high_freq_factor > low_freq_factor > 0, got high_freq_factor=4.0, low_freq_factor=0"),
    ({"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": L, "attention_factor": 0},
     "attention_factor must be a number > 0, got 0"),
    ({"rope_type": "default", "rope_theta": "1e4"},
     "rope_theta (the RoPE base) must be a number > 1, got '1e4'"),
    ({"rope_type": "default", "rope_theta": 1}, "rope_theta (the RoPE base) must be a number > 1, got 1"),
    ("yarn", "rope_scaling must be a dict or None, got 'yarn'; e.g. {'rope_type': 'yarn', 'factor': 4.0"),
])
def test_bad_scaling_is_a_clear_error(scaling, message):
    # validated once where a dict comes in (a config, a command's options), not in every forward
    with pytest.raises(ValueError, match=re.escape(message)) as error:
        check_scaling(scaling)
    assert "\n" not in str(error.value)
    if "original_max" not in message:  # a config fills the original length in with its block_size
        with pytest.raises(ValueError, match=re.escape(message)):
            GPTConfig(block_size=L, n_embd=2 * D, n_head=2, rope_scaling=scaling)


def test_odd_head_dim_is_a_clear_error():
    with pytest.raises(ValueError, match=re.escape("RoPE needs an even head dimension, got n_embd/n_head = 33")):
        GPTConfig(n_embd=66, n_head=2)


def test_p_rope_angles_by_hand():
    # d = 8, fraction 0.5: round(0.5 * 4) = 2 pairs rotate, with base^0 = 1 and base^(-2/8) = 0.1; pairs 2, 3 do not
    inv_freq, _ = rope_frequencies(8, BASE, fraction=0.5)
    assert inv_freq.tolist() == pytest.approx([1.0, 0.1, 0.0, 0.0], abs=1e-7)
    cos, sin = rope_cos_sin(inv_freq, torch.tensor([0, 3]))  # half layout: channel c and c + 4 share pair c
    c, s = [math.cos(3), math.cos(0.3), 1, 1], [math.sin(3), math.sin(0.3), 0, 0]
    assert torch.allclose(cos, torch.tensor([[1.0] * 8, c + c]))
    assert torch.allclose(sin, torch.tensor([[0.0] * 8, [-v for v in s] + s]))
    assert (rope_frequencies(8, BASE, fraction=0.75)[0] > 0).sum() == 3 and (rope_frequencies(8, BASE)[0] > 0).sum() == 4


@pytest.mark.parametrize("scaling", STATIC + [{"rope_type": "llama3", "factor": 4.0, "original_max_position_embeddings": L}])
def test_p_rope_scales_the_rotating_pairs_as_full_rope_and_leaves_the_rest_unrotated(scaling):
    full, attention = rope_frequencies(D, BASE, scaling)
    partial, partial_attention = rope_frequencies(D, BASE, scaling, fraction=0.75)  # 12 of 16 pairs rotate
    assert torch.equal(partial[:12], full[:12]) and (partial[12:] == 0).all() and partial_attention == attention


@pytest.mark.parametrize("layout, unrotated", [("half", list(range(8, 16)) + list(range(24, 32))),
                                               ("interleaved", list(range(16, 32)))])
def test_p_rope_unrotated_channels_of_q_k_do_not_depend_on_position(layout, unrotated):
    # D = 32, fraction 0.5: pairs 8..15 are unrotated; in the half layout pair i is channels (i, i + 16),
    # interleaved it is (2i, 2i + 1)
    def rotate_partial(x, pos):
        inv_freq, factor = rope_frequencies(D, BASE, fraction=0.5)
        cos, sin = rope_cos_sin(inv_freq, torch.tensor([pos]), factor, layout)
        return apply_rope(x.double(), cos.double(), sin.double(), layout)[0]
    q, k = torch.randn(2, D, dtype=torch.float64)
    rotated = [c for c in range(D) if c not in unrotated]
    for m, n in [(0, 0), (7, 2), (500, 3), (40, 900)]:
        qm, kn = rotate_partial(q, m), rotate_partial(k, n)
        assert torch.allclose(qm[unrotated], q[unrotated]) and torch.allclose(kn[unrotated], k[unrotated])
        assert torch.allclose((qm[unrotated] * kn[unrotated]).sum(), (q[unrotated] * k[unrotated]).sum())
        if m != n:  # the rotated channels still carry the position
            assert not torch.allclose((qm[rotated] * kn[rotated]).sum(), (q[rotated] * k[rotated]).sum(), atol=1e-3)


@pytest.mark.parametrize("fraction, message", [
    (0, "rope_fraction must be a number in (0, 1] (or None: every pair rotates), got 0"),
    (1.5, "rope_fraction must be a number in (0, 1] (or None: every pair rotates), got 1.5"),
    (float("nan"), "rope_fraction must be a number in (0, 1]"),
    (True, "rope_fraction must be a number in (0, 1]"),
    (0.02, "rope_fraction=0.02 rotates round(0.02 * 16) = 0 of the 16 pairs; use at least 0.0625 (or pos_emb='none')"),
])
def test_bad_rope_fraction_is_a_clear_error(fraction, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        rope_frequencies(D, BASE, fraction=fraction)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_apply_rope_rotates_each_pair_by_hand(layout):
    # head_dim 4, base 10^4: pair frequencies 1 and 10^4^(-2/4) = 0.01; at position 2 the angles are 2 and 0.02
    (a0, b0), (a1, b1) = (0.3, -1.2), (2.0, 0.5)  # pair 0 and pair 1 as (first, second) channel
    x = [a0, a1, b0, b1] if layout == "half" else [a0, b0, a1, b1]
    cos, sin = rope_cos_sin(rope_frequencies(4, BASE)[0], torch.tensor([2]), 1.0, layout)
    out = apply_rope(torch.tensor([x], dtype=torch.float64), cos.double(), sin.double(), layout)[0].tolist()
    r0 = (a0 * math.cos(2) - b0 * math.sin(2), a0 * math.sin(2) + b0 * math.cos(2))
    r1 = (a1 * math.cos(0.02) - b1 * math.sin(0.02), a1 * math.sin(0.02) + b1 * math.cos(0.02))
    want = [r0[0], r1[0], r0[1], r1[1]] if layout == "half" else [*r0, *r1]
    assert out == pytest.approx(want, abs=1e-6)
