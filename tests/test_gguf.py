"""A llama.cpp GGUF file converted into a run (pretrained.py FILE.gguf) gives transformers' own reading of the same
file: the same logits (its quantized weights dequantized alike, q and k taken out of llama.cpp's interleaved rotary
layout) and the same token ids; its record names the file and its quantization; another type or architecture is
one line. Every file is a tiny Llama the test writes with the gguf package, random weights and a BPE trained here:
nothing is downloaded."""
import hashlib
import json

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # transformers' GGUF reading needs it

from common import UserError
from pretrained import convert
from runfolder import load_checkpoint
from runtime import model_from_checkpoint

Q = gguf.GGMLQuantizationType
SIZE = dict(layers=2, embd=64, heads=4, kv_heads=2, ffn=96, context=32, theta=5000.0, eps=1e-5)
TYPES = {  # llama.cpp's tensor name: how the test stores it (every type ropelab reads, Q4_1 twice)
    "token_embd": Q.Q8_0, "output": Q.Q4_1, "attn_q": Q.Q4_1, "attn_k": Q.Q4_0, "attn_v": Q.Q5_0,
    "attn_output": Q.Q5_1, "ffn_gate": Q.F16, "ffn_up": Q.BF16, "ffn_down": Q.Q8_0, "attn_norm": Q.F32,
    "ffn_norm": Q.F32, "output_norm": Q.F32}
TEXT = "The model reads 12,345 tokens of text at 2x its trained length, then 4x. " * 3


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    """(tokens, merges) of a byte-level BPE of 300 tokens trained on the README, <|endoftext|> its id 0."""
    from pathlib import Path
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([(Path(__file__).resolve().parents[1] / "README.md").read_text()[:8000]], trainer)
    model = json.loads(tok.to_str())["model"]
    tokens = sorted(model["vocab"], key=model["vocab"].get)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return tokens, merges


