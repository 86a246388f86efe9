"""A Hugging Face model folder converted into a run of this repo's GPT (pretrained.py) gives transformers'
numbers: the same logits for each family, the same per-position NLL under each rope_scaling type; a bad
folder is one line; every command reads the run, with the text its own tokenizer prepared. Every model is a
tiny one built by transformers from a config, with random weights and a tokenizer trained here: nothing is
downloaded."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.nn import functional as F

transformers = pytest.importorskip("transformers")

from common import UserError
from data.dataset import get_rows
from pretrained import convert
from runfolder import load_checkpoint
from runtime import load_run, model_from_checkpoint

ROOT = Path(__file__).resolve().parents[1]
SIZE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96, vocab_size=320,
            max_position_embeddings=32)
FAMILIES = {  # model_type: (config class, model class, family-specific settings)
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", dict(rotary_pct=0.25)),  # rotary dim 4 of 16
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(num_key_value_heads=2)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(num_key_value_heads=2)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(num_key_value_heads=1, sliding_window=24)),
}
SCALINGS = {
    "linear": {"rope_type": "linear", "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 16,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0},
}


def save_tokenizer(folder):
    """A byte-level BPE of 300 tokens trained on the README, saved as the folder's tokenizer.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([(ROOT / "README.md").read_text()[:8000]], trainer)
    tok.save(str(folder / "tokenizer.json"))


def hf_model(folder, family, **settings):
    """A random transformers model of the family, saved into folder with a tokenizer; in eval mode."""
    config_class, model_class, own = FAMILIES[family]
    config = getattr(transformers, config_class)(**{**SIZE, **own, **settings})
    torch.manual_seed(0)
    model = getattr(transformers, model_class)(config).eval()
    with torch.no_grad():  # every weight random, norms and biases included, so that each one is tested
        for name, p in model.named_parameters():
            mean = 1.0 if "norm" in name and name.endswith("weight") else 0.0
            p.normal_(mean, 0.3 if p.dim() == 1 else 0.08)
    folder.mkdir(exist_ok=True)
    model.save_pretrained(folder)
    save_tokenizer(folder)
    return model


def tokens(n=64, seed=0):
    return torch.randint(0, 300, (2, n), generator=torch.Generator().manual_seed(seed))


def converted(folder, dataset=None):
    """folder converted into the run folder beside it, <name>-run."""
    return convert(folder, folder.with_name(folder.name + "-run"), dataset)


def ours(folder):
    return model_from_checkpoint(load_checkpoint(converted(folder))).eval()


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_gives_transformers_logits(tmp_path, family):
    hf = hf_model(tmp_path / family, family)
    idx = tokens()  # 64 tokens, past the 32 of max_position_embeddings: the rotation as it extrapolates too
    with torch.no_grad():
        want, got = hf(idx).logits, ours(tmp_path / family)(idx)[0]
    assert (got - want).abs().max() < 1e-4


def test_tied_embeddings_read_as_one_weight(tmp_path):
    hf = hf_model(tmp_path / "m", "llama", tie_word_embeddings=True)
    model, idx = ours(tmp_path / "m"), tokens()
    assert model.lm_head.weight is model.transformer.wte.weight
    with torch.no_grad():
        assert (model(idx)[0] - hf(idx).logits).abs().max() < 1e-4


def test_sharded_weights_read_as_their_index_lists_them(tmp_path):
    hf = hf_model(tmp_path / "m", "qwen2")
    hf.save_pretrained(tmp_path / "sharded", max_shard_size="100KB")
    save_tokenizer(tmp_path / "sharded")
    assert len(list((tmp_path / "sharded").glob("*.safetensors"))) > 1
    with torch.no_grad():
        assert (ours(tmp_path / "sharded")(tokens())[0] - hf(tokens()).logits).abs().max() < 1e-4


@pytest.mark.parametrize("family", ["gpt_neox", "llama"])
def test_transformers_4_config_keys_read_as_5(tmp_path, family):
    """v4 configs name the base rope_theta (GPT-NeoX: rotary_emb_base), the scaling rope_scaling, Pythia's
    rotary share rotary_pct."""
    hf = hf_model(tmp_path / "m", family, rope_scaling=dict(SCALINGS["yarn"]))  # transformers edits it
    path = tmp_path / "m" / "config.json"
    cfg = json.loads(path.read_text())
    params = cfg.pop("rope_parameters")
    if family == "gpt_neox":
        cfg.update(rotary_emb_base=params.pop("rope_theta"), rotary_pct=params.pop("partial_rotary_factor"))
    else:
        cfg.update(rope_theta=params.pop("rope_theta"))
    cfg["rope_scaling"] = {"type" if family == "llama" else "rope_type": params.pop("rope_type"), **params}
    path.write_text(json.dumps(cfg))
    with torch.no_grad():
        assert (ours(tmp_path / "m")(tokens())[0] - hf(tokens()).logits).abs().max() < 1e-4


