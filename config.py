"""The boundary: a run's config (the defaults, config files of plain assignments, --key=value), its model
and a rope_scaling dict, each checked once here, where they come in; model.py and rope.py trust them."""
import ast
import math
import numbers
from dataclasses import fields
from pathlib import Path
from types import ModuleType

from common import UserError
from model import MLPS, NORMS, POS_EMBS, GPTConfig
from positions import MIN_BLOCK_SIZE
from rope import LAYOUTS

# vocab_size comes from the data, train_len from the checkpoint a run fine-tunes: neither is a config key
MODEL_KEYS = tuple(f.name for f in fields(GPTConfig) if f.name not in ("vocab_size", "train_len"))


def at_least(low):
    return lambda v: None if v >= low else f"must be >= {low}"


def one_of(*allowed):
    return lambda v: None if v in allowed else f"is not one of: {', '.join(allowed)}"


def below_one(key):  # AdamW's betas: a decay rate of 1 or more never forgets
    return lambda v: None if v < 1 else f"is one of AdamW's betas: use 0 <= {key} < 1"


MODEL_HELP = dict(
    block_size="the training length (and a learned position table's size)", n_layer="layers",
    n_head="attention heads", n_embd="the residual width", dropout="dropout probability",
    pos_emb="learned, sinusoidal, rope, alibi or none (NoPE)", rope_base="RoPE's base (theta)",
    rope_layout="half (GPT-NeoX, HF Llama) or interleaved (GPT-J, Meta Llama) pairs",
    rope_scaling="a Hugging Face rope_scaling dict to train with, e.g. {'rope_type': 'yarn', 'factor': 4.0}",
    rope_fraction="p-RoPE: the share of pairs that rotate (None: all)",
    nope_every="iRoPE / RNoPE-SWA: every k-th layer (from 1) attends globally without positions",
    rope_window="RNoPE-SWA: the RoPE layers attend to their last rope_window positions",
    ssmax="Scalable-Softmax (Nakanishi 2025): logits times s_h * log(keys seen), s_h learned",
    norm="layernorm or rmsnorm (Llama)", norm_eps="the norms' epsilon", biases="biases everywhere (GPT-NeoX)",
    qkv_bias="biases on q, k and v only (Qwen2)", mlp="gelu or swiglu (Llama)",
    mlp_hidden="the MLP's hidden width (None: 4 * n_embd)", n_kv_head="grouped-query key and value heads",
    parallel_residual="GPT-NeoX: x + attn(ln_1(x)) + mlp(ln_2(x))",
    tie_embeddings="the output layer is the token embedding (GPT-2, small Llamas)")

