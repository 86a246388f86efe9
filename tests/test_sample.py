"""sample.py and its generate: cached decoding equals full forwards for every method, sampling, one-line errors."""
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

import sample
from data.tokenizer import EOT, gpt2_tokenizer
from eval.methods import FIXED, forward_args
from dataclasses import replace

from model import GPT, GPTConfig
from sample import KVCache, generate, sample_next

ROOT = Path(__file__).resolve().parents[1]
L = 16


# decoding is hundreds of tiny forwards: one thread for every test here (tests/conftest.py's one_thread)
pytestmark = pytest.mark.usefixtures("one_thread")


def tiny(vocab_size=97, **kw):
    torch.manual_seed(0)
    model = GPT(GPTConfig(**{**dict(block_size=L, vocab_size=vocab_size, n_layer=2, n_head=2, n_embd=32), **kw})).eval()
    with torch.no_grad():  # random init attends almost uniformly; scaled q/k make the positions matter
        for block in model.transformer.h:
            block.attn.c_attn.weight[:2 * model.config.n_embd] *= 20
    return model


def method_kwargs(method):
    # dynamic-ntk's factor is the extra multiplier a (1: plain); the others at 4x, as in the evaluation
    return forward_args(method, 4 * L, L, L)


CACHED = [m for m in FIXED if m != "crop"]  # crop has no cache: generation truncates


def exact(method):
    """The full forward's reference: exact causal dynamic scaling (sinks, Self-Extend and ReRoPE have no dynamic scale
    to make exact)."""
    kw = method_kwargs(method)
    return kw if method in ("sinks", "self-extend", "rerope") else replace(kw, causal_dynamic=True)


def cached(model, idx, prefill, kw):
    """Logits of idx through the KV cache: the first `prefill` tokens in one forward, then one per forward."""
    cache = KVCache(model.config.n_layer)
    head, _ = model(idx[:, :prefill], cache=cache, method=kw)
    return torch.cat([head] + [model(idx[:, t:t + 1], cache=cache, method=kw)[0] for t in range(prefill, idx.size(1))], dim=1)


@pytest.fixture(scope="module")
def rope():
    return tiny()


@pytest.mark.parametrize("method", CACHED)
def test_cached_decoding_equals_the_exact_causal_forward(rope, method):
    # the cache keeps keys unrotated and re-rotates them with the frequencies for the current length: token t
    # gets the scale for length t + 1, which is the full forward's causal_dynamic mode
    kw = method_kwargs(method)
    idx = torch.randint(0, 97, (2, 4 * L))
    full, _ = rope(idx, method=exact(method))
    with torch.no_grad():
        assert torch.allclose(cached(rope, idx, L, kw), full, atol=1e-4)
        if method != "none":  # the arguments really act past L (else the test would pass vacuously)
            assert not torch.allclose(full[:, L:], rope(idx)[0][:, L:], atol=1e-3)


def test_one_forward_of_a_long_prompt_would_not_be_exact_for_dynamic_ntk(rope):
    # why generate feeds a prompt past the original length one token at a time: one forward gives every
    # prompt token the prompt's length, and from the second layer on the last token sees that
    kw = method_kwargs("dynamic-ntk")
    idx = torch.randint(0, 97, (2, 3 * L))
    full, _ = rope(idx, method=replace(kw, causal_dynamic=True))
    with torch.no_grad():
        assert not torch.allclose(cached(rope, idx, 3 * L - 1, kw)[:, -1], full[:, -1], atol=1e-3)


@pytest.mark.parametrize("method", CACHED)
def test_generate_sees_the_logits_of_the_exact_causal_forward_and_top_k_1_takes_their_argmax(rope, method, monkeypatch):
    # a prompt longer than L, continued to 3.5 L: generate passes the method to every step and feeds the
    # prompt exactly; the logits each step samples from are recorded
    seen = []

    def record(logits, temperature, top_k):
        seen.append(logits.clone())
        return sample_next(logits, temperature, top_k)
    monkeypatch.setattr("sample.sample_next", record)
    kw, P = method_kwargs(method), L + L // 2
    out = generate(rope, torch.randint(0, 97, (2, P)), 2 * L, temperature=2.0, top_k=1, method=kw)
    with torch.no_grad():
        full, _ = rope(out, method=exact(method))  # causal: position t depends on tokens <= t only
    assert torch.allclose(torch.stack(seen, dim=1), full[:, P - 1:-1], atol=1e-4)
    assert torch.equal(out[:, P:], full[:, P - 1:-1].argmax(-1))