def per_position_nll(logits, idx):
    return F.cross_entropy(logits[:, :-1].transpose(1, 2), idx[:, 1:], reduction="none").mean(0)


@pytest.mark.parametrize("family", ["llama", "gpt_neox"])
@pytest.mark.parametrize("kind", SCALINGS)
def test_each_rope_scaling_gives_transformers_nll_by_position(tmp_path, family, kind):
    """A model's own rope_scaling (Llama 3's, a YaRN fine-tune's) is its trained state: read as transformers
    reads it, over the rotary dims only for GPT-NeoX's partial rotary (the attention factor too)."""
    hf = hf_model(tmp_path / "m", family, rope_scaling=dict(SCALINGS[kind]))  # a copy, as above
    idx = tokens(96)  # 3x max_position_embeddings: the dynamic base grows with the length
    with torch.no_grad():
        want, got = per_position_nll(hf(idx).logits, idx), per_position_nll(ours(tmp_path / "m")(idx)[0], idx)
    assert (got - want).abs().max() < 1e-4



@pytest.mark.parametrize("method", ["none", "pi", "yarn", "dynamic-ntk"])
def test_the_benchmark_reads_each_method_as_transformers_does(tmp_path, method):
    """lab/hf_bench.py's two readings of a method at 2x (the GPT's, transformers' rope_parameters) agree, so its
    timings compare the same computation."""
    from lab import hf_bench
    hf_model(tmp_path / "m", "llama")
    run, threads = converted(tmp_path / "m"), torch.get_num_threads()
    (_, _, got), (_, _, want) = (hf_bench.read(impl, tmp_path / "m", run, method, 2, threads) for impl in ("gpt", "hf"))
    assert len(got) == 64 and np.abs(got - want).max() < 1e-4


# ----------------------------------------------------------------------------- what is refused, in one line

def refused(folder):
    with pytest.raises(UserError) as e:
        converted(folder)
    assert not folder.with_name(folder.name + "-run").exists()  # a failed conversion leaves no folder
    return str(e.value)


def test_another_architecture_is_one_line_naming_the_supported(tmp_path):
    hf_model(tmp_path / "m", "llama")
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    (tmp_path / "m" / "config.json").write_text(json.dumps({**cfg, "model_type": "gpt2"}))
    error = refused(tmp_path / "m")
    assert "model_type 'gpt2'" in error and "Pythia" in error and "Mistral" in error


def test_missing_damaged_or_mismatched_weights_are_one_line(tmp_path):
    hf_model(tmp_path / "m", "gpt_neox")
    path, cfg = tmp_path / "m" / "config.json", json.loads((tmp_path / "m" / "config.json").read_text())
    path.write_text(json.dumps({**cfg, "num_hidden_layers": 3}))
    assert "no tensor 'gpt_neox.layers.2." in refused(tmp_path / "m")
    path.write_text(json.dumps({**cfg, "intermediate_size": 128}))
    assert "dense_h_to_4h.weight is (96, 64), the config makes it (128, 64)" in refused(tmp_path / "m")
    path.write_text(json.dumps({**cfg, "num_hidden_layers": 1}))
    assert "tensors it has no place for (gpt_neox.layers.1." in refused(tmp_path / "m")
    path.write_text("{not json")
    assert "config.json is damaged" in refused(tmp_path / "m")
    path.write_text(json.dumps(cfg))
    weights = tmp_path / "m" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    assert "model.safetensors is damaged" in refused(tmp_path / "m")
    weights.unlink()
    assert "has no *.safetensors weights" in refused(tmp_path / "m")


@pytest.mark.parametrize("family, key, message", [
    ("llama", {"head_dim": 32}, "head_dim 32 is not hidden_size / num_attention_heads"),
    ("qwen2", {"use_sliding_window": True}, "use_sliding_window (Qwen2's sliding window on some layers only)")])
def test_a_key_the_gpt_cannot_read_is_one_line(tmp_path, family, key, message):
    hf_model(tmp_path / "m", family)
    path = tmp_path / "m" / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **key}))
    assert message in refused(tmp_path / "m")


