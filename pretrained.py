"""Convert a Hugging Face model folder (config.json, *.safetensors, tokenizer.json) once into a ropelab run
folder: config.json as a GPTConfig, the weights as a state dict of this repository's GPT (in the file's own
dtype) and the tokenizer, in one ckpt.pt that every command reads as a run, so that every method applies to it
as to a trained run. Families: GPT-NeoX (Pythia), Llama, Qwen2, Mistral. Configs of transformers 4.x
(rope_theta, rope_scaling, rotary_pct) and 5.x (rope_parameters) alike; a model's own rope scaling (Llama
3's) is part of its trained state.

    python pretrained.py MODEL_DIR --out out/pythia-160m [--dataset NAME]
"""
import json
import sys
from dataclasses import asdict
from pathlib import Path

import torch

from common import UserError, command_parser, data_dir, release_outputs, run_cli, write_atomic
from config import gpt_config
from data.dataset import check_tokenizer
from data.tokenizer import folder_tokenizer
from rope import ORIGINAL, scaling_type
from runfolder import claim_run, run_files

FAMILIES = ("gpt_neox", "llama", "qwen2", "mistral")
SUPPORTED = "GPT-NeoX (Pythia), Llama, Qwen2 and Mistral in the Hugging Face layout"
IGNORED = ("rotary_emb.inv_freq", "attention.bias", "attention.masked_bias")  # buffers older files hold


def read_json(path, what):
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise UserError(f"{path} is missing: a model folder holds config.json, *.safetensors and "
                        "tokenizer.json") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise UserError(f"{path} is damaged: not {what} ({type(e).__name__}: {str(e)[:60]})") from None


# ----------------------------------------------------------------------------- config.json -> GPTConfig

def rope_settings(cfg, family):
    """(base, the trained rope_scaling dict or None), from v5's rope_parameters or v4's keys. The partial
    rotary factor goes into the dict, where rope.py reads it: frequencies over the rotary dims only."""
    params = dict(cfg.get("rope_parameters") or {})
    base = params.pop("rope_theta", cfg.get("rope_theta", cfg.get("rotary_emb_base", 10000.0)))
    default = 0.25 if family == "gpt_neox" else 1.0  # transformers' defaults
    partial = cfg.get("partial_rotary_factor", cfg.get("rotary_pct", default))
    partial = params.pop("partial_rotary_factor", partial)
    scaling = {**(cfg.get("rope_scaling") or {}), **params}
    if scaling_type(scaling) == "dynamic":  # transformers scales it from max_position_embeddings, always
        scaling.pop(ORIGINAL, None)
    if partial != 1.0:
        scaling["partial_rotary_factor"] = partial
    if set(scaling) <= {"rope_type", "type"} and scaling_type(scaling) == "default":
        return base, None
    return base, {"rope_type": scaling_type(scaling), **{k: v for k, v in scaling.items() if k != "type"}}


def refuse(folder, what):
    raise UserError(f"{folder}/config.json: {what}; ropelab reads {SUPPORTED}")