def interleaved(w, n_head):
    """llama.cpp's converter's permutation of a Llama q or k projection (convert_hf_to_gguf.py's permute)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path, bpe, arch="llama", tied=False, types=TYPES, seed=0, **meta):
    """A tiny random Llama as llama.cpp writes one: metadata (meta: GGUFWriter's add_<key> values in place of
    its own), a gpt2 BPE tokenizer, each tensor in its type."""
    s, tokens, merges = SIZE, *bpe
    V, C, H, KV, F = len(tokens), s["embd"], s["heads"], s["kv_heads"], s["ffn"]
    hd, rng = C // H, np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch)
    for key, value in {**dict(block_count=s["layers"], context_length=s["context"], embedding_length=C,
                           feed_forward_length=F, head_count=H, head_count_kv=KV, rope_freq_base=s["theta"],
                           layer_norm_rms_eps=s["eps"], rope_dimension_count=hd, vocab_size=V), **meta}.items():
        getattr(w, f"add_{key}")(value)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3 if t.startswith("<|") else 1 for t in tokens])  # 3: control, 1: normal
    w.add_token_merges(merges)
    w.add_eos_token_id(0)
    shapes = {"token_embd": (V, C), "output_norm": (C,)} | ({} if tied else {"output": (V, C)})
    for i in range(s["layers"]):
        shapes |= {f"blk.{i}.{k}": v for k, v in dict(
            attn_norm=(C,), ffn_norm=(C,), attn_q=(H * hd, C), attn_k=(KV * hd, C), attn_v=(KV * hd, C),
            attn_output=(C, H * hd), ffn_gate=(F, C), ffn_up=(F, C), ffn_down=(C, F)).items()}
    for name, shape in shapes.items():
        kind = name.split(".")[-1]
        x = rng.normal(1.0 if "norm" in kind else 0.0, 0.3 if len(shape) == 1 else 0.08, shape).astype(np.float32)
        if kind in ("attn_q", "attn_k"):
            x = interleaved(x, H if kind == "attn_q" else KV)
        qtype = types[kind]
        if qtype == Q.F32:
            w.add_tensor(f"{name}.weight", x)
        elif qtype == Q.F64:
            w.add_tensor(f"{name}.weight", x.astype(np.float64))
        else:
            w.add_tensor(f"{name}.weight", gguf.quants.quantize(x, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def converted(path):
    return convert(path, path.with_name(path.stem + "-run"))


@pytest.mark.parametrize("tied", [False, True])
def test_a_gguf_file_gives_transformers_logits_for_its_own_reading(tmp_path, bpe, tied):
    path = write_gguf(tmp_path / "tiny.gguf", bpe, tied=tied)
    ckpt = load_checkpoint(converted(path))
    model = model_from_checkpoint(ckpt).eval()
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name, dtype=torch.float32)
    assert (model.lm_head.weight is model.transformer.wte.weight) == tied
    idx = torch.randint(0, len(bpe[0]), (2, 64), generator=torch.Generator().manual_seed(0))  # past its 32
    with torch.no_grad():
        want, got = hf.eval()(idx).logits, model(idx)[0]
    assert want.abs().max() > 0.5 and (got - want).abs().max() < 1e-4
    args = ckpt["model_args"]
    assert (args["n_layer"], args["n_kv_head"], args["block_size"], args["rope_base"]) == (2, 2, 32, 5000.0)


def test_a_gguf_files_tokenizer_is_transformers_own_and_its_record_names_the_file(tmp_path, bpe):
    from data.tokenizer import run_tokenizer
    path = write_gguf(tmp_path / "tiny.gguf", bpe)
    ckpt = load_checkpoint(converted(path))
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    ours = run_tokenizer(ckpt)
    text = TEXT + "<|endoftext|>" + TEXT
    assert ours.encode_ordinary(text) == hf(text, add_special_tokens=False)["input_ids"]
    assert ours.encode_ordinary("<|endoftext|>") == [0] and ours.decode(ours.encode_ordinary(TEXT)) == TEXT
    record = ckpt["pretrained"]
    assert record["eot_token"] == 0 and record["family"] == "llama"
    assert record["gguf"]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert record["gguf"]["bytes"] == path.stat().st_size
    assert record["gguf"]["types"] == {"BF16": 2, "F16": 2, "F32": 5, "Q4_0": 2, "Q4_1": 3, "Q5_0": 2, "Q5_1": 2,
                                       "Q8_0": 3}


def test_text_prepared_with_a_gguf_files_tokenizer_is_read_by_its_run(tmp_path, bpe):
    from data.text.prepare import prepare
    path = write_gguf(tmp_path / "tiny.gguf", bpe)
    (tmp_path / "texts").mkdir()
    for i in range(4):
        (tmp_path / "texts" / f"doc{i}.txt").write_text(TEXT * (i + 1))
    prepare(tmp_path / "texts", out_dir=tmp_path / "data", val_fraction=0.5, tokenizer=path, workers=1)
    run = convert(path, tmp_path / "run", str(tmp_path / "data"))
    assert load_checkpoint(run)["config"]["dataset"] == str(tmp_path / "data")


def refused(path):
    with pytest.raises(UserError) as e:
        converted(path)
    assert not path.with_name(path.stem + "-run").exists()
    return str(e.value)


def test_another_quantization_type_or_architecture_is_one_line(tmp_path, bpe):
    error = refused(write_gguf(tmp_path / "f64.gguf", bpe, types={**TYPES, "ffn_norm": Q.F64}))
    assert "tensor blk.0.ffn_norm.weight is F64; ropelab dequantizes F32, F16, BF16, Q8_0, Q4_0, Q4_1" in error
    error = refused(write_gguf(tmp_path / "qwen.gguf", bpe, arch="qwen2"))
    assert "general.architecture 'qwen2' is not one ropelab reads from a GGUF file (it reads llama" in error
    (tmp_path / "text.gguf").write_text("not a gguf file")
    assert "text.gguf is damaged: not a GGUF file" in refused(tmp_path / "text.gguf")


def test_a_gguf_files_metadata_goes_through_the_config_checks(tmp_path, bpe):
    error = refused(write_gguf(tmp_path / "a.gguf", bpe, head_count=0))
    assert "a.gguf's metadata: num_attention_heads 0 is not allowed: an integer >= 1" in error
    error = refused(write_gguf(tmp_path / "b.gguf", bpe, rope_freq_base=float("inf")))
    assert "b.gguf's metadata: rope_theta Infinity is not allowed: a number > 0" in error


def test_a_gguf_files_rope_scaling_is_its_trained_state(tmp_path, bpe):
    """llama.cpp's rope.scaling.* keys as the rope_scaling a Hugging Face config would hold; one it has no
    place for is refused, not dropped."""
    path = write_gguf(tmp_path / "yarn.gguf", bpe, rope_scaling_type=gguf.RopeScalingType.YARN,
                      rope_scaling_factor=4.0, rope_scaling_orig_ctx_len=8)
    assert load_checkpoint(converted(path))["model_args"]["rope_scaling"] == {
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8}
    error = refused(write_gguf(tmp_path / "attn.gguf", bpe, rope_scaling_type=gguf.RopeScalingType.LINEAR,
                               rope_scaling_factor=2.0, rope_scaling_attn_factors=0.5))
    assert "rope.scaling.attn_factor is not read (ropelab reads rope.scaling.type, factor" in error
