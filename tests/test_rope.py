"""RoPE math, each formula checked against an independent computation or a property."""
import math
import re

import pytest
import torch

from model import GPT, GPTConfig
from rope import apply_rope, frequencies, rope_cos_sin, rope_frequencies, rope_tables
from config import gpt_config
from rope_options import check_scaling

D, BASE, L = 32, 10000.0, 256
STATIC = [None,
          {"rope_type": "linear", "factor": 4.0},
          {"rope_type": "ntk", "factor": 4.0},
          {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": L}]



def checked(**kw):
    """GPTConfig as a user's keys come in: checked once, by config.gpt_config (the model and rope.py trust it)."""
    return gpt_config(kw)

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


def test_llama4_dict_with_equal_freq_factors_is_a_step_at_the_original_length():
    # Llama 4 Scout's config.json: low_freq_factor = high_freq_factor = 1, so no blend band: wavelengths below
    # L = 8192 kept, above divided by 16 (transformers only warns about the equality, and computes this)
    scaling = {"rope_type": "llama3", "factor": 16.0, "low_freq_factor": 1.0, "high_freq_factor": 1.0,
               "original_max_position_embeddings": 8192, "rope_theta": 500000.0}
    check_scaling(scaling, 128)
    expected, regions = llama3_by_definition(128, 500000.0, 8192, 16.0, 1.0, 1.0)
    assert set(regions) == {"kept", "interpolated"}
    assert torch.allclose(rope_frequencies(128, BASE, scaling)[0].double(), expected, rtol=1e-6, atol=0)


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
      "high_freq_factor": 1.0}, "high_freq_factor >= low_freq_factor > 0, got high_freq_factor=1.0, low_freq_factor=4"),
    ({"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": L, "low_freq_factor": 0},
     "high_freq_factor >= low_freq_factor > 0, got high_freq_factor=4.0, low_freq_factor=0"),
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
            checked(block_size=L, n_embd=2 * D, n_head=2, rope_scaling=scaling)


def test_odd_head_dim_is_a_clear_error():
    with pytest.raises(ValueError, match=re.escape("RoPE needs an even head dimension, got n_embd/n_head = 33")):
        checked(n_embd=66, n_head=2)


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
        checked(n_embd=2 * D, n_head=2, rope_fraction=fraction)


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


# every key transformers' rope utilities read (issue 20): DeepSeek's mscale pair, Phi-3's longrope, partial rotary

DEEPSEEK_V3 = {"type": "yarn", "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1,
               "original_max_position_embeddings": 4096}  # config.json's rope_scaling; rotary head dim 64, base 1e4


def test_deepseek_v3_yarn_dict_has_attention_factor_one_and_the_yarn_ramp():
    # transformers: mscale and mscale_all_dim both given -> (0.1 * 1.0 * ln 40 + 1) / (0.1 * 1.0 * ln 40 + 1) = 1
    # Ramp, d = 64, L = 4096: dim(r) = 64 ln(4096 / (2 pi r)) / (2 ln 1e4)
    #   beta_fast 32: 64 ln(20.37183) / 18.42068 = 10.47224 -> floor 10
    #   beta_slow 1:  64 ln(651.8986) / 18.42068 = 22.51344 -> ceil 23
    for r, dim in [(32, 10.4722408), (1, 22.5134406)]:
        assert 64 * math.log(4096 / (2 * math.pi * r)) / (2 * math.log(BASE)) == pytest.approx(dim, abs=1e-6)
    assert check_scaling(DEEPSEEK_V3, 64) == ("yarn", 40.0)
    inv_freq, attention = rope_frequencies(64, BASE, DEEPSEEK_V3)
    assert attention == 1.0
    assert torch.allclose(inv_freq.double(), yarn_by_formula(10, 23, d=64, factor=40.0), rtol=1e-6, atol=0)
    exact = yarn_by_formula(10.4722408, 22.5134406, d=64, factor=40.0)  # truncate False's bounds: not these
    assert not torch.allclose(inv_freq.double(), exact, rtol=1e-4)
    # without the mscale pair it is plain YaRN's 0.1 ln 40 + 1 = 1.3688879 (what this repo gave DeepSeek-V3 before)
    plain = {k: v for k, v in DEEPSEEK_V3.items() if not k.startswith("mscale")}
    assert rope_frequencies(64, BASE, plain)[1] == pytest.approx(1.3688879454, rel=1e-9)


