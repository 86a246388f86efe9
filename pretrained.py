"""Convert a Hugging Face model folder (config.json, *.safetensors, tokenizer.json) or a llama.cpp GGUF file
once into a ropelab run folder: its config as a GPTConfig, the weights as a state dict of this repository's
GPT (in the file's own dtype; a GGUF's dequantized to float32) and the tokenizer, in one ckpt.pt that every
command reads as a run, so that every method applies to it as to a trained run. Families: GPT-NeoX (Pythia),
Llama, Qwen2, Mistral (GGUF: Llama). Configs of transformers 4.x (rope_theta, rope_scaling, rotary_pct) and
5.x (rope_parameters) alike; a model's own rope scaling (Llama 3's) is part of its trained state.

    python pretrained.py MODEL_DIR --out out/pythia-160m [--dataset NAME]
    python pretrained.py SmolLM2-135M-Instruct.Q4_1.gguf --out out/smollm2 [--dataset NAME]
"""
import hashlib
import sys
import tempfile
from collections import Counter
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from common import UserError, command_parser, data_dir, release_outputs, run_cli, write_atomic
from config import gpt_config
from data.dataset import check_tokenizer
from data.tokenizer import (BOOL, DICT, POSITIVE, REQUIRED, TEXT, checked, folder_tokenizer, gguf_metadata,
                            gguf_tokenizer, integer, number, read_gguf, read_json)
from rope import ORIGINAL, scaling_type
from model import GPT
from runfolder import checkpoint_config, claim_run, run_files

FAMILIES = ("gpt_neox", "llama", "qwen2", "mistral")
SUPPORTED = "GPT-NeoX (Pythia), Llama, Qwen2 and Mistral in the Hugging Face layout, Llama as GGUF"
IGNORED = ("rotary_emb.inv_freq", "attention.bias", "attention.masked_bias")  # buffers older files hold


# ----------------------------------------------------------------------------- config.json -> GPTConfig

FRACTION = number(lambda v: 0 < v <= 1, "a number in (0, 1]")
CONFIG_KEYS = {  # config.json, one row a key: ((test, what is allowed), default); None: the family's default
    "vocab_size": (integer(1), REQUIRED),
    "num_hidden_layers": (integer(1), REQUIRED),
    "num_attention_heads": (integer(1), REQUIRED),
    "hidden_size": (integer(1), REQUIRED),
    "intermediate_size": (integer(1), REQUIRED),
    "max_position_embeddings": (integer(1), REQUIRED),
    "num_key_value_heads": (integer(1), None),
    "head_dim": (integer(1), None),
    "sliding_window": (integer(1), None),
    "rope_theta": (POSITIVE, 10000.0),
    "rotary_emb_base": (POSITIVE, None),  # GPT-NeoX's name for it in transformers 4.x
    "partial_rotary_factor": (FRACTION, None),
    "rotary_pct": (FRACTION, None),
    "rope_scaling": (DICT, None),
    "rope_parameters": (DICT, None),
    "rms_norm_eps": (POSITIVE, 1e-6),
    "layer_norm_eps": (POSITIVE, 1e-5),
    "tie_word_embeddings": (BOOL, False),
    "use_parallel_residual": (BOOL, True),
    "attention_bias": (BOOL, None),
    "mlp_bias": (BOOL, False),
    "use_sliding_window": (BOOL, False),
    "hidden_act": (TEXT, None),
}
MODEL_KEYS = ("rope_theta", "partial_rotary_factor")  # the model's, not a scaling's: v5 nests them in the dict
ROPE_KEYS = {k: (CONFIG_KEYS[k][0], None) for k in MODEL_KEYS} | {"rope_type": (TEXT, None), "type": (TEXT, None)}