def test_a_run_is_converted_once_and_a_model_folder_given_as_a_run_says_so(tmp_path):
    hf_model(tmp_path / "m", "llama")
    run = converted(tmp_path / "m")
    before = (run / "ckpt.pt").read_bytes()
    with pytest.raises(UserError, match=r"m-run already holds a run \(ckpt.pt\): give another --out"):
        converted(tmp_path / "m")
    assert (run / "ckpt.pt").read_bytes() == before
    with pytest.raises(UserError, match=r"is a model folder, not a run: convert it once, python pretrained.py"):
        load_run(tmp_path / "m")
    with pytest.raises(UserError, match=r"converted with no held-out text: python data/text/prepare.py SOURCE "
                                        r"--name NAME --tokenizer .*, then python pretrained.py .* --dataset NAME"):
        load_run(run)


def test_a_conversion_into_a_folder_whose_overwrite_was_stopped_loses_no_run(tmp_path, dataset):
    # issue 61: a run, an --overwrite=True of it killed before its first checkpoint, a conversion there, a training there
    import train
    from runfolder import replaced
    from test_safety import one_line
    from test_train import args, run_main
    run = tmp_path / "a"
    train.main(args(dataset, run))
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    run.rename(replaced(run))
    run.mkdir()
    hf_model(tmp_path / "m", "llama")
    with pytest.raises(UserError, match=r"a already holds a run \(ckpt.pt, log.jsonl\): give another --out"):
        convert(tmp_path / "m", run)
    one_line(run_main(args(dataset, run)), "already holds a run")
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before and not replaced(run).exists()


def test_a_training_into_a_converted_run_advises_a_fine_tune_not_a_resume(tmp_path, dataset):
    from test_safety import one_line
    from test_train import args, run_main
    hf_model(tmp_path / "m", "llama")
    run = converted(tmp_path / "m")
    message = one_line(run_main(args(dataset, run)), "already holds a run (ckpt.pt)",
                       f"fine-tune from it into another folder (--init_from={run} --out_dir=NEW)", "--overwrite=True")
    assert "resume" not in message


def test_a_failed_write_is_one_line_and_leaves_no_run(tmp_path, monkeypatch):
    hf_model(tmp_path / "m", "llama")

    def full_disk(state, f):  # what a write into a full disk raises midway
        f.write(b"part of a checkpoint")
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(OSError, match=r"cannot write .*m-run/ckpt.pt \(No space left on device\): free some"):
        converted(tmp_path / "m")
    assert not (tmp_path / "m-run").exists()


def test_16_bit_weights_stay_16_bit_in_the_run_and_are_read_in_float32(tmp_path):
    import copy
    hf = hf_model(tmp_path / "m", "llama")
    with torch.no_grad():  # weights a bf16 file holds exactly; the rotary tables stay float32
        for p in hf.parameters():
            p.copy_(p.to(torch.bfloat16))
    copy.deepcopy(hf).to(torch.bfloat16).save_pretrained(tmp_path / "m")
    ckpt = load_checkpoint(converted(tmp_path / "m"))
    assert {t.dtype for t in ckpt["model"].values()} == {torch.bfloat16}
    model = model_from_checkpoint(ckpt).eval()
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    with torch.no_grad():
        assert (model(tokens())[0] - hf(tokens()).logits).abs().max() < 1e-4


def test_a_converted_run_needs_nothing_of_its_model_folder(tmp_path):
    import shutil
    import sample
    from tokenizers import Tokenizer
    hf_model(tmp_path / "m", "gpt_neox")
    tok = Tokenizer.from_file(str(tmp_path / "m" / "tokenizer.json"))
    run = converted(tmp_path / "m")
    shutil.rmtree(tmp_path / "m")
    samples = sample.sample(sample.parse_args([str(run), "--max_new_tokens", "4", "--prompt", "the model",
                                               "--device", "cpu"]))
    assert samples[0].startswith("the model") and tok.decode(tok.encode(samples[0]).ids) == samples[0]