@pytest.mark.parametrize("extra, expected", [
    ({"mscale": 0.707, "mscale_all_dim": 0.707}, 1.0),  # DeepSeek-V2
    ({"mscale": 1.0, "mscale_all_dim": 0.707}, 1.3688879454 / 1.2608037774),  # (0.1 ln 40 + 1) / (0.0707 ln 40 + 1)
    ({"mscale": 0.707}, 1.3688879454),  # one alone: transformers ignores it, plain 0.1 ln 40 + 1 (not 1.2608)
    ({"mscale_all_dim": 0.707}, 1.3688879454),
    ({"mscale": 0, "mscale_all_dim": 0.707}, 1.3688879454),  # 0 is allowed and, as transformers' `if mscale and`, absent
    ({"mscale": 0.707, "mscale_all_dim": 0.707, "attention_factor": 0.9}, 0.9),  # an explicit attention_factor wins
])
def test_yarn_attention_factor_from_the_mscale_keys(extra, expected):
    scaling = {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": L, **extra}
    check_scaling(scaling, D)
    assert rope_frequencies(D, BASE, scaling)[1] == pytest.approx(expected, rel=1e-9)


PHI3_SHORT = [1.0 + 0.01 * i for i in range(D // 2)]  # Phi-3's lists have head_dim / 2 = 48 entries; here D / 2 = 16
PHI3_LONG = [1.0 + 2.0 * i for i in range(D // 2)]
PHI3 = {"type": "longrope", "short_factor": PHI3_SHORT, "long_factor": PHI3_LONG, "factor": 32.0,
        "original_max_position_embeddings": 4096}  # factor: config.json's 131072 / 4096


def test_phi3_longrope_switches_short_to_long_factors_past_the_original_length():
    # inv_freq_i = base^(-2i/d) / factor_i, the short list while the sequence is <= 4096, the long one past it;
    # attention factor sqrt(1 + ln 32 / ln 4096) = sqrt(1 + 5/12) = sqrt(17/12) = 1.190238 at every length
    theta = [BASE ** (-2 * i / D) for i in range(D // 2)]
    for seq_len, factors in [(None, PHI3_SHORT), (1, PHI3_SHORT), (4096, PHI3_SHORT), (4097, PHI3_LONG),
                             (131072, PHI3_LONG)]:
        inv_freq, attention = rope_frequencies(D, BASE, PHI3, seq_len=seq_len)
        expected = torch.tensor([t / f for t, f in zip(theta, factors)], dtype=torch.float64)
        assert torch.allclose(inv_freq.double(), expected, rtol=1e-6, atol=0)
        assert attention == pytest.approx(math.sqrt(17 / 12), rel=1e-12)
    assert rope_frequencies(D, BASE, {**PHI3, "attention_factor": 1.25}, seq_len=4097)[1] == 1.25  # explicit wins
    assert rope_frequencies(D, BASE, {**PHI3, "factor": 1.0}, seq_len=4097)[1] == 1.0  # no extension, no temperature


def test_longrope_lists_are_one_factor_per_rotating_pair():
    assert check_scaling(PHI3, D) == ("longrope", 32.0)
    with pytest.raises(ValueError, match=re.escape("longrope's long_factor must be a list of 16 numbers > 0")):
        check_scaling({**PHI3, "long_factor": PHI3_LONG[:-1]}, D)
    # with partial_rotary_factor (Phi-4-mini: 0.75) the lists cover the rotary pairs only: int(32 * 0.75) / 2 = 12
    with pytest.raises(ValueError, match=re.escape("short_factor must be a list of 12 numbers > 0")):
        checked(n_embd=2 * D, n_head=2, rope_scaling={**PHI3, "partial_rotary_factor": 0.75})
    partial = {**PHI3, "partial_rotary_factor": 0.75, "short_factor": PHI3_SHORT[:12], "long_factor": PHI3_LONG[:12]}
    checked(n_embd=2 * D, n_head=2, rope_scaling=partial)
    expected = [BASE ** (-2 * i / 24) / PHI3_LONG[i] for i in range(12)] + [0.0] * 4
    assert rope_frequencies(D, BASE, partial, seq_len=5000)[0].tolist() == pytest.approx(expected, rel=1e-6)


def test_partial_rotary_factor_frequencies_run_over_the_rotary_dim():
    # D = 32, p = 0.25: rotary dim d' = 8, base^(-2i/8) = 1, 0.1, 0.01, 0.001 on pairs 0..3; pairs 4..15 pass through
    quarter = {"partial_rotary_factor": 0.25}
    assert rope_frequencies(D, BASE, {"rope_type": "default", **quarter})[0].tolist() == pytest.approx(
        [1.0, 0.1, 0.01, 0.001] + [0.0] * 12, rel=1e-6)
    # p-RoPE's rope_fraction = 0.25 is another thing: 4 pairs too, at the full head's base^(-2i/32) = 10^(-i/4)
    assert rope_frequencies(D, BASE, fraction=0.25)[0].tolist() == pytest.approx(
        [1.0, 10 ** -0.25, 10 ** -0.5, 10 ** -0.75] + [0.0] * 12, rel=1e-6)
    # each method over d': PI divides by s; NTK stretches the base by s^(d'/(d'-2)) = 4^(8/6); YaRN's ramp bounds are
    # dim(r) = 8 ln(256 / (2 pi r)) / (2 ln 1e4): r = 32: 0.1049 -> 0, r = 1: 1.6101 -> 2, ramp (i - 0) / 2
    assert rope_frequencies(D, BASE, {"rope_type": "linear", "factor": 4.0, **quarter})[0].tolist() == pytest.approx(
        [0.25, 0.025, 0.0025, 0.00025] + [0.0] * 12, rel=1e-6)
    stretched = BASE * 4.0 ** (8 / 6)
    assert rope_frequencies(D, BASE, {"rope_type": "ntk", "factor": 4.0, **quarter})[0].tolist() == pytest.approx(
        [stretched ** (-2 * i / 8) for i in range(4)] + [0.0] * 12, rel=1e-6)
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": L, **quarter}
    assert rope_frequencies(D, BASE, yarn)[0].tolist() == pytest.approx(
        [1.0, 0.1 * 0.5 + 0.1 / 4 * 0.5, 0.01 / 4, 0.001 / 4] + [0.0] * 12, rel=1e-6)


def test_proportional_is_the_full_heads_frequencies_on_a_leading_share_then_pi():
    # Gemma 4: int(0.25 * 32 // 2) = 4 pairs at 1e6^(-2i/32) / 2, the other 12 unrotated
    scaling = {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6, "factor": 2.0}
    check_scaling(scaling, D)
    inv_freq, attention = rope_frequencies(D, BASE, scaling)
    assert inv_freq.tolist() == pytest.approx([1e6 ** (-2 * i / 32) / 2 for i in range(4)] + [0.0] * 12, rel=1e-6)
    assert attention == 1.0


@pytest.mark.parametrize("layout, rotated", [("half", [0, 1, 2, 3, 16, 17, 18, 19]), ("interleaved", list(range(8)))])
def test_partial_rotary_channels_pass_through_and_the_rotated_ones_stay_relative(layout, rotated):
    # p = 0.25 on D = 32: pairs 0..3 rotate; half pairs (i, i + 16), interleaved (2i, 2i + 1) (GPT-J's leading 8).
    # A model trained with it keeps it under any scaling, and YaRN's attention factor scales only the rotated
    # channels (transformers concatenates the pass-through dims unscaled): cos = 1 and sin = 0 there
    model = GPT(GPTConfig(n_embd=2 * D, n_head=2, rope_layout=layout,
                          rope_scaling={"rope_type": "default", "partial_rotary_factor": 0.25}))
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": L}
    cos, sin = rope_tables(model.config, yarn, 3000, torch.arange(3000))
    passed = [c for c in range(D) if c not in rotated]
    assert (cos[:, passed] == 1).all() and (sin[:, passed] == 0).all()
    assert cos[0, rotated].tolist() == pytest.approx([0.1 * math.log(4.0) + 1] * 8, rel=1e-6)

    def rot(x, pos):
        return apply_rope(x.double(), cos[pos].double(), sin[pos].double(), layout)
    q, k = torch.randn(2, D, dtype=torch.float64)
    for m, n in [(5, 2), (300, 120), (1000, 10)]:
        qm, kn = rot(q, m), rot(k, n)
        assert torch.equal(qm[passed], q[passed]) and torch.equal(kn[passed], k[passed])
        ref = (qm[rotated] * kn[rotated]).sum()
        assert not torch.allclose(ref, (q[rotated] * k[rotated]).sum() * 1.1386294 ** 2, atol=1e-3)  # positions count
        for shift in (1, 37, 1900):
            assert torch.allclose(ref, (rot(q, m + shift)[rotated] * rot(k, n + shift)[rotated]).sum(), atol=1e-3)


def test_yarn_truncate_false_keeps_the_exact_ramp_bounds_and_differs():
    # d = 32, L = 256: the bounds 0.41964 and 6.44024 (test_yarn_ramp_at_every_pair): truncated to 0 and 7, or kept
    scaling = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": L}
    truncated = rope_frequencies(D, BASE, {**scaling, "truncate": True})[0].double()
    exact = rope_frequencies(D, BASE, {**scaling, "truncate": False})[0].double()
    assert torch.allclose(truncated, yarn_by_formula(0, 7), rtol=1e-6, atol=0)
    assert torch.allclose(exact, yarn_by_formula(0.41964047, 6.44024039), rtol=1e-6, atol=0)
    assert not torch.allclose(exact, truncated, rtol=1e-3)


@pytest.mark.parametrize("scaling, message", [
    ({"type": "yarn", "factor": 16.0, "original_max_position_embeddings": 4096, "finetuned": True},
     "rope_scaling key 'finetuned' is not one rope_type 'yarn' uses; allowed: rope_type, type, rope_theta, "
     "partial_rotary_factor, original_max_position_embeddings, factor, attention_factor, beta_fast, beta_slow, mscale, "
     "mscale_all_dim, truncate"),
    ({"rope_type": "linear", "factor": 4.0, "mscale": 1.0},
     "rope_scaling key 'mscale' is not one rope_type 'linear' uses"),
    ({"rope_type": "default", "mrope_section": [16, 24, 24]},
     "rope_scaling key 'mrope_section' is not one rope_type"),
    ({"full_attention": {"rope_type": "proportional"}, "sliding_attention": {"rope_type": "default"}},
     "rope_scaling key 'full_attention' is not one rope_type 'default' uses"),
    ({"rope_type": "linear"}, "rope_type 'linear' needs 'factor'"),
    ({k: v for k, v in PHI3.items() if k != "factor"},
     "longrope needs 'factor' (its attention factor's s: config.json's max_position_embeddings / "
     "original_max_position_embeddings) or 'attention_factor'"),
    ({**PHI3, "short_factor": "1"},
     "longrope's short_factor must be a list of"),
    ({"rope_type": "yarn", "factor": 4.0, "truncate": "no"}, "truncate must be True or False, got 'no'"),
    ({"rope_type": "yarn", "factor": 4.0, "beta_fast": "32"}, "beta_fast must be a number > 0, got '32'"),
    ({"rope_type": "yarn", "factor": 4.0, "beta_slow": 0}, "beta_slow must be a number > 0, got 0"),
    ({"rope_type": "yarn", "factor": 4.0, "mscale_all_dim": -0.1}, "mscale_all_dim must be a number >= 0, got -0.1"),
    ({"rope_type": "default", "partial_rotary_factor": 0}, "partial_rotary_factor must be a number in (0, 1], got 0"),
])
def test_a_key_transformers_would_ignore_or_refuse_is_a_one_line_error(scaling, message):
    with pytest.raises(ValueError, match=re.escape(message)) as error:
        check_scaling(scaling)
    assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match=re.escape(message)):
        checked(block_size=L, n_embd=2 * D, n_head=2, rope_scaling=scaling)


def test_odd_rotary_dim_is_a_clear_error():
    with pytest.raises(ValueError, match=re.escape("partial_rotary_factor=0.3: rotary dim int(32 * p) = 9, odd or 0")):
        checked(n_embd=2 * D, n_head=2, rope_scaling={"rope_type": "default", "partial_rotary_factor": 0.3})


def test_a_scaling_at_evaluation_keeps_the_trained_dicts_base_and_rotary_share():
    # rope_theta and partial_rotary_factor describe the model (v5 puts them in the dict): a method's dict that
    # replaces the trained one keeps them unless it gives its own
    model = GPT(GPTConfig(block_size=L, n_embd=2 * D, n_head=2,
                          rope_scaling={"rope_type": "default", "rope_theta": 5e5, "partial_rotary_factor": 0.5}))
    inv_freq, _ = frequencies(model.config, {"rope_type": "linear", "factor": 2.0}, 4 * L)
    assert inv_freq.tolist() == pytest.approx([5e5 ** (-2 * i / 16) / 2 for i in range(8)] + [0.0] * 8, rel=1e-6)
    own = frequencies(model.config, {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4, "partial_rotary_factor": 1.0},
                      4 * L)
    assert own[0].tolist() == pytest.approx([1e4 ** (-2 * i / 32) / 2 for i in range(16)], rel=1e-6)
