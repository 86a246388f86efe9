"""Self-Extend (Jin et al. 2024) and ReRoPE (Su 2023) against attention built by hand from their definitions."""
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from eval.methods import forward_args, self_extend_group, unavailable
from model import GPT, GPTConfig
from sample import KVCache
from positions import PositionArgs, far_positions, merged_attention, visible
from rope import apply_rope, default_inv_freq, rope_cos_sin, yarn_inv_freq


def rotation(r, theta):
    """The half-layout RoPE matrix of a turn by r: pair (p, p + d/2) turned by r * theta_p, entry by entry."""
    d = 2 * len(theta)
    R = torch.zeros(d, d, dtype=torch.float64)
    for p, t in enumerate(theta.tolist()):
        c, s = math.cos(r * t), math.sin(r * t)
        R[p, p], R[p, p + d // 2], R[p + d // 2, p], R[p + d // 2, p + d // 2] = c, -s, s, c
    return R


def by_hand(q, k, v, theta, distance):
    """One head: logit(i, j) = q_i . R(-r) k_j / sqrt(d), r = distance(i, j): RoPE's q_i at i and k_j at j meet at
    R(j - i), so a method that puts the pair at distance r gives R(-r); causal softmax, then v."""
    T, D = q.shape
    out = torch.zeros_like(v)
    for i in range(T):
        logits = torch.tensor([float(q[i] @ rotation(-distance(i, j), theta) @ k[j]) for j in range(i + 1)],
                              dtype=torch.float64) / math.sqrt(D)
        out[i] = logits.softmax(0) @ v[:i + 1]
    return out


def rerope(w):
    return lambda i, j: min(i - j, w)  # relative positions clipped at the window


def self_extend(W, G):  # exact within W, beyond it floor(i/G) - floor(j/G) shifted to carry on from W
    return lambda i, j: i - j if i - j < W else i // G - j // G + W - W // G


@pytest.mark.parametrize("T, window, group", [(12, 4, None), (12, 4, 3), (13, 5, 2), (9, 1, 4)])
def test_merged_attention_is_the_hand_built_one(T, window, group):
    torch.manual_seed(0)
    D = 8
    q, k, v = (torch.randn(1, 1, T, D, dtype=torch.float64) for _ in range(3))
    theta = default_inv_freq(D, 10000.0)

    def rotate(x, at):
        cos, sin = rope_cos_sin(theta, at)
        return apply_rope(x, cos.double(), sin.double())
    at = torch.arange(T)
    at_q, at_k = far_positions(T, T, window, group)
    got = merged_attention(rotate(q, at), rotate(k, at), rotate(q, at_q), rotate(k, at_k), v, window)[0, 0]
    want = by_hand(q[0, 0], k[0, 0], v[0, 0], theta, rerope(window) if group is None else self_extend(window, group))
    assert torch.allclose(got, want, atol=1e-6)  # float32 tables
    # the newest queries alone (a cache's step), and the causal mask given rather than implied: the same rows
    rq, rk, rq_far, rk_far = rotate(q, at), rotate(k, at), rotate(q, at_q), rotate(k, at_k)
    newest = merged_attention(rq[:, :, -3:], rk, rq_far[:, :, -3:], rk_far, v, window)[0, 0]
    assert torch.allclose(newest, want[-3:], atol=1e-6)
    assert torch.allclose(merged_attention(rq, rk, rq_far, rk_far, v, window, visible(T, T, 0, None))[0, 0], got)


def test_self_extend_group_is_the_smallest_that_stays_inside_the_trained_distances():
    # (length - 1) // G + W - W // G < L: at 256 tokens, L 64, W 32: G = 8 gives 31 + 28 = 59, G = 7 gives 36 + 28 = 64
    assert self_extend_group(256, 64, 32) == 8
    assert self_extend_group(64, 64, 32) == 1  # inside L nothing is grouped
    assert forward_args("self-extend", 256, 64, 64) == PositionArgs(extend=(32, 8))
    assert forward_args("rerope", 256, 64, 64) == PositionArgs(extend=(32, None))


def tiny(**kw):
    torch.manual_seed(0)
    model = GPT(GPTConfig(**{**dict(block_size=16, vocab_size=50, n_layer=2, n_head=2, n_embd=32), **kw})).eval()
    with torch.no_grad():  # sharper attention, so that positions matter
        for block in model.transformer.h:
            block.attn.c_attn.weight[:2 * model.config.n_embd] *= 20
    return model


@torch.no_grad()
@pytest.mark.parametrize("method", ["self-extend", "rerope"])
def test_the_kv_cache_gives_the_full_forward_and_the_method_acts_past_the_window(method):
    model, idx = tiny(), torch.randint(0, 50, (2, 64))
    kw = forward_args(method, 64, 16, 16)
    full, _ = model(idx, method=kw)
    cache = KVCache(model.config.n_layer)
    steps = [model(idx[:, :16], cache=cache, method=kw)[0]] + [model(idx[:, t:t + 1], cache=cache, method=kw)[0] for t in range(16, 64)]
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-4)
    plain, _ = model(idx)
    assert torch.allclose(full[:, :8], plain[:, :8], atol=1e-5)  # inside the window: exact positions, as trained
    assert not torch.allclose(full[:, 16:], plain[:, 16:], atol=1e-3)