def rope_settings(c, family, where):
    """(base, the trained rope_scaling dict or None), from v5's rope_parameters or v4's keys. The partial
    rotary factor goes into the dict, where rope.py reads it: frequencies over the rotary dims only. Both
    rope_scaling and a rope_parameters of another scaling: refused (transformers takes rope_scaling's)."""
    params = c["rope_parameters"] or {}
    own = checked(params, ROPE_KEYS, f"{where}: rope_parameters")
    base = next(b for b in (own["rope_theta"], c["rotary_emb_base"], c["rope_theta"]) if b is not None)
    default = 0.25 if family == "gpt_neox" else 1.0  # transformers' defaults
    partial = next(p for p in (own["partial_rotary_factor"], c["partial_rotary_factor"], c["rotary_pct"], default)
                   if p is not None)
    scaling = {k: v for k, v in params.items() if k not in MODEL_KEYS}
    if legacy := c["rope_scaling"]:
        checked(legacy, ROPE_KEYS, f"{where}: rope_scaling")  # the rest of the dict: rope_options.check_scaling
        if scaling_type(scaling) != "default" and same_scaling(scaling) != same_scaling(legacy):
            refuse(where, f"rope_scaling {legacy} and rope_parameters {params} name two scalings: keep one")
        scaling = {k: v for k, v in legacy.items() if k not in MODEL_KEYS}
    if scaling_type(scaling) == "dynamic":  # transformers scales it from max_position_embeddings, always
        scaling.pop(ORIGINAL, None)
    if partial != 1.0:
        scaling["partial_rotary_factor"] = partial
    if set(scaling) <= {"rope_type", "type"} and scaling_type(scaling) == "default":
        return base, None
    return base, {"rope_type": scaling_type(scaling), **{k: v for k, v in scaling.items() if k != "type"}}


def same_scaling(scaling):  # a scaling dict as v5 spells it, to compare two
    return {"rope_type": scaling_type(scaling), **{k: v for k, v in scaling.items() if k not in ("type", "rope_type")}}


def refuse(where, what):
    raise UserError(f"{where}: {what}; ropelab reads {SUPPORTED}")