def test_a_model_naming_no_end_of_text_token_samples_from_a_prompt_only(tmp_path):
    import sample
    from data.text.prepare import prepare
    hf_model(tmp_path / "m", "qwen2")  # transformers' Qwen2 config names no eos_token_id
    run = converted(tmp_path / "m")
    assert sample.sample(sample.parse_args([str(run), "--max_new_tokens", "2", "--prompt", "the", "--device", "cpu"]))
    with pytest.raises(UserError, match="names no end-of-text token to start a new document: give --prompt"):
        sample.sample(sample.parse_args([str(run), "--max_new_tokens", "2", "--device", "cpu"]))
    (tmp_path / "texts").mkdir()
    (tmp_path / "texts" / "a.txt").write_text("some text")
    with pytest.raises(UserError, match="no end-of-text token .*: documents need one between them"):
        prepare(tmp_path / "texts", out_dir=tmp_path / "data", tokenizer=tmp_path / "m", workers=1)


# ----------------------------------------------------------------------------- a model folder is untrusted input

def edit(folder, name="config.json", **changes):
    """folder/name (a JSON file) with changes; a text written as it is."""
    path = folder / name
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


@pytest.fixture
def llama(tmp_path):
    hf_model(tmp_path / "m", "llama")
    return tmp_path / "m"


@pytest.mark.parametrize("key, value, message", [
    ("num_hidden_layers", "2", 'num_hidden_layers "2" is not allowed: an integer >= 1'),
    ("num_hidden_layers", 2.5, "num_hidden_layers 2.5 is not allowed: an integer >= 1"),
    ("num_attention_heads", 0, "num_attention_heads 0 is not allowed: an integer >= 1"),
    ("intermediate_size", 0, "intermediate_size 0 is not allowed: an integer >= 1"),
    ("vocab_size", "320", 'vocab_size "320" is not allowed: an integer >= 1'),
    ("max_position_embeddings", None, "max_position_embeddings null is not allowed: an integer >= 1"),
    ("rope_scaling", "linear", 'rope_scaling "linear" is not allowed: a JSON object'),
    ("rope_scaling", ["linear", 2], 'rope_scaling ["linear", 2] is not allowed: a JSON object'),
    ("rope_theta", "abc", 'rope_theta "abc" is not allowed: a number > 0'),
    ("rope_theta", None, "rope_theta null is not allowed: a number > 0"),
    ("rope_theta", float("inf"), "rope_theta Infinity is not allowed: a number > 0"),
    ("rope_parameters", {"rope_type": "default", "rope_theta": "abc"},
     'rope_parameters: rope_theta "abc" is not allowed: a number > 0'),
    ("rope_scaling", {"rope_type": ["linear"], "factor": 2.0},
     'rope_scaling: rope_type ["linear"] is not allowed: a string'),
    ("rope_scaling", {"rope_type": "linear", "factor": "abc"}, "rope_scaling factor must be a number >= 1, got 'abc'"),
    ("tie_word_embeddings", "false", 'tie_word_embeddings "false" is not allowed: true or false'),
    ("eos_token_id", [], "eos_token_id [] is not allowed: a token id >= 0 or a non-empty list of them"),
    ("rms_norm_eps", -1e-6, "rms_norm_eps -1e-06 is not allowed: a number > 0")])
def test_every_value_of_config_json_is_checked_by_its_key(llama, key, value, message):
    edit(llama, **{key: value})
    assert f"config.json: {message}" in refused(llama)


def test_tokenizer_config_json_is_checked_as_config_json_is(llama):
    edit(llama, eos_token_id=None)  # the end-of-text token is then tokenizer_config.json's
    (llama / "tokenizer_config.json").write_text("{not json")
    assert "tokenizer_config.json is damaged: not JSON" in refused(llama)
    (llama / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"special": True}}))
    assert "tokenizer_config.json: eos_token {\"special\": true} is not allowed: a token's text" in refused(llama)
    (llama / "generation_config.json").write_text("[not read]")  # transformers' sampling settings: not read
    (llama / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "<|endoftext|>"}}))
    assert load_checkpoint(converted(llama))["pretrained"]["eot_token"] == 0


def test_a_vocabulary_smaller_than_the_tokenizers_ids_is_refused(tmp_path):
    hf_model(tmp_path / "m", "llama", vocab_size=200)  # its tokenizer has 300 ids
    assert "the tokenizer's ids reach 299, past vocab_size 200" in refused(tmp_path / "m")
    hf_model(tmp_path / "n", "llama", eos_token_id=310)  # inside the model's 320 rows, past the tokenizer's 300
    assert "the end-of-text id 310 is not a token of its tokenizer (300 ids)" in refused(tmp_path / "n")