# every config key: (default, help, check); a check returns what is wrong with a value, or None. Numbers must
# also be finite and >= 0; the type is the default's (None: any; a model key's is checked by gpt_config)
KEYS = dict(
    out_dir=("out/default", "the run's folder (ckpt.pt, log.jsonl); its name is the wandb run's",
             lambda v: None if v.strip() else "is empty: name the run's folder, e.g. out/my_run"),
    init_from=("scratch", "scratch, resume (out_dir/ckpt.pt), or a run folder / ckpt.pt to fine-tune"),
    overwrite=(False, "True: a new run replaces the one in out_dir (else that is an error)"),
    eval_interval=(250, "iterations between evaluations (and checkpoints)", at_least(1)),
    eval_iters=(20, "batches per evaluation", at_least(1)),
    log_interval=(25, "iterations between progress lines", at_least(1)),
    keep_iters=((), "iterations whose checkpoint is also kept, in out_dir/iter_<n>/",
                lambda v: None if all(type(n) is int and n >= 0 for n in v) else
                "should be iterations: integers >= 0, as (0, 100, 400)"),
    wandb_log=(True, "log to wandb (offline if no login)"), wandb_project=("ropelab", "the wandb project"),
    wandb_run_name=("", "the wandb run's name (default: out_dir's)"), wandb_group=("", "the wandb group"),
    dataset=("shakespeare", "data/<dataset>/ (data/*/prepare.py writes it), or such a folder's full path"),
    batch_size=(16, "rows per micro step, per process", at_least(1)),
    gradient_accumulation_steps=(1, "micro steps per iteration, per process", at_least(1)),
    retrieval_mix=(0.0, "the share of each batch's rows that are retrieval rows (data/synthetic.py)",
                   lambda v: None if v <= 1 else "is a fraction of each batch: use 0..1"),
    retrieval_segment=(32, "the retrieval rows' segment length", at_least(1)),
    retrieval_vocab=(0, "the ids retrieval rows draw from (0: all)"),
    retrieval_task=("copy", "copy, or mqar (retrieval_segment // 2 key-value pairs)", one_of("copy", "mqar")),
    **{f.name: (f.default, MODEL_HELP[f.name]) for f in fields(GPTConfig) if f.name in MODEL_KEYS},
    learning_rate=(2e-3, "AdamW's peak learning rate"),
    max_iters=(1500, "training iterations", at_least(1)), weight_decay=(0.1, "AdamW's weight decay"),
    beta1=(0.9, "AdamW's beta1", below_one("beta1")), beta2=(0.95, "AdamW's beta2", below_one("beta2")),
    grad_clip=(1.0, "the gradient norm's clip (0: none)"), warmup_iters=(100, "linear warmup iterations"),
    lr_decay_iters=(0, "where the cosine decay to min_lr ends (0: max_iters)"),
    min_lr=(2e-4, "the learning rate the decay ends at"),
    device=("auto", "auto (cuda, then mps, then cpu), cpu, cuda, cuda:N or mps"),
    dtype=("auto", "auto (bfloat16 on CUDA if supported, else float32), float32, bfloat16 or float16",
           one_of("auto", "float32", "bfloat16", "float16")),
    compile=(False, "torch.compile the model"),
    seed=(1337, "the data order and the initial weights; process k of a DDP run uses seed + k"),
)
DEFAULTS = {key: entry[0] for key, entry in KEYS.items()}
FINETUNE_KEYS = ("block_size", "rope_scaling", "dropout")  # the model keys a fine-tune may change
DROPE_KEYS = ("pos_emb", "rope_base", "rope_layout", "rope_fraction")  # and from rope to none: the rotation's


def set_key(config, key, value, source):
    if key not in KEYS:
        raise UserError(f"unknown config key {key!r} (from {source}); the keys are "
                        "DEFAULTS in config.py and GPTConfig's fields in model.py")
    default, _, *check = KEYS[key]
    numeric = type(default) in (int, float)
    if not (default is None or type(value) is type(default) or (type(default) is float and type(value) is int)
            or (type(default) is tuple and type(value) is list)):
        wrong = f"should be a {type(default).__name__}"
    elif numeric and not math.isfinite(value):  # inf passes `>= 0`, then trains to NaN
        wrong = "is not a finite number"
    else:
        wrong = (check[0](value) if check else None) or (numeric and value < 0 and "must be >= 0")
    if wrong:
        raise UserError(f"{key}={value!r} (from {source}) {wrong}")
    config[key] = float(value) if type(default) is float else value
    if key == "keep_iters":
        config[key] = tuple(sorted(set(value)))