def family_args(cfg, family, folder):
    """The GPTConfig fields that differ between the families."""
    get = cfg.get
    if family == "gpt_neox":
        if get("hidden_act", "gelu") != "gelu" or not get("attention_bias", True):
            refuse(folder, f"hidden_act {get('hidden_act')!r}, attention_bias {get('attention_bias')!r} "
                           "(GPT-NeoX as Pythia has: gelu, biases)")
        return dict(norm="layernorm", norm_eps=get("layer_norm_eps", 1e-5), biases=True, mlp="gelu",
                    parallel_residual=get("use_parallel_residual", True))
    heads = cfg["num_attention_heads"]
    if get("hidden_act", "silu") != "silu" or get("attention_bias") or get("mlp_bias"):
        refuse(folder, f"hidden_act {get('hidden_act')!r}, attention_bias {get('attention_bias')!r}, "
                       f"mlp_bias {get('mlp_bias')!r} (the Llama family: silu, no biases but Qwen2's q/k/v)")
    if get("head_dim") not in (None, cfg["hidden_size"] // heads):
        refuse(folder, f"head_dim {cfg['head_dim']} is not hidden_size / num_attention_heads")
    if family == "qwen2" and get("use_sliding_window"):
        refuse(folder, "use_sliding_window (Qwen2's sliding window on some layers only)")
    window = get("sliding_window") if family == "mistral" else None  # Mistral 7B v0.1: every layer's
    return dict(norm="rmsnorm", norm_eps=get("rms_norm_eps", 1e-6), mlp="swiglu", qkv_bias=family == "qwen2",
                n_kv_head=get("num_key_value_heads") or heads, rope_window=window)


def model_config(folder):
    """(family, GPTConfig) of a model folder; another architecture or a missing key is a UserError."""
    return config_of(read_json(Path(folder) / "config.json", "JSON"), folder)


def config_of(cfg, folder):
    """(family, GPTConfig) of a config.json's contents (folder: where it came from, for the errors)."""
    family = cfg.get("model_type") if isinstance(cfg, dict) else None
    if family not in FAMILIES:
        refuse(folder, f"model_type {family!r} is not one ropelab reads")
    try:
        base, scaling = rope_settings(cfg, family)
        args = dict(vocab_size=cfg["vocab_size"], n_layer=cfg["num_hidden_layers"],
                    n_head=cfg["num_attention_heads"], n_embd=cfg["hidden_size"],
                    block_size=cfg["max_position_embeddings"], pos_emb="rope", rope_layout="half",
                    rope_base=float(base), rope_scaling=scaling, mlp_hidden=cfg["intermediate_size"],
                    tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                    **family_args(cfg, family, folder))
    except KeyError as e:
        refuse(folder, f"no {e.args[0]!r}")
    try:
        return family, gpt_config(args)
    except UserError as e:
        refuse(folder, str(e))


# ----------------------------------------------------------------------------- safetensors -> state dict

def read_weights(folder):
    """Every tensor of the folder's safetensors files (sharded: those model.safetensors.index.json names)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(read_json(index, "a safetensors index").get("weight_map", {}).values()))
    else:
        files = [p.name for p in sorted(folder.glob("*.safetensors"))]
    if not files:
        raise UserError(f"{folder} has no *.safetensors weights (pytorch_model.bin is not read: download the "
                        "model's safetensors files, or convert it)")
    tensors = {}
    for name in files:
        try:
            tensors.update(load_file(folder / name))
        except FileNotFoundError:
            raise UserError(f"{folder / name} is missing (named in {index.name})") from None
        except (SafetensorError, OSError, ValueError) as e:
            raise UserError(f"{folder / name} is damaged: not a safetensors file ({str(e)[:80]})") from None
    return tensors


class Weights:
    """The folder's tensors, each taken (and let go) by name with the shape the config implies, in its own
    dtype. What is missing, of another shape or left over is a UserError: the weights do not match
    config.json."""

    def __init__(self, tensors, folder):
        self.tensors, self.wrong = tensors, f"{folder}: the weights do not match config.json"

    def __call__(self, name, *shape):
        if name not in self.tensors:
            raise UserError(f"{self.wrong}: no tensor {name!r}")
        t = self.tensors.pop(name)  # the state dict holds it, or a copy: the folder's is let go
        if tuple(t.shape) != shape:
            raise UserError(f"{self.wrong}: {name} is {tuple(t.shape)}, the config makes it {shape}")
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
    C, H, hd, inner = c.n_embd, c.n_head, c.n_embd // c.n_head, c.mlp_hidden

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
    C, H, KV, hd, inner = c.n_embd, c.n_head, c.n_kv_head, c.n_embd // c.n_head, c.mlp_hidden
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
    w, order = Weights(tensors, folder), rotary_order(c.n_embd // c.n_head, c.rope_scaling)
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
    tied = c.tie_embeddings and head not in tensors  # save_pretrained leaves a tied head out
    sd["lm_head.weight"] = sd["transformer.wte.weight"] if tied else w(head, c.vocab_size, c.n_embd)
    w.check_all_taken()
    return sd


# ----------------------------------------------------------------------------- the folder as a run folder

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


def run_of(folder, name, dataset=None):
    """A model folder as the checkpoint dict train.py writes, with a 'pretrained' record: the folder it came
    from and its tokenizer (its identity, its tokenizer.json and end-of-text id, for sample.py)."""
    folder = Path(folder)
    family, config = model_config(folder)
    tokenizer = folder_tokenizer(folder)
    dataset = held_out_text(dataset, tokenizer, folder)
    weights = state_dict(read_weights(folder), family, config, folder)
    return {"model": weights, "model_args": asdict(config), "iter_num": 0,
            "config": {"dataset": dataset, "wandb_run_name": name, "wandb_log": False},
            "pretrained": {"family": family, "folder": str(folder.resolve()), "tokenizer": tokenizer.identity,
                           "tokenizer_json": tokenizer.text, "eot_token": tokenizer.eot_token}}


def save(state, path):
    """torch.save(state) into path atomically, straight into the file (a 7B model is not held twice)."""
    try:
        write_atomic(path, lambda f: torch.save(state, f))
    except OSError as e:  # a full disk, say: the error names the file
        raise OSError(f"cannot write {path} ({e.strerror or e}): free some space, or give another --out") from None


def convert(folder, out, dataset=None):
    """folder converted into the run folder out (out/ckpt.pt), once: a run already there is refused."""
    out = Path(out)
    claim_run(out, "pretrained", "one writer per run folder", "--out")
    try:
        if held := run_files(out):
            raise UserError(f"{out} already holds a run ({', '.join(held)}): give another --out")
        run = run_of(folder, out.name, dataset)
        save(run, out / "ckpt.pt")
    finally:
        release_outputs(out)  # a folder made for a conversion that failed goes with it
    print(f"{folder} -> {out / 'ckpt.pt'}, reading {run['config']['dataset'] or 'no held-out text yet'}")
    return out


def main(argv):
    p = command_parser(__doc__, "out")
    p.add_argument("model_dir", help="a Hugging Face model folder: config.json, *.safetensors, tokenizer.json")
    p.add_argument("--dataset", default=None, help="the held-out text its commands read, prepared with its "
                   "tokenizer (data/text/prepare.py --tokenizer MODEL_DIR): its name or folder")
    a = p.parse_args(argv)
    convert(a.model_dir, a.out, a.dataset)


if __name__ == "__main__":
    run_cli("pretrained.py", main, sys.argv[1:])