def test_rope_scaling_beside_rope_parameters_reads_as_transformers_or_is_refused(llama):
    default = json.loads((llama / "config.json").read_text())["rope_parameters"]
    edit(llama, rope_scaling={"rope_type": "linear", "factor": 2.0},
         rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0})
    assert "rope_scaling {'rope_type': 'linear', 'factor': 2.0} and rope_parameters {'rope_type': 'yarn'" \
        in refused(llama)
    edit(llama, rope_parameters=default)  # as v5 writes it: the default, beside a v4 rope_scaling
    hf = transformers.AutoModelForCausalLM.from_pretrained(llama).eval()
    assert hf.config.rope_parameters["rope_type"] == "linear"
    with torch.no_grad():
        assert (ours(llama)(tokens())[0] - hf(tokens()).logits).abs().max() < 1e-4


def test_a_tied_head_beside_another_lm_head_weight_is_refused(tmp_path):
    hf_model(tmp_path / "m", "llama")  # untied: lm_head.weight is its own
    edit(tmp_path / "m", tie_word_embeddings=True)
    assert "tie_word_embeddings is true but lm_head.weight is not the embedding" in refused(tmp_path / "m")


def test_weights_are_checked_like_data(llama):
    from safetensors.torch import load_file, save_file
    path = llama / "model.safetensors"
    tensors = load_file(path)
    bad = dict(tensors)
    bad["model.norm.weight"] = torch.full_like(bad["model.norm.weight"], float("nan"))
    save_file(bad, path)
    assert "model.norm.weight holds 64 NaN or infinite values" in refused(llama)
    bad["model.norm.weight"] = torch.ones(64, dtype=torch.int32)
    save_file(bad, path)
    assert "model.norm.weight holds torch.int32 values, not floating-point weights" in refused(llama)
    save_file(tensors, path)
    save_file({"model.norm.weight": tensors["model.norm.weight"] * 2}, llama / "other.safetensors")
    assert "model.norm.weight is in both model.safetensors and other.safetensors: one file per" in refused(llama)


@pytest.mark.parametrize("weight_map, message", [
    ([], "model.safetensors.index.json is not a JSON object but list"),
    ({"model.norm.weight": 3}, "weight_map names 3, not a file inside"),
    ({"model.norm.weight": ["model.safetensors"]}, "weight_map names ['model.safetensors'], not a file inside"),
    ({"model.norm.weight": "../outside.safetensors"}, "weight_map names '../outside.safetensors', not a file inside")])
def test_a_shard_index_is_checked_and_reads_only_files_inside_the_folder(llama, weight_map, message):
    import shutil
    shutil.copy(llama / "model.safetensors", llama.parent / "outside.safetensors")
    index = weight_map if isinstance(weight_map, list) else {"metadata": {}, "weight_map": weight_map}
    (llama / "model.safetensors.index.json").write_text(json.dumps(index))
    assert message in refused(llama)


def test_a_dangling_model_safetensors_is_named_as_such(llama):
    (llama / "model.safetensors").unlink()
    (llama / "model.safetensors").symlink_to(llama / "gone.safetensors")
    error = refused(llama)
    assert "model.safetensors is missing (a link to no file)" in error and "index" not in error


@pytest.mark.parametrize("out", ["", "   "])
def test_a_blank_out_is_refused(llama, out, monkeypatch):
    monkeypatch.chdir(llama.parent)
    with pytest.raises(UserError, match=f"--out '{out}' is blank: name the run folder"):
        convert(llama, out)
    assert sorted(p.name for p in llama.parent.iterdir()) == ["m"]


def test_a_name_that_is_not_utf8_is_one_line(llama):
    import os
    bad = os.fsdecode(str(llama).encode() + b"\xff")
    os.rename(llama, bad)
    with pytest.raises(UserError, match=r"MODEL_DIR '.*m\\udcff' is not a UTF-8 name .*: rename it"):
        convert(bad, llama.with_name("run"))
    os.rename(bad, llama)
    with pytest.raises(UserError, match=r"--out '.*run\\udcff' is not a UTF-8 name"):
        convert(llama, os.fsdecode(str(llama.with_name("run")).encode() + b"\xff"))
    assert sorted(p.name for p in llama.parent.iterdir()) == ["m"]


def test_a_model_or_data_folder_is_not_an_out(llama, dataset):
    for folder, held in ((llama, "config.json"), (Path(dataset), "meta.json")):
        before = sorted(folder.iterdir())
        with pytest.raises(UserError, match=f"is a model or data folder \\(it holds {held}\\): give --out a folder"):
            convert(llama, folder)
        assert sorted(folder.iterdir()) == before