def test_top_k_1_is_the_argmax_and_top_k_keeps_the_k_most_likely():
    logits = torch.randn(256, 97)
    assert torch.equal(sample_next(logits, temperature=5.0, top_k=1)[:, 0], logits.argmax(-1))
    top5 = logits.topk(5).indices
    drawn = sample_next(logits, temperature=5.0, top_k=5)
    assert (drawn == top5).any(dim=1).all()


def write_run(folder, origin=None, **kw):
    """A run folder with an untrained tiny checkpoint of a vocabulary gpt2_tokenizer can make (origin: as a
    fine-tune records where it came from; its model_args then lack train_len, as a checkpoint older than that field)."""
    model = tiny(vocab_size=512, **kw)
    folder.mkdir(parents=True, exist_ok=True)
    args = {k: v for k, v in asdict(model.config).items() if not (origin and k == "train_len")}
    torch.save({"model": model.state_dict(), "model_args": args, "iter_num": 0, "origin": origin,
                "config": {"dataset": str(folder / "no_data_needed")}}, folder / "ckpt.pt")
    return folder


def run_sample(run_dir, *argv):
    return sample.main([str(run_dir), "--device", "cpu", *argv])


def test_same_seed_same_samples_other_seed_other_samples(tmp_path, capsys):
    run_dir = write_run(tmp_path / "rope")
    args = ("--prompt", "the king doth", "--max_new_tokens", str(3 * L), "--num_samples", "2", "--method", "yarn")
    first, again = run_sample(run_dir, *args, "--seed", "7"), run_sample(run_dir, *args, "--seed", "7")
    other = run_sample(run_dir, *args, "--seed", "8")
    assert first == again and first != other and len(first) == 2 and first[0] != first[1]
    assert all(s.startswith("the king doth") for s in first)
    out, err = capsys.readouterr()
    assert out.count("---------------\n") == 6
    assert "'rope_type': 'yarn'" in err and "pos_emb=rope, trained at L=16" in err