def test_only_rope_takes_them():
    assert unavailable(tiny(pos_emb="alibi").config, "rerope", 64)
    assert unavailable(tiny().config, "self-extend", 64) is None


def leaky(w, k):  # Leaky ReRoPE (Su 2023): exact within w, beyond it the distance grows k times slower
    return lambda i, j: i - j if i - j < w else w + (i - j - w) / k


@pytest.mark.parametrize("T, window, k", [(12, 4, 2), (13, 5, 3), (9, 1, 4)])
def test_leaky_rerope_is_the_hand_built_one(T, window, k):
    # the model's construction (positions.far_rotation): far pairs with frequencies / k, queries moved w(k - 1) on
    torch.manual_seed(0)
    D = 8
    q, k_, v = (torch.randn(1, 1, T, D, dtype=torch.float64) for _ in range(3))
    theta = default_inv_freq(D, 10000.0)

    def rotate(x, at, inv_freq):
        cos, sin = rope_cos_sin(inv_freq, at)
        return apply_rope(x, cos.double(), sin.double())
    at = torch.arange(T)
    got = merged_attention(rotate(q, at, theta), rotate(k_, at, theta), rotate(q, at + window * (k - 1), theta / k),
                           rotate(k_, at, theta / k), v, window)[0, 0]
    assert torch.allclose(got, by_hand(q[0, 0], k_[0, 0], v[0, 0], theta, leaky(window, k)), atol=1e-6)


@torch.no_grad()
def test_leaky_rerope_in_the_model_runs_from_none_at_k_1_to_rerope_as_k_grows():
    model, idx = tiny(), torch.randint(0, 50, (2, 64))
    plain, rerope_, none_ = model(idx)[0], model(idx, method=PositionArgs(extend=(8, None)))[0], model(idx, method=PositionArgs(extend=(8, None), leak=1))[0]
    assert torch.allclose(none_, plain, atol=1e-4)  # k = 1: every distance exact
    slow = model(idx, method=PositionArgs(extend=(8, None), leak=100000))[0]
    assert torch.allclose(slow, rerope_, atol=2e-3) and not torch.allclose(slow, plain, atol=1e-2)


def test_leaky_k_is_the_smallest_that_keeps_every_distance_inside_the_trained_ones():
    # 256 tokens, L 64, w 32: 32 + 223 / k <= 63 needs k >= 7.19, so 8 (largest distance 59.9); inside L: 1
    assert forward_args("leaky-rerope", 256, 64, 64) == PositionArgs(extend=(32, None), leak=8)
    assert forward_args("leaky-rerope", 64, 64, 64).leak == 1
    assert forward_args("leaky-rerope:window=16:k=3", 256, 64, 64) == PositionArgs(extend=(16, None), leak=3)