def test_an_out_that_cannot_be_written_is_refused_before_the_conversion(llama, monkeypatch):
    import subprocess
    import pretrained
    out = llama.with_name("m-run")
    out.mkdir()
    if subprocess.run(["chattr", "+i", str(out)], capture_output=True).returncode:  # root ignores a mode
        pytest.skip("chattr +i is not available here")
    monkeypatch.setattr(pretrained, "run_of", lambda *a: pytest.fail("converted before the folder was checked"))
    try:
        with pytest.raises(UserError, match="output folder .*m-run cannot be written .*: give another --out"):
            convert(llama, out)
    finally:
        subprocess.run(["chattr", "-i", str(out)])


def test_a_disk_that_fills_during_the_save_is_one_line(llama, monkeypatch):
    import io
    import pretrained

    class FullDisk(io.RawIOBase):  # what a file on a full disk does once its first bytes are in
        written = 0

        def writable(self):
            return True

        def write(self, b):
            self.written += len(b)
            if self.written > 4096:
                raise OSError(28, "No space left on device")
            return len(b)
    monkeypatch.setattr(pretrained, "write_atomic", lambda path, write: write(FullDisk()))
    with pytest.raises(OSError, match=r"cannot write .*m-run/ckpt.pt \(the write failed: .*\): free some space"):
        converted(llama)


# ----------------------------------------------------------------------------- its tokenizer, every command

@pytest.fixture(scope="module")
def pythia(tmp_path_factory):
    """A tiny random GPT-NeoX folder converted into a run, reading held-out text prepared by its tokenizer
    (2 of 8 documents)."""
    from data.text.prepare import prepare
    root = tmp_path_factory.mktemp("pythia")
    hf_model(root / "model", "gpt_neox", max_position_embeddings=16)
    texts = root / "texts"
    texts.mkdir()
    words = (ROOT / "README.md").read_text().split()
    for i in range(8):
        (texts / f"doc{i}.txt").write_text(" ".join(words[i * 400:(i + 1) * 400]))
    prepare(texts, out_dir=root / "data", val_fraction=0.25, tokenizer=root / "model", workers=1)
    return converted(root / "model", str(root / "data"))


def test_held_out_text_is_tokenized_by_the_model_and_recorded_in_its_run(pythia):
    import hashlib
    from tokenizers import Tokenizer
    model, ckpt, folder, _ = load_run(pythia)
    meta = json.loads((folder / "meta.json").read_text())
    source = pythia.with_name("model") / "tokenizer.json"
    tok, sha = Tokenizer.from_file(str(source)), hashlib.sha256(source.read_bytes()).hexdigest()
    assert meta["tokenizer"] == {"tokenizer.json": sha} and meta["vocab_size"] == tok.get_vocab_size()
    assert meta["eot_token"] == 2  # transformers' default eos_token_id
    assert ckpt["pretrained"]["tokenizer"] == meta["tokenizer"] and ckpt["config"]["dataset"] == str(folder)
    assert ckpt["pretrained"]["family"] == "gpt_neox" and model.config.parallel_residual


def test_a_corpus_tokenized_otherwise_is_refused_in_one_line(pythia, dataset, tmp_path):
    gpt2_text = str(Path(dataset).resolve())
    with pytest.raises(UserError, match="--dataset .* was tokenized with gpt2, not .*tokenizer.json: its ids would"):
        convert(pythia.with_name("model"), tmp_path / "other", gpt2_text)
    ckpt = load_checkpoint(pythia)  # a run whose record was edited after conversion: refused when read too
    ckpt["config"]["dataset"] = gpt2_text
    (tmp_path / "edited").mkdir()
    torch.save(ckpt, tmp_path / "edited" / "ckpt.pt")
    with pytest.raises(UserError, match="tokenized with gpt2, not .*tokenizer.json: its ids would"):
        load_run(tmp_path / "edited")