def family_args(c, family, where):
    """The GPTConfig fields that differ between the families."""
    if family == "gpt_neox":
        act, bias = c["hidden_act"] or "gelu", c["attention_bias"] is not False
        if act != "gelu" or not bias:
            refuse(where, f"hidden_act {act!r}, attention_bias {bias!r} (GPT-NeoX as Pythia has: gelu, biases)")
        return dict(norm="layernorm", norm_eps=c["layer_norm_eps"], biases=True, mlp="gelu",
                    parallel_residual=c["use_parallel_residual"])
    heads, act = c["num_attention_heads"], c["hidden_act"] or "silu"
    if act != "silu" or c["attention_bias"] or c["mlp_bias"]:
        refuse(where, f"hidden_act {act!r}, attention_bias {c['attention_bias']!r}, mlp_bias {c['mlp_bias']!r} "
                      "(the Llama family: silu, no biases but Qwen2's q/k/v)")
    if c["head_dim"] not in (None, c["hidden_size"] // heads):
        refuse(where, f"head_dim {c['head_dim']} is not hidden_size / num_attention_heads")
    if family == "qwen2" and c["use_sliding_window"]:
        refuse(where, "use_sliding_window (Qwen2's sliding window on some layers only)")
    window = c["sliding_window"] if family == "mistral" else None  # Mistral 7B v0.1: every layer's
    return dict(norm="rmsnorm", norm_eps=c["rms_norm_eps"], mlp="swiglu", qkv_bias=family == "qwen2",
                n_kv_head=c["num_key_value_heads"] or heads, rope_window=window)


def model_config(folder):
    """(family, GPTConfig) of a model folder; another architecture or a missing key is a UserError."""
    path = Path(folder) / "config.json"
    return config_of(read_json(path, "JSON"), path)


def config_of(cfg, where):
    """(family, GPTConfig) of a config.json's contents, its values checked against CONFIG_KEYS (where: what
    it came from, for the errors)."""
    family = cfg.get("model_type") if isinstance(cfg, dict) else None
    if family not in FAMILIES:
        refuse(where, f"model_type {family!r} is not one ropelab reads")
    c = checked(cfg, CONFIG_KEYS, where)
    base, scaling = rope_settings(c, family, where)
    args = dict(vocab_size=c["vocab_size"], n_layer=c["num_hidden_layers"], n_head=c["num_attention_heads"],
                n_embd=c["hidden_size"], block_size=c["max_position_embeddings"], pos_emb="rope",
                rope_layout="half", rope_base=float(base), rope_scaling=scaling, mlp_hidden=c["intermediate_size"],
                tie_embeddings=c["tie_word_embeddings"], **family_args(c, family, where))
    try:
        return family, gpt_config(args)
    except UserError as e:
        refuse(where, str(e))


# ----------------------------------------------------------------------------- safetensors -> state dict

def index_files(index, folder):
    """The files model.safetensors.index.json's weight_map names, each inside the folder."""
    weight_map = checked(read_json(index, "a safetensors index"), {"weight_map": (DICT, REQUIRED)}, index)["weight_map"]
    inside = Path(folder).resolve()
    for name in weight_map.values():
        if not isinstance(name, str) or not (inside / name).resolve().is_relative_to(inside):
            raise UserError(f"{index}: weight_map names {name!r}, not a file inside {folder}")
    return sorted(set(weight_map.values()))


def read_weights(folder):
    """Every tensor of the folder's safetensors files (sharded: those model.safetensors.index.json names),
    each from one file: a name two files hold is refused, not taken from either."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    files = index_files(index, folder) if index.is_file() else [p.name for p in sorted(folder.glob("*.safetensors"))]
    if not files:
        raise UserError(f"{folder} has no *.safetensors weights (pytorch_model.bin is not read: download the "
                        "model's safetensors files, or convert it)")
    tensors, source = {}, {}
    for name in files:
        try:
            shard = load_file(folder / name)
        except FileNotFoundError:
            why = f"named in {index.name}" if index.is_file() else "a link to no file"
            raise UserError(f"{folder / name} is missing ({why})") from None
        except (SafetensorError, OSError, ValueError) as e:
            raise UserError(f"{folder / name} is damaged: not a safetensors file ({str(e)[:80]})") from None
        if twice := sorted(shard.keys() & tensors.keys()):
            raise UserError(f"{folder}: {twice[0]} is in both {source[twice[0]]} and {name}: one file per tensor "
                            "(a sharded model lists its files in model.safetensors.index.json)")
        tensors.update(shard)
        source.update(dict.fromkeys(shard, name))
    return tensors


class Weights:
    """The folder's tensors, each taken (and let go) by name with the shape the config implies, in its own
    dtype, checked like data: floating point, every value finite. What is missing, of another shape or left
    over is a UserError: the weights do not match config.json."""

    def __init__(self, tensors, folder):
        self.tensors, self.folder = tensors, folder
        self.wrong = f"{folder}: the weights do not match its config"

    def __call__(self, name, *shape):
        if name not in self.tensors:
            raise UserError(f"{self.wrong}: no tensor {name!r}")
        t = self.tensors.pop(name)  # the state dict holds it, or a copy: the folder's is let go
        if tuple(t.shape) != shape:
            raise UserError(f"{self.wrong}: {name} is {tuple(t.shape)}, the config makes it {shape}")
        if not t.is_floating_point():
            raise UserError(f"{self.folder}: {name} holds {t.dtype} values, not floating-point weights")
        if not torch.isfinite(t).all():
            raise UserError(f"{self.folder}: {name} holds {(~torch.isfinite(t)).sum().item():,} NaN or infinite "
                            "values: the weights are damaged")
        return t

    def check_all_taken(self):
        if left := sorted(k for k in self.tensors if not k.endswith(IGNORED)):
            raise UserError(f"{self.wrong}: {len(left)} tensors it has no place for ({left[0]}, ...)")


def rotary_order(head_dim, scaling):
    """Channel order [head_dim] taking a Hugging Face q/k head to rope.py's half layout. HF rotates the first
    r rotary dims, pairs (i, i + r/2); rope.py pairs (i, i + head_dim/2) for i < r/2 and leaves the rest.
    Applied to q and k alike, a permutation leaves q . k unchanged; with r = head_dim it is the identity."""
    r = int(head_dim * (scaling or {}).get("partial_rotary_factor", 1.0))
    rest = (head_dim - r) // 2
    return torch.cat((torch.arange(0, r // 2), torch.arange(r, r + rest), torch.arange(r // 2, r),
                      torch.arange(r + rest, head_dim)))


def heads(t, n_head, order):
    """The rows of a projection [n_head * head_dim, ...] with each head's channels in `order`."""
    return t.view(n_head, len(order), *t.shape[1:])[:, order].reshape(t.shape)


def neox_layer(w, p, c, order):
    """One GPT-NeoX layer. query_key_value's rows are grouped (head, [q, k, v], head_dim): made [q; k; v]."""
    C, H, hd, inner = c.n_embd, c.n_head, c.head_dim, c.mlp_hidden

    def qkv(t):  # [3C, ...] -> [3C, ...]
        q, k, v = (x.reshape(C, *t.shape[1:]) for x in t.view(H, 3, hd, *t.shape[1:]).unbind(1))
        return torch.cat([heads(q, H, order), heads(k, H, order), v])
    a, m = p + "attention.", p + "mlp."
    return {"ln_1.weight": w(p + "input_layernorm.weight", C), "ln_1.bias": w(p + "input_layernorm.bias", C),
            "ln_2.weight": w(p + "post_attention_layernorm.weight", C),
            "ln_2.bias": w(p + "post_attention_layernorm.bias", C),
            "attn.c_attn.weight": qkv(w(a + "query_key_value.weight", 3 * C, C)),
            "attn.c_attn.bias": qkv(w(a + "query_key_value.bias", 3 * C)),
            "attn.c_proj.weight": w(a + "dense.weight", C, C), "attn.c_proj.bias": w(a + "dense.bias", C),
            "mlp.c_fc.weight": w(m + "dense_h_to_4h.weight", inner, C),
            "mlp.c_fc.bias": w(m + "dense_h_to_4h.bias", inner),
            "mlp.c_proj.weight": w(m + "dense_4h_to_h.weight", C, inner),
            "mlp.c_proj.bias": w(m + "dense_4h_to_h.bias", C)}


def llama_layer(w, p, c, order):
    """One Llama / Qwen2 / Mistral layer: q, k and v stacked into c_attn, gate and up into c_fc."""
    C, H, KV, hd, inner = c.n_embd, c.n_head, c.n_kv_head, c.head_dim, c.mlp_hidden
    a, m = p + "self_attn.", p + "mlp."

    def qkv(kind, *dims):  # "weight" with dims (C,), "bias" with none
        return torch.cat((heads(w(a + "q_proj." + kind, H * hd, *dims), H, order),
                          heads(w(a + "k_proj." + kind, KV * hd, *dims), KV, order),
                          w(a + "v_proj." + kind, KV * hd, *dims)))
    layer = {"ln_1.weight": w(p + "input_layernorm.weight", C),
             "ln_2.weight": w(p + "post_attention_layernorm.weight", C),
             "attn.c_attn.weight": qkv("weight", C), "attn.c_proj.weight": w(a + "o_proj.weight", C, H * hd),
             "mlp.c_fc.weight": torch.cat((w(m + "gate_proj.weight", inner, C),
                                           w(m + "up_proj.weight", inner, C))),
             "mlp.c_proj.weight": w(m + "down_proj.weight", C, inner)}
    if c.qkv_bias:
        layer["attn.c_attn.bias"] = qkv("bias")
    return layer


def state_dict(tensors, family, c, folder):
    """The GPT's state dict (parameter name -> tensor in the file's dtype) from the folder's tensors."""
    w, order = Weights(tensors, folder), rotary_order(c.head_dim, c.rope_scaling)
    neox = family == "gpt_neox"
    top, layer = ("gpt_neox.", neox_layer) if neox else ("model.", llama_layer)
    embedding = top + ("embed_in.weight" if neox else "embed_tokens.weight")
    sd = {"transformer.wte.weight": w(embedding, c.vocab_size, c.n_embd)}
    for i in range(c.n_layer):
        sd.update({f"transformer.h.{i}.{k}": v for k, v in layer(w, f"{top}layers.{i}.", c, order).items()})
    final = top + ("final_layer_norm." if neox else "norm.")
    sd["transformer.ln_f.weight"] = w(final + "weight", c.n_embd)
    if neox:
        sd["transformer.ln_f.bias"] = w(final + "bias", c.n_embd)
    head = "embed_out.weight" if neox else "lm_head.weight"
    if c.tie_embeddings and head in tensors:  # save_pretrained leaves a tied head out; one kept must agree
        if not torch.equal(w(head, c.vocab_size, c.n_embd), sd["transformer.wte.weight"]):
            raise UserError(f"{folder}: tie_word_embeddings is true but {head} is not the embedding: the "
                            "config and the weights disagree on the head")
    tied = c.tie_embeddings
    sd["lm_head.weight"] = sd["transformer.wte.weight"] if tied else w(head, c.vocab_size, c.n_embd)
    w.check_all_taken()
    return sd


# ----------------------------------------------------------------------------- a llama.cpp GGUF file

GGUF_ARCHITECTURES = ("llama",)  # Llama 2, SmolLM, TinyLlama as llama.cpp writes them
GGUF_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1")  # those tests/test_gguf.py writes
GGUF_CONFIG = {  # llama.cpp's metadata key (after "llama.") -> config.json's key
    "context_length": "max_position_embeddings", "block_count": "num_hidden_layers",
    "embedding_length": "hidden_size", "feed_forward_length": "intermediate_size",
    "attention.head_count": "num_attention_heads", "attention.head_count_kv": "num_key_value_heads",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps", "rope.freq_base": "rope_theta", "vocab_size": "vocab_size",
    "attention.key_length": "head_dim"}
GGUF_SCALING = {  # llama.cpp's rope.scaling.* key -> rope_scaling's
    "type": "rope_type", "factor": "factor", "original_context_length": ORIGINAL,
    "yarn_beta_fast": "beta_fast", "yarn_beta_slow": "beta_slow", "finetuned": None}
GGUF_TENSORS = {  # llama.cpp's tensor names -> Hugging Face's (blk.N. -> model.layers.N.)
    "token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head",
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}


def gguf_config(reader, where):
    """(family, GPTConfig) of a GGUF file: its llama.* metadata as the config.json it was converted from,
    then read as any config.json (config_of). No output.weight: a tied head, as llama.cpp writes one."""
    arch = reader.fields["general.architecture"].contents() if "general.architecture" in reader.fields else None
    if arch not in GGUF_ARCHITECTURES:
        raise UserError(f"{where}: general.architecture {arch!r} is not one ropelab reads from a GGUF file "
                        f"(it reads {', '.join(GGUF_ARCHITECTURES)}; other families from a Hugging Face folder)")
    meta = gguf_metadata(reader, f"{arch}.")
    if meta.get(f"{arch}.expert_count"):  # Mixtral's GGUF is "llama" too
        raise UserError(f"{where}: expert_count {meta[f'{arch}.expert_count']!r}: a mixture of experts, which "
                        "ropelab does not read")
    cfg = {"model_type": arch, **{hf: meta[f"{arch}.{k}"] for k, hf in GGUF_CONFIG.items() if f"{arch}.{k}" in meta},
           "tie_word_embeddings": all(t.name != "output.weight" for t in reader.tensors)}
    cfg.setdefault("vocab_size", len(reader.fields["tokenizer.ggml.tokens"].data)
                   if "tokenizer.ggml.tokens" in reader.fields else None)
    scaling = {k.removeprefix(f"{arch}.rope.scaling."): v for k, v in meta.items() if ".rope.scaling." in k}
    if f"{arch}.rope.scale_linear" in meta:  # the older key of a linear scaling
        scaling = {"type": "linear", "factor": meta[f"{arch}.rope.scale_linear"], **scaling}
    if unread := sorted(set(scaling) - set(GGUF_SCALING)):
        raise UserError(f"{where}: rope.scaling.{unread[0]} is not read (ropelab reads rope.scaling."
                        f"{', '.join(GGUF_SCALING)}): converting would change the model")
    if scaling.get("type", "none") != "none":
        cfg["rope_scaling"] = {GGUF_SCALING[k]: v for k, v in scaling.items() if GGUF_SCALING[k]}
    family, config = config_of(cfg, f"{where}'s metadata")
    rotary = meta.get(f"{arch}.rope.dimension_count", config.n_embd // config.n_head)
    if rotary != config.n_embd // config.n_head:  # llama.cpp's partial rotary; Llama has none
        raise UserError(f"{where}: rope.dimension_count {rotary!r} is not the head dimension "
                        f"{config.n_embd // config.n_head}: ropelab reads a Llama GGUF whose whole head rotates")
    return family, config


def gguf_weights(reader, config, where):
    """(the file's tensors dequantized to float32 under Hugging Face's names, what the run records of the
    file). llama.cpp stores q and k of each head in the interleaved rotary layout (pairs 2i, 2i + 1; its
    converter permuted them): put back in Hugging Face's (pairs i, i + head_dim / 2)."""
    from gguf import quants
    types = Counter(t.tensor_type.name for t in reader.tensors)
    for t in reader.tensors:
        if t.tensor_type.name not in GGUF_TYPES:
            raise UserError(f"{where}: tensor {t.name} is {t.tensor_type.name}; ropelab dequantizes "
                            f"{', '.join(GGUF_TYPES)}")
    if "rope_freqs.weight" in (t.name for t in reader.tensors):
        raise UserError(f"{where}: rope_freqs.weight (llama.cpp's rope frequencies, Llama 3.1's scaling) is "
                        "not read: convert the model's Hugging Face folder instead")
    hd = config.n_embd // config.n_head
    interleaved = torch.cat((torch.arange(0, hd, 2), torch.arange(1, hd, 2)))
    heads_of = {"attn_q": config.n_head, "attn_k": config.n_kv_head or config.n_head}
    tensors = {}
    for t in reader.tensors:
        block, _, rest = t.name.partition(".")  # blk.3.attn_q.weight, token_embd.weight
        layer, kind = rest.split(".", 1) if block == "blk" else ("", t.name)
        stem, _, suffix = kind.rpartition(".")
        w = np.array(quants.dequantize(t.data, t.tensor_type), dtype=np.float32)  # a copy: not the mapped file
        w = torch.from_numpy(w).reshape([int(d) for d in reversed(t.shape)])  # GGUF lists dims innermost first
        if stem in heads_of and w.shape[0] == heads_of[stem] * hd:  # another shape: Weights names it
            w = heads(w, heads_of[stem], interleaved)
        hf = GGUF_TENSORS.get(stem)
        name = t.name if hf is None else f"model.layers.{layer}.{hf}.{suffix}" if layer else f"{hf}.{suffix}"
        tensors[name] = w
    path = Path(where)
    with open(path, "rb") as f:
        sha = hashlib.file_digest(f, "sha256")
    record = {"file": str(path.resolve()), "bytes": path.stat().st_size, "sha256": sha.hexdigest(),
              "types": dict(sorted(types.items())), "name": gguf_metadata(reader, "general.name").get("general.name")}
    return tensors, record


# ----------------------------------------------------------------------------- the folder as a run folder

def converted_model(ckpt):  # runtime.model_from_checkpoint's, for a checkpoint this module wrote
    with torch.device("meta"):  # no random init of weights about to be replaced (billions of draws at 7B)
        model = GPT(checkpoint_config(ckpt))
    # in float32 as a trained run's, each file tensor let go as its copy replaces it
    weights = ckpt["model"]
    for name in weights:
        weights[name] = weights[name].float()
    model.load_state_dict(weights, assign=True)
    if model.config.tie_embeddings:  # assign gave the embedding and the head a Parameter each: one again
        model.transformer.wte.weight = model.lm_head.weight
    return model


def converted_text(ckpt, run_dir):  # runtime.load_run's: (how to prepare its text, its tokenizer)
    record = ckpt["pretrained"]
    fix = (f"python data/text/prepare.py SOURCE --name NAME --tokenizer {record['folder']}, then "
           f"python pretrained.py {record['folder']} --out NEW_RUN --dataset NAME")
    if ckpt["config"]["dataset"] is None:
        raise UserError(f"{run_dir} was converted with no held-out text: {fix}")
    return fix, record["tokenizer"]


def held_out_text(dataset, tokenizer, folder):
    """dataset as a run records it (a name under data/, else an absolute path), checked to be prepared with
    the model's tokenizer; None: no held-out text yet."""
    if dataset is None:
        return None
    if not data_dir(dataset).is_dir() and Path(dataset).is_dir():  # a folder named from here
        dataset = str(Path(dataset).resolve())
    check_tokenizer(data_dir(dataset), tokenizer.identity, f"--dataset {dataset}", folder, "prepare it with the "
                    f"model's: python data/text/prepare.py SOURCE --name NAME --tokenizer {folder}")
    return dataset


def check_vocabulary(tokenizer, config, where):
    """Every id the tokenizer gives (its end-of-text id is one of them) has a row in the embedding."""
    largest = max(tokenizer.tok.get_vocab(with_added_tokens=True).values())
    if largest >= config.vocab_size:
        raise UserError(f"{where}: the tokenizer's ids reach {largest:,}, past vocab_size {config.vocab_size:,}: "
                        "the embedding has no row for them")


def run_of(source, name, dataset=None):
    """A model folder or GGUF file as the checkpoint dict train.py writes, with a 'pretrained' record: what it
    came from (folder: the folder or file; a GGUF file's size, sha256 and quantization types under 'gguf') and
    its tokenizer (its identity, its tokenizer.json and end-of-text id, for sample.py)."""
    source = Path(source)
    reader = read_gguf(source) if source.suffix == ".gguf" and source.is_file() else None
    family, config = gguf_config(reader, source) if reader else model_config(source)
    tokenizer = gguf_tokenizer(reader, source) if reader else folder_tokenizer(source)
    check_vocabulary(tokenizer, config, source)
    dataset = held_out_text(dataset, tokenizer, source)
    tensors, gguf = gguf_weights(reader, config, source) if reader else (read_weights(source), None)
    weights = state_dict(tensors, family, config, source)
    record = {"family": family, "folder": str(source.resolve()), "tokenizer": tokenizer.identity,
              "tokenizer_json": tokenizer.text, "eot_token": tokenizer.eot_token}
    return {"model": weights, "model_args": asdict(config), "iter_num": 0,
            "config": {"dataset": dataset, "wandb_run_name": name, "wandb_log": False},
            "pretrained": {**record, **({"gguf": gguf} if gguf else {})}}


def save(state, path):
    """torch.save(state) into path atomically, straight into the file (a 7B model is not held twice)."""
    try:
        write_atomic(path, lambda f: torch.save(state, f))
    except (OSError, RuntimeError) as e:  # a full disk, say; torch's zip writer reports it as a RuntimeError
        if isinstance(e, RuntimeError) and "inline_container" not in str(e):
            raise  # a bug
        why = e.strerror if isinstance(e, OSError) and e.strerror else f"the write failed: {str(e)[:60]}"
        raise OSError(f"cannot write {path} ({why}): free some space, or give another --out") from None


def convert(source, out, dataset=None):
    """source (a model folder or GGUF file) converted into the run folder out (out/ckpt.pt), once: a run
    already there is refused, and so is a folder the checkpoint cannot be written into, before the work."""
    if not str(out).strip():
        raise UserError(f"--out {str(out)!r} is blank: name the run folder to write")
    for option, name in (("MODEL_DIR", source), ("--out", out)):
        try:
            str(name).encode()  # a name the file system gave back undecoded (surrogates) has no UTF-8
        except UnicodeEncodeError:
            raise UserError(f"{option} {str(name)!r} is not a UTF-8 name (safetensors, JSON and the run's record "
                            "need one): rename it") from None
    out = Path(out)
    claim_run(out, "pretrained", "one writer per run folder", "--out")
    try:
        if held := run_files(out):
            raise UserError(f"{out} already holds a run ({', '.join(held)}): give another --out")
        if inputs := sorted(p.name for p in out.iterdir() if p.name in ("config.json", "meta.json")
                            or p.suffix in (".safetensors", ".gguf", ".bin")):
            raise UserError(f"{out} is a model or data folder (it holds {inputs[0]}): give --out a folder of its own")
        try:  # a read-only or immutable folder (root ignores a folder's mode, not those)
            tempfile.TemporaryFile(dir=out).close()
        except OSError as e:
            raise UserError(f"output folder {out} cannot be written ({e.strerror or e}): give another --out") from None
        run = run_of(source, out.name, dataset)
        save(run, out / "ckpt.pt")
    finally:
        release_outputs(out)  # a folder made for a conversion that failed goes with it
    print(f"{source} -> {out / 'ckpt.pt'}, reading {run['config']['dataset'] or 'no held-out text yet'}")
    return out


def main(argv):
    p = command_parser(__doc__, "out")
    p.add_argument("model_dir", help="a Hugging Face model folder (config.json, *.safetensors, tokenizer.json) "
                   "or a llama.cpp .gguf file")
    p.add_argument("--dataset", default=None, help="the held-out text its commands read, prepared with its "
                   "tokenizer (data/text/prepare.py --tokenizer MODEL_DIR): its name or folder")
    a = p.parse_args(argv)
    convert(a.model_dir, a.out, a.dataset)


if __name__ == "__main__":
    run_cli("pretrained.py", main, sys.argv[1:])