def test_method_settings_reach_the_forward_and_bad_ones_are_one_line_errors():
    from eval.methods import parse_methods
    from common import UserError
    assert forward_args("self-extend:window=16:group=3", 256, 64, 64) == PositionArgs(extend=(16, 3))
    assert forward_args("rerope:window=48", 256, 64, 64) == PositionArgs(extend=(48, None))
    assert forward_args("yarn:beta_fast=4:beta_slow=0.5", 256, 64, 64).rope_scaling == {
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "beta_fast": 4.0, "beta_slow": 0.5}
    # crop-L: a fine-tune (run_len 256) cropped to the length it was extended from (64)
    assert forward_args("crop-L", 512, 64, 256) == PositionArgs(crop=64) and forward_args("crop", 512, 64, 256) == PositionArgs(crop=256)
    assert parse_methods("yarn,yarn:beta_fast=4,yarn") == ["yarn", "yarn:beta_fast=4"]
    for bad in ("yarn:window=4", "rerope:window=0", "rerope:window=x", "nope", "pi:factor=2"):
        with pytest.raises(UserError):
            parse_methods(bad)


def test_a_neighbour_window_as_long_as_the_trained_context_is_not_available():
    assert "below the trained context" in unavailable(tiny().config, "leaky-rerope:window=15", 64)  # block_size 16
    assert unavailable(tiny().config, "leaky-rerope:window=14", 64) is None


@torch.no_grad()
def test_leaky_rerope_far_pairs_use_a_fine_tuned_runs_own_rope_scaling():
    # a run fine-tuned with YaRN rotates its near pairs with YaRN's frequencies and temperature: its far pairs are the
    # same frequencies k times slower, with the same temperature (not plain linear scaling by k)
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8}
    model, T, w, k = tiny(n_layer=1, rope_scaling=yarn), 40, 6, 3
    seen = []
    with model.transformer.h[0].attn.attend.register_forward_hook(lambda m, inputs, out: seen.append((inputs, out))):
        model(torch.randint(0, 50, (1, T)), method=PositionArgs(extend=(w, None), leak=k))
    (q, k_, v, *_), got = seen[0]
    theta, temperature = yarn_inv_freq(16, 10000.0, 4.0, 8), 0.1 * math.log(4.0) + 1

    def rotate(x, at, inv_freq):
        return apply_rope(x, *rope_cos_sin(inv_freq, at, temperature))
    at = torch.arange(T)
    expected = merged_attention(rotate(q, at, theta), rotate(k_, at, theta), rotate(q, at + w * (k - 1), theta / k),
                                rotate(k_, at, theta / k), v, w)
    assert torch.allclose(got, expected, atol=1e-5)


@pytest.mark.parametrize("spec, message", [
    ("yarn:beta_fast=1e308", "beta_fast 1e308 is too large: use a number <= 1e+06"),
    ("yarn:beta_slow=1e-320", "beta_slow must be >= 1e-06, got 1e-320"),
    ("leaky-rerope:k=1000000000000000000000", "k 1000000000000000000000 is too large"),
    ("leaky-rerope:k=1e21", "k '1e21' is not an integer"),
    ("yarn:beta_fast=1:beta_slow=64", "beta_fast 1 must be above beta_slow 64"),
    ("ntk-by-parts:beta_slow=32", "beta_fast 32 must be above beta_slow 32"),
    ("yarn:beta_fast=4:beta_fast=8", "beta_fast is given twice"),
])
def test_method_settings_out_of_range_are_one_line_errors_when_parsed_and_under_check(tmp_path, spec, message):
    from eval.methods import parse_methods
    from common import UserError
    with pytest.raises(UserError, match=re.escape(message)):
        parse_methods(spec)
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "eval/extrapolate.py", str(tmp_path), "--methods", spec, "--check"], cwd=root,
                         capture_output=True, text=True)
    assert out.returncode == 1 and message in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_extrapolate_help_lists_every_method():
    from eval.methods import METHODS
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "eval/extrapolate.py", "--help"], cwd=root, capture_output=True, text=True,
                         env={"COLUMNS": "1000", "PATH": ""}, check=True)
    assert all(f" {m}," in out.stdout or f" {m} " in out.stdout for m in METHODS)
    assert "leaky-rerope" in out.stdout and "crop-L" in out.stdout and "pairs" in out.stdout