def test_a_trained_runs_tokenizer_is_part_of_its_identity(pythia, tmp_path):
    # issue 61: a run trained on a model tokenizer's text encodes and decodes with it, and reads no text of another
    import train
    from data.text.prepare import prepare
    from data.tokenizer import run_tokenizer
    from tokenizers import Tokenizer
    from test_train import args
    text, model_data = pythia.parent / "texts", pythia.parent / "data"
    train.main(args(str(model_data), tmp_path / "run", max_iters=2, eval_interval=2))
    ckpt = load_checkpoint(tmp_path / "run")
    words = "the run folder holds the checkpoint"
    ids = Tokenizer.from_file(str(pythia.with_name("model") / "tokenizer.json")).encode(words).ids
    assert run_tokenizer(ckpt).encode_ordinary(words) == ids and run_tokenizer(ckpt).decode(ids) == words
    vocab = json.loads((model_data / "meta.json").read_text())["vocab_size"]
    gpt2_data = prepare(text, vocab_size=vocab, val_fraction=0.25, out_dir=tmp_path / "gpt2")  # the same vocabulary
    ckpt["config"]["dataset"] = str(gpt2_data)  # the run's text re-prepared with GPT-2's BPE
    (tmp_path / "moved").mkdir()
    torch.save(ckpt, tmp_path / "moved" / "ckpt.pt")
    with pytest.raises(UserError, match=r"tokenized with gpt2, not .*moved's tokenizer.json: its ids would mean other"):
        load_run(tmp_path / "moved")
    (model_data / "tokenizer.json").unlink()  # a corpus prepared before the tokenizer was kept beside its data
    before = {name: (model_data / name).read_bytes() for name in ("train.bin", "val.bin")}
    with pytest.raises(UserError, match="holds no tokenizer.json of that sha256"):
        run_tokenizer(load_checkpoint(tmp_path / "run"))
    prepare(text, val_fraction=0.25, tokenizer=pythia.with_name("model"), workers=1, out_dir=model_data)  # its fix
    assert {name: (model_data / name).read_bytes() for name in before} == before
    assert run_tokenizer(load_checkpoint(tmp_path / "run")).decode(ids) == words


def test_every_command_reads_a_model_folder_with_every_method(pythia, tmp_path):
    """extrapolate (every method, both dynamic modes), the context sweep, probes and sample take it."""
    import sample
    from eval import extrapolate
    from eval.methods import METHODS
    from lab import context, probes
    from tokenizers import Tokenizer
    extrapolate.main([str(pythia), "--lengths", "1,2", "--methods", ",".join(METHODS), "--tokens", "128",
                      "--out", str(tmp_path / "x"), "--no-wandb", "--device", "cpu",
                      "--dynamic_modes", "sequence,causal", "--pair_factors", "1,2"])
    report = json.loads((tmp_path / "x" / "extrapolation.json").read_text())
    assert {r["method"] for r in report["results"] if r["available"] and r["ppl"]} == set(METHODS)
    assert {r["mode"] for r in report["results"]} >= {"sequence", "causal"}
    context.main([str(pythia), "--out", str(tmp_path / "c"), "--device", "cpu", "--units", "2",
                  "--contexts", "0.5,1,2"])
    report = probes.probes(probes.parse_args([
        str(pythia), "--out", str(tmp_path / "p"), "--trials", "2", "--segment", "4", "--distances", "0.5,2",
        "--lengths", "8", "--depths", "0.5", "--methods", "none,crop,yarn", "--probes", "copy,passkey",
        "--no-wandb"]))
    assert {r["probe"] for r in report["results"] if r["available"]} == {"copy", "passkey"}
    samples = sample.sample(sample.parse_args([str(pythia), "--max_new_tokens", "4", "--prompt", "the model",
                                               "--device", "cpu"]))
    tok = Tokenizer.from_file(str(pythia.with_name("model") / "tokenizer.json"))  # decoded by the model's
    assert samples[0].startswith("the model") and tok.decode(tok.encode(samples[0]).ids) == samples[0]