def load_config(argv):
    c = dict(DEFAULTS)
    for arg in argv:
        if arg.startswith("--"):
            key, eq, text = arg[2:].partition("=")
            if not eq:
                raise UserError(f"expected --key=value, got {arg!r}")
            try:
                value = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                value = text  # a bare string such as --device=cpu
            set_key(c, key, value, arg)
            continue
        if Path(arg).is_dir():
            raise UserError(f"config file {arg} is a folder; give one of its .py files (see configs/)")
        if not Path(arg).is_file():
            raise FileNotFoundError(f"config file {arg} not found (see configs/)")
        try:
            exec(compile(Path(arg).read_text(), arg, "exec"), namespace := {})
        except Exception as e:  # whatever a config file raises, it is that file's error
            raise UserError(f"config file {arg} failed: {type(e).__name__}: {e}") from None
        for key, value in namespace.items():
            if not key.startswith("_") and not isinstance(value, ModuleType):  # `import math` is no key
                set_key(c, key, value, arg)
    c["wandb_run_name"] = c["wandb_run_name"] or Path(c["out_dir"]).name
    if c["lr_decay_iters"] and c["lr_decay_iters"] <= c["warmup_iters"]:  # the rate would drop to min_lr
        raise UserError(f"lr_decay_iters={c['lr_decay_iters']} ends the decay before warmup_iters="
                        f"{c['warmup_iters']} ends the warmup: use lr_decay_iters > {c['warmup_iters']}, "
                        "or a shorter warmup")
    c["lr_decay_iters"] = c["lr_decay_iters"] or c["max_iters"]  # a short run still decays to min_lr
    if c["overwrite"] and c["init_from"] == "resume":
        raise UserError("overwrite=True replaces the run in out_dir, init_from='resume' continues it: "
                        "give one of them")
    if late := [n for n in c["keep_iters"] if n > c["max_iters"]]:
        raise UserError(f"keep_iters {late} come after max_iters={c['max_iters']}: keep iterations up to "
                        "max_iters")
    model_config(c, vocab_size=1)  # bad model keys fail now, not after the data is prepared
    if c["min_lr"] > c["learning_rate"]:  # the cosine "decay" would climb
        raise UserError(f"min_lr={c['min_lr']:g} is above learning_rate={c['learning_rate']:g}: the schedule "
                        "decays from learning_rate to min_lr; use min_lr <= learning_rate")
    if c["block_size"] < MIN_BLOCK_SIZE:  # trained, but then not evaluated by the default methods
        raise UserError(f"block_size={c['block_size']} is too short to evaluate (sinks): use block_size "
                        f">= {MIN_BLOCK_SIZE}")
    if c["retrieval_mix"] and 2 * c["retrieval_segment"] > c["block_size"] + 1:
        raise UserError(f"retrieval_segment={c['retrieval_segment']} does not fit twice in block_size="
                        f"{c['block_size']}; use retrieval_segment <= {(c['block_size'] + 1) // 2}")
    return c


def key_help():  # train.py --help
    return "\n".join(f"  --{key}={entry[0]!r}  {entry[1]}" for key, entry in KEYS.items())


def model_config(config, vocab_size, train_len=None):
    return gpt_config(dict(vocab_size=vocab_size, train_len=train_len, **{k: config[k] for k in MODEL_KEYS}))


def gpt_config(args):
    """GPTConfig(**args) (a config's, a checkpoint's model_args), checked: a bad key is a UserError."""
    c = GPTConfig(**args)
    if small := [f"{k}={getattr(c, k)!r}" for k in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd")
                 if getattr(c, k) < 1]:
        raise UserError(f"{', '.join(small)}: model sizes must be >= 1")
    if not 0 <= c.dropout < 1:
        raise UserError(f"dropout={c.dropout!r} is not allowed; use 0 <= dropout < 1")
    if not c.rope_base > 1:
        raise UserError(f"rope_base={c.rope_base!r} is not allowed; use a base > 1")
    for key, allowed in (("pos_emb", POS_EMBS), ("rope_layout", LAYOUTS), ("norm", NORMS), ("mlp", MLPS)):
        if getattr(c, key) not in allowed:
            raise UserError(f"unknown {key} {getattr(c, key)!r}; allowed: {', '.join(allowed)}")
    if c.n_embd % c.n_head:
        raise UserError(f"n_embd={c.n_embd} is not divisible by n_head={c.n_head}")
    if not (is_number(c.norm_eps) and c.norm_eps > 0):
        raise UserError(f"norm_eps must be a number > 0, got {c.norm_eps!r}")
    if c.mlp_hidden is not None and (type(c.mlp_hidden) is not int or c.mlp_hidden < 1):
        raise UserError(f"mlp_hidden must be an integer >= 1 (or None: 4 * n_embd), got {c.mlp_hidden!r}")
    if (kv := c.n_kv_head) is not None and (type(kv) is not int or kv < 1 or c.n_head % kv):
        raise UserError(f"n_kv_head must divide n_head={c.n_head} (or be None: n_head), got {kv!r}")
    if c.pos_emb == "rope" and c.head_dim % 2:
        raise UserError(f"RoPE needs an even head dimension, got n_embd/n_head = {c.head_dim}")
    if any(getattr(c, k) is not None for k in ("rope_scaling", "rope_fraction", "nope_every", "rope_window")):
        from rope_options import check_rope_options  # settings off by default: checked there
        check_rope_options(c)
    return c


def is_number(x):
    # True is an int to Python, NaN slips past `x < 1` checks, inf leaves no frequency: none is a setting
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)