def test_a_fine_tuned_run_samples_with_the_methods_the_evaluation_scores(tmp_path, capsys):
    # fine-tuned at 4 L from a run trained at L: the methods scale from L (the origin), as in the evaluation,
    # not from the fine-tune's block_size (which gave yarn another dict in sampling than in evaluation)
    run_dir = write_run(tmp_path / "tuned", origin={"run": "base", "iter": 0, "train_len": L}, block_size=4 * L)
    run_sample(run_dir, "--max_new_tokens", str(8 * L - 1), "--method", "yarn")  # EOT + 127 new = 8 L
    expected = forward_args("yarn", 8 * L, L, 4 * L)
    assert expected.rope_scaling == {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": L}
    assert f"method yarn: {expected.settings()}" in capsys.readouterr().err


def test_auto_factor_covers_the_whole_sample(tmp_path, capsys):
    run_dir = write_run(tmp_path / "rope")
    run_sample(run_dir, "--max_new_tokens", str(4 * L - 1), "--method", "pi")  # EOT + 63 new tokens = 4 L
    assert "{'rope_scaling': {'rope_type': 'linear', 'factor': 4.0}}" in capsys.readouterr().err
    run_sample(run_dir, "--max_new_tokens", "3", "--method", "dynamic-ntk")  # a = 1 unless given
    assert "'rope_type': 'dynamic', 'factor': 1.0, 'original_max_position_embeddings': 16" in capsys.readouterr().err


def test_the_prompt_tokens_are_inside_the_cut_vocabulary():
    # gpt2_tokenizer(K) keeps only ranks < K - 1, so any text re-encodes with ids < K (bytes are ranks 0..255)
    enc = gpt2_tokenizer(512)
    text = "Thou art Ἀθῆναι, naïve 東京 🤖 zzyzx-qwerty\t\n " + EOT + " anew"
    ids = enc.encode(text, allowed_special={EOT})
    assert max(ids) == 511 == enc.eot_token and ids.count(511) == 1 and enc.decode(ids) == text


def test_learned_positions_stop_at_the_table_unless_cropped(tmp_path):
    run_dir = write_run(tmp_path / "learned", pos_emb="learned")
    with pytest.raises(SystemExit) as e:
        run_sample(run_dir, "--max_new_tokens", str(L))  # EOT + 16 new = 17 > 16
    assert str(e.value) == ("sample.py: error: --method none: a learned position table has 16 entries and cannot encode "
                            "position 16 (no extrapolation): use crop (truncation) or fewer tokens")
    assert len(run_sample(run_dir, "--max_new_tokens", str(L - 1))[0]) > 0
    # crop of an absolute encoding is truncation (each token from its last L at positions 0..L-1): any length
    assert len(run_sample(run_dir, "--max_new_tokens", str(3 * L), "--method", "crop", "--top_k", "1")) == 1


def test_alibi_and_p_rope_runs_sample_far_past_the_training_length(tmp_path):
    alibi, prope = write_run(tmp_path / "alibi", pos_emb="alibi"), write_run(tmp_path / "prope", rope_fraction=0.5)
    for run_dir, method in ((alibi, "none"), (alibi, "crop"), (alibi, "logn"), (prope, "yarn"), (prope, "dynamic-ntk")):
        assert len(run_sample(run_dir, "--max_new_tokens", str(4 * L), "--method", method)) == 1
    with pytest.raises(SystemExit) as e:
        run_sample(alibi, "--method", "yarn")
    assert str(e.value) == "sample.py: error: --method yarn: rescales RoPE: a pos_emb='alibi' model takes none, crop, window, sinks, logn, crop-L"


@pytest.mark.parametrize("argv, message", [
    (["--method", "rope2"], "unknown --method 'rope2'; allowed: none, crop, window, sinks, pi, ntk, dynamic-ntk, yarn"),
    (["--factor", "0.5"], "--factor must be auto or a number >= 1, got 0.5"),
    (["--factor", "big"], "--factor 'big' is not auto or a number"),
    (["--temperature", "0"], "--temperature must be > 0, got 0.0; for greedy sampling use --top_k 1"),
    (["--top_k", "-1"], "--top_k must be >= 0, got -1"),
    (["--max_new_tokens", "x"], "argument --max_new_tokens: invalid int value: 'x'"),
    (["--prompt", "a", "--prompt_file", "b"], "argument --prompt_file: not allowed with argument --prompt"),
    (["--prompt", ""], "--prompt is empty; leave it out to start a new document (<|endoftext|>)"),
    # common.pick_device's one line, said once (sample.py does not check the name again)
    (["--device", "tpu"], "device='tpu' is not one of: auto, cpu, cuda, cuda:N, mps"),
])
def test_bad_options_are_one_line_errors(tmp_path, argv, message):
    with pytest.raises(SystemExit) as e:
        run_sample(write_run(tmp_path / "rope"), *argv)
    assert str(e.value).startswith("sample.py: error: ") and message in str(e.value) and "\n" not in str(e.value)


def cli(*argv, cwd):
    return subprocess.run([sys.executable, str(ROOT / "sample.py"), *argv], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.mark.parametrize("argv, message", [
    (["nope"], "sample.py: error: no checkpoint at nope; train one first: python train.py configs/rope_small.py"),
    (["nope", "--method", "rope2"], "sample.py: error: unknown --method 'rope2'; allowed: " + ", ".join(FIXED)),
    (["nope", "--factor", "0.5"], "sample.py: error: --factor must be auto or a number >= 1, got 0.5"),
])
def test_cli_errors_exit_1_with_one_line(tmp_path, argv, message):
    proc = cli(*argv, cwd=tmp_path)
    assert proc.returncode == 1 and proc.stderr.strip().splitlines() == [message]


def test_cli_samples_past_the_training_length(tmp_path):
    run_dir = write_run(tmp_path / "rope")
    (tmp_path / "prompt.txt").write_text("good night, sweet lord")
    proc = cli(str(run_dir), "--prompt_file", "prompt.txt", "--method", "yarn", "--max_new_tokens", str(3 * L),
               "--num_samples", "2", "--device", "cpu", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    samples = proc.stdout.split("\n---------------\n")
    assert len(samples) == 3 and samples[2] == "" and all(s.startswith("good night, sweet lord") for s in samples[:2])


def test_factors_above_the_evaluations_cap_are_one_line_errors(tmp_path):
    # the cap the evaluation uses (common.MAX_FACTOR), pinned or reached through the length asked for
    run_dir = write_run(tmp_path / "rope")
    for argv, message in ((["--factor", "1e300"], "--factor 1e300 is too large: use auto or a number <= 1e+06"),
                          (["--max_new_tokens", str(10 ** 30)], "factor 6.25e+28, above 1e+06")):
        proc = subprocess.run([sys.executable, str(ROOT / "sample.py"), str(run_dir), "--method", "ntk", *argv],
                              capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"},
                              timeout=120)
        assert proc.returncode == 1 and message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