def test_the_pythia_ladder_script_runs_end_to_end_on_tiny_stand_ins(pythia, tmp_path):
    import os
    import subprocess
    hf_model(tmp_path / "pythia-b", "gpt_neox", max_position_embeddings=16, hidden_size=32)  # a second rung
    env = dict(os.environ, METHODS="none,crop,yarn,rerope", UNITS="6", TOKENS="64", VAL_FRACTION="0.5", DOCS="all")
    proc = subprocess.run(["bash", str(ROOT / "lab" / "pythia.sh"), str(pythia.parent / "texts"),
                           str(tmp_path / "out"), str(pythia.with_name("model")), str(tmp_path / "pythia-b")],
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for rung in ("model", "pythia-b"):
        context = json.loads((tmp_path / "out" / rung / "context.json").read_text())
        assert context["contexts"] == [16, 32, 64]
        assert {"crop", "rerope"} <= {r["method"] for r in context["results"]}
        assert (tmp_path / "out" / rung / "extrapolation.json").is_file()
    assert (tmp_path / "out" / "compare" / "compare.md").is_file()
    page = (tmp_path / "out" / "protocols" / "shapes.md").read_text()
    assert "| pythia-b |" in page and "distortion 4L | reads past L 4L" in page
    recorded = load_checkpoint(tmp_path / "out" / "pythia-b")["config"]["dataset"]
    assert recorded == str((tmp_path / "out" / "heldout").resolve())


# ----------------------------------------------------------------------------- a vocabulary past uint16

WIDE_VOCAB = 70_000  # past uint16's 65,536 ids, as Llama 3's 128k and Qwen2's 152k


def save_wide_tokenizer(folder, words):
    """A word-level tokenizer.json of WIDE_VOCAB ids, the words at its top ids (all above 65,535)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    top = sorted(set(words))
    pads = [f"<pad_{i}>" for i in range(WIDE_VOCAB - 3 - len(top))]
    vocab = {t: i for i, t in enumerate(["<unk>", "<s>", "</s>", *pads, *top])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(folder / "tokenizer.json"))
    return tok


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """A tiny random Llama of WIDE_VOCAB ids, with held-out text prepared by its tokenizer (2 of 8 docs)."""
    from data.text.prepare import prepare
    root, size = tmp_path_factory.mktemp("wide"), dict(vocab_size=WIDE_VOCAB, max_position_embeddings=16)
    hf_model(root / "model", "llama", tie_word_embeddings=True, **size)
    words = (ROOT / "README.md").read_text().split()[:3200]
    save_wide_tokenizer(root / "model", words)
    (root / "texts").mkdir()
    for i in range(8):
        (root / "texts" / f"doc{i}.txt").write_text(" ".join(words[i * 400:(i + 1) * 400]))
    prepare(root / "texts", out_dir=root / "data", val_fraction=0.25, tokenizer=root / "model", workers=1)
    converted(root / "model", str(root / "data"))
    return root


def test_a_tokenizer_past_65536_ids_is_stored_as_uint32_and_its_ids_round_trip(wide):
    from tokenizers import Tokenizer
    from data.dataset import load_meta, load_split
    meta, tok = load_meta(wide / "data"), Tokenizer.from_file(str(wide / "model" / "tokenizer.json"))
    assert meta["dtype"] == "uint32" and meta["vocab_size"] == WIDE_VOCAB and meta["eot_token"] == 2
    for split in ("train", "val"):
        tokens, docs = load_split(wide / "data", split)
        assert tokens.dtype == np.uint32 and meta["files"][f"{split}.bin"]["bytes"] == 4 * len(tokens)
        for name, (start, end) in zip(meta["splits"][split]["names"], docs):
            ids = tok.encode((wide / "texts" / name).read_text(), add_special_tokens=False).ids
            assert tokens[start:end].tolist() == ids and tokens[end] == 2
        assert tokens.max() > 65_535 and get_rows(tokens, 4, 16, np.random.default_rng(0)).max() > 65_535


def test_a_uint32_corpus_is_read_by_evaluation_and_training(wide, tmp_path):
    import train
    from eval import extrapolate
    extrapolate.main([str(wide / "model-run"), "--lengths", "1,2", "--methods", "none,crop,yarn",
                      "--tokens", "64", "--out", str(tmp_path / "x"), "--no-wandb", "--device", "cpu"])
    report = json.loads((tmp_path / "x" / "extrapolation.json").read_text())
    assert {r["method"] for r in report["results"] if r["available"] and r["ppl"]} == {"none", "crop", "yarn"}
    tiny = dict(dataset=wide / "data", out_dir=tmp_path / "run", batch_size=2, block_size=16, n_layer=1,
                n_head=2, n_embd=16, max_iters=2, lr_decay_iters=2, warmup_iters=1, eval_interval=2,
                eval_iters=1, wandb_log=False, device="cpu")
    train.main([f"--{k}={v}" for k, v in tiny.items()])
    assert (tmp_path / "run" / "ckpt.pt").is_file()


def test_a_dtype_that_cannot_hold_the_vocabulary_is_one_line(wide, tmp_path):
    import shutil
    from data.dataset import load_meta
    shutil.copytree(wide / "data", tmp_path / "data")
    meta = json.loads((tmp_path / "data" / "meta.json").read_text())
    for dtype in ("uint16", "int8"):
        (tmp_path / "data" / "meta.json").write_text(json.dumps({**meta, "dtype": dtype}))
        with pytest.raises(UserError, match=f"dtype '{dtype}' does not hold vocab_size 70,000's ids"):
            load_meta(tmp_path / "data")
