"""The boundary: a run's config (the defaults, then config files of plain assignments and --key=value), its model keys and
a rope_scaling dict, each checked once here, where they come in; model.py and rope.py trust what passes."""
import ast
import math
import numbers
from dataclasses import fields
from pathlib import Path
from types import ModuleType

from common import MAX_FACTOR, UserError
from model import MLPS, NORMS, POS_EMBS, GPTConfig
from positions import MIN_BLOCK_SIZE
from rope import COMMON_KEYS, LAYOUTS, ORIGINAL, ROPE_TYPES, complete_scaling, scaling_type

# vocab_size comes from the data, train_len from the checkpoint a run fine-tunes (train.py): neither is a config key
MODEL_KEYS = tuple(f.name for f in fields(GPTConfig) if f.name not in ("vocab_size", "train_len"))

DEFAULTS = dict(
    out_dir="out/default",
    init_from="scratch",  # 'scratch', 'resume' (from out_dir/ckpt.pt), or a run folder / ckpt.pt to fine-tune
    overwrite=False,  # True: a new run replaces the one in out_dir (else that is an error)
    eval_interval=250, eval_iters=20, log_interval=25,  # iterations between evaluations (and checkpoints); batches per one
    keep_iters=(),  # iterations whose checkpoint is also kept, in out_dir/iter_<n>/ (a run of its own: evaluate, resume)
    wandb_log=True, wandb_project="ropelab", wandb_run_name="", wandb_group="",  # names: out_dir's; offline if no login
    dataset="shakespeare",  # data/<dataset>/, written by data/*/prepare.py, or an absolute path to such a folder
    batch_size=16, gradient_accumulation_steps=1,  # both per process
    retrieval_mix=0.0, retrieval_segment=32, retrieval_vocab=0,  # copy rows in each batch: data/synthetic.py
    retrieval_task="copy",  # what those rows are: 'copy', or 'mqar' (retrieval_segment // 2 key-value pairs recalled)
    **{f.name: f.default for f in fields(GPTConfig) if f.name in MODEL_KEYS},  # GPTConfig's; block_size: training length
    learning_rate=2e-3, max_iters=1500, weight_decay=0.1, beta1=0.9, beta2=0.95, grad_clip=1.0,  # AdamW
    warmup_iters=100, lr_decay_iters=0, min_lr=2e-4,  # linear warmup then cosine decay to min_lr (0: by max_iters)
    device="auto", dtype="auto", compile=False,  # auto: cuda, then mps, then cpu; bfloat16 on CUDA if supported, else float32
    seed=1337,  # the data order and the initial weights; process k of a DDP run uses seed + k
)
FINETUNE_KEYS = ("block_size", "rope_scaling", "dropout")  # what a fine-tune may change; other model keys must match
DROPE_KEYS = ("pos_emb", "rope_base", "rope_layout", "rope_fraction")  # and from pos_emb rope to none (DroPE): the rotation's
CHOICES = dict(dtype=("auto", "float32", "bfloat16", "float16"), retrieval_task=("copy", "mqar"))
BELOW_ONE = ("beta1", "beta2")  # AdamW's betas: a decay rate of 1 or more never forgets
POSITIVE = ("max_iters", "batch_size", "gradient_accumulation_steps", "eval_interval", "eval_iters", "log_interval", "retrieval_segment")


# ----------------------------------------------------------------------------- config

def set_key(config, key, value, source):
    if key not in DEFAULTS:
        raise UserError(f"unknown config key {key!r} (from {source}); the keys are "
                         "DEFAULTS in config.py and GPTConfig's fields in model.py")
    default = DEFAULTS[key]
    if key == "keep_iters" and isinstance(value, (list, tuple)):
        if not all(type(n) is int and n >= 0 for n in value):
            raise UserError(f"keep_iters={value!r} (from {source}) should be iterations: integers >= 0, as (0, 100, 400)")
        value = tuple(sorted(set(value)))
    if not (default is None or type(value) is type(default) or (type(default) is float and type(value) is int)):
        raise UserError(f"{key}={value!r} (from {source}) should be a {type(default).__name__}")
    if type(default) in (int, float) and not math.isfinite(value):  # inf passes `>= 0`, then trains to NaN
        raise UserError(f"{key}={value!r} (from {source}) is not a finite number")
    if type(default) in (int, float) and not value >= (1 if key in POSITIVE else 0):  # `not >=` also catches nan
        raise UserError(f"{key}={value!r} (from {source}) must be >= {1 if key in POSITIVE else 0}")
    if key in BELOW_ONE and not value < 1:
        raise UserError(f"{key}={value!r} (from {source}) is one of AdamW's betas: use 0 <= {key} < 1")
    if key == "out_dir" and not value.strip():
        raise UserError(f"out_dir={value!r} (from {source}) is empty: name the run's folder, e.g. out/my_run")
    if key in CHOICES and value not in CHOICES[key]:
        raise UserError(f"{key}={value!r} (from {source}) is not one of: {', '.join(CHOICES[key])}")
    if key == "retrieval_mix" and value > 1:
        raise UserError(f"retrieval_mix={value!r} (from {source}) is a fraction of each batch: use 0..1")
    config[key] = float(value) if type(default) is float else value


def load_config(argv):
    config = dict(DEFAULTS)
    for arg in argv:
        if arg.startswith("--"):
            key, eq, text = arg[2:].partition("=")
            if not eq:
                raise UserError(f"expected --key=value, got {arg!r}")
            try:
                value = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                value = text  # a bare string such as --device=cpu
            set_key(config, key, value, arg)
        else:
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
                    set_key(config, key, value, arg)
    config["wandb_run_name"] = config["wandb_run_name"] or Path(config["out_dir"]).name
    check_schedule(config)
    if config["overwrite"] and config["init_from"] == "resume":
        raise UserError("overwrite=True replaces the run in out_dir, init_from='resume' continues it: "
                        "give one of them")
    if late := [n for n in config["keep_iters"] if n > config["max_iters"]]:
        raise UserError(f"keep_iters {late} come after max_iters={config['max_iters']}: keep iterations up to max_iters")
    model_config(config, vocab_size=1)  # bad model keys fail now, not after the data is prepared
    if config["min_lr"] > config["learning_rate"]:  # the cosine "decay" would climb
        raise UserError(f"min_lr={config['min_lr']:g} is above learning_rate={config['learning_rate']:g}: the schedule "
                        "decays from learning_rate to min_lr; use min_lr <= learning_rate")
    if config["rope_scaling"] is not None and config["pos_emb"] != "rope":  # it would train and be stored, doing nothing
        raise UserError(f"rope_scaling={config['rope_scaling']!r} given to pos_emb={config['pos_emb']!r}: only a RoPE model "
                        "has a rotation to scale; remove rope_scaling or use pos_emb='rope'")
    if config["block_size"] < MIN_BLOCK_SIZE:  # trained, but then not evaluated by the default methods
        raise UserError(f"block_size={config['block_size']} is too short to evaluate (sinks): use block_size >= {MIN_BLOCK_SIZE}")
    if config["retrieval_mix"] and 2 * config["retrieval_segment"] > config["block_size"] + 1:
        raise UserError(f"retrieval_segment={config['retrieval_segment']} does not fit twice in block_size="
                         f"{config['block_size']}; use retrieval_segment <= {(config['block_size'] + 1) // 2}")
    return config


def check_schedule(config):
    """The learning rate's schedule: a warmup, then a decay ending at lr_decay_iters (else at max_iters)."""
    given, warmup = config["lr_decay_iters"], config["warmup_iters"]
    if given and given <= warmup:  # the decay would end before the warmup: the rate would drop to min_lr
        raise UserError(f"lr_decay_iters={given} ends the decay before warmup_iters={warmup} ends the "
                        f"warmup: use lr_decay_iters > {warmup}, or a shorter warmup")
    config["lr_decay_iters"] = given or config["max_iters"]  # a short run still decays to min_lr


def key_help():
    """Every config key with its default, one a line (train.py --help)."""
    return "\n".join(f"  --{key}={value!r}" for key, value in DEFAULTS.items())


def model_config(config, vocab_size, train_len=None):
    return gpt_config(dict(vocab_size=vocab_size, train_len=train_len, **{k: config[k] for k in MODEL_KEYS}))


# ----------------------------------------------------------------------------- model keys and rope_scaling

def gpt_config(args):
    """GPTConfig(**args) once its keys are checked (a config, a checkpoint's model_args): a bad one is a UserError."""
    config = GPTConfig(**args)
    check_model(config)
    return config


def check_model(c):
    head_dim = c.n_embd // max(c.n_head, 1)
    small = [f"{k}={getattr(c, k)!r}" for k in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd") if getattr(c, k) < 1]
    if small:
        raise UserError(f"{', '.join(small)}: model sizes must be >= 1")
    if not 0 <= c.dropout < 1:
        raise UserError(f"dropout={c.dropout!r} is not allowed; use 0 <= dropout < 1")
    if not c.rope_base > 1:
        raise UserError(f"rope_base={c.rope_base!r} is not allowed; use a base > 1")
    for key, allowed in (("pos_emb", POS_EMBS), ("rope_layout", LAYOUTS)):
        if getattr(c, key) not in allowed:
            raise UserError(f"unknown {key} {getattr(c, key)!r}; allowed: {', '.join(allowed)}")
    if c.n_embd % c.n_head:
        raise UserError(f"n_embd={c.n_embd} is not divisible by n_head={c.n_head}")
    for key, allowed in (("norm", NORMS), ("mlp", MLPS)):
        if getattr(c, key) not in allowed:
            raise UserError(f"unknown {key} {getattr(c, key)!r}; allowed: {', '.join(allowed)}")
    if not (is_number(c.norm_eps) and c.norm_eps > 0):
        raise UserError(f"norm_eps must be a number > 0, got {c.norm_eps!r}")
    if c.mlp_hidden is not None and (type(c.mlp_hidden) is not int or c.mlp_hidden < 1):
        raise UserError(f"mlp_hidden must be an integer >= 1 (or None: 4 * n_embd), got {c.mlp_hidden!r}")
    kv = c.n_kv_head
    if kv is not None and (type(kv) is not int or kv < 1 or c.n_head % kv):
        raise UserError(f"n_kv_head must divide n_head={c.n_head} (or be None: n_head), got {c.n_kv_head!r}")
    if c.pos_emb == "rope" and head_dim % 2:
        raise UserError(f"RoPE needs an even head dimension, got n_embd/n_head = {head_dim}")
    if c.pos_emb == "alibi" and c.rope_scaling is not None:
        raise UserError(f"rope_scaling={c.rope_scaling!r} given to pos_emb='alibi': ALiBi has no rotation to scale")
    if c.rope_fraction is not None and c.pos_emb != "rope":
        raise UserError(f"rope_fraction={c.rope_fraction!r} is p-RoPE's; it needs pos_emb='rope', not {c.pos_emb!r}")
    for key in ("nope_every", "rope_window"):
        if (value := getattr(c, key)) is not None and (type(value) is not int or value < 1):
            raise UserError(f"{key} must be an integer >= 1 (or None), got {value!r}")
        if value is not None and c.pos_emb != "rope":
            raise UserError(f"{key}={value!r} sets the layers of a RoPE model (iRoPE, RNoPE-SWA); it needs "
                            f"pos_emb='rope', not {c.pos_emb!r}")
    if c.pos_emb == "rope" and c.rope_fraction is not None:  # p-RoPE: a share of the pairs that rotates at least one
        if not (is_number(c.rope_fraction) and 0 < c.rope_fraction <= 1):
            raise UserError(f"rope_fraction must be a number in (0, 1] (or None: every pair rotates), got {c.rope_fraction!r}")
        if round(c.rope_fraction * (head_dim // 2)) < 1:
            raise UserError(f"rope_fraction={c.rope_fraction!r} rotates round({c.rope_fraction!r} * {head_dim // 2}) = 0 of "
                            f"the {head_dim // 2} pairs; use at least {1 / (head_dim // 2):.3g} (or pos_emb='none')")
    if not isinstance(c.rope_scaling, (dict, type(None))):
        raise UserError(f"rope_scaling must be a dict or None, got {c.rope_scaling!r}; e.g. {EXAMPLE}")
    check_scaling(complete_scaling(None, c.rope_scaling, c.block_size), head_dim)


def is_number(x):
    # True is an int to Python, NaN slips past `x < 1` checks, inf leaves no frequency: none is a setting
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


EXAMPLE = {"rope_type": "yarn", "factor": 4.0, ORIGINAL: 256}


def check_scaling(scaling, head_dim=None):
    """Check a rope_scaling dict where it comes in (a config, a command's options); returns (rope_type, factor). With
    head_dim also the rotary dimension and longrope's lists. A UserError names what is wrong."""
    if scaling is None:
        return "default", 1.0
    if not isinstance(scaling, dict):
        raise UserError(f"rope_scaling must be a dict or None, got {scaling!r}; e.g. {EXAMPLE}")
    rope_type = scaling_type(scaling)
    if rope_type not in ROPE_TYPES:
        raise UserError(f"unknown rope_type {rope_type!r}; allowed: {', '.join(ROPE_TYPES)}")
    kind, get = ROPE_TYPES[rope_type], scaling.get
    if unknown := [key for key in scaling if key not in COMMON_KEYS + kind.keys]:
        # transformers warns and ignores it: a key ignored is a silent wrong number
        raise UserError(f"rope_scaling key {unknown[0]!r} is not one rope_type {rope_type!r} uses; "
                        f"allowed: {', '.join(COMMON_KEYS + kind.keys)}")
    if "factor" in kind.required and "factor" not in scaling:
        raise UserError(f"rope_type {rope_type!r} needs 'factor'")  # transformers: a missing required key
    factor = get("factor", 1.0)
    if not is_number(factor) or not 1 <= factor <= MAX_FACTOR:  # past MAX_FACTOR the math overflows
        raise UserError(f"rope_scaling factor must be a number >= 1, got {factor!r}" + f"; at most {MAX_FACTOR:g}" * (factor != 1))
    if (theta := get("rope_theta")) is not None and not (is_number(theta) and theta > 1):
        raise UserError(f"rope_theta (the RoPE base) must be a number > 1, got {theta!r}")
    for key in ("attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim"):  # None: transformers' default
        value, low = get(key), ">=" if key.startswith("mscale") else ">"  # beta: its log is taken; mscale < 0 flips logits
        if value is not None and not (is_number(value) and (value >= 0 if low == ">=" else value > 0)):
            raise UserError(f"{key} must be a number {low} 0, got {value!r}")
    if (truncate := get("truncate")) is not None and not isinstance(truncate, bool):  # YaRN's ramp: whole pairs or exact
        raise UserError(f"truncate must be True or False, got {truncate!r}")
    original = get(ORIGINAL)
    if ORIGINAL in kind.required and original is None:
        raise UserError(f"rope_type {rope_type!r} needs '{ORIGINAL}' (the training length)")
    if original is not None and (isinstance(original, bool) or not isinstance(original, numbers.Integral) or original < 1):
        raise UserError(f"{ORIGINAL} must be an integer >= 1 (the training length), got {original!r}")
    low, high = get("low_freq_factor", 1.0), get("high_freq_factor", 4.0)
    if rope_type == "llama3" and not (is_number(low) and is_number(high) and high >= low > 0):  # Llama 4: equal
        raise UserError(f"llama3 needs high_freq_factor >= low_freq_factor > 0, "
                        f"got high_freq_factor={high!r}, low_freq_factor={low!r}")
    if rope_type == "longrope" and "factor" not in scaling and get("attention_factor") is None:
        raise UserError(f"longrope needs 'factor' (its attention factor's s: config.json's max_position_embeddings / "
                        f"{ORIGINAL}) or 'attention_factor'")
    partial = get("partial_rotary_factor", 1.0)
    if not (is_number(partial) and 0 < partial <= 1):
        raise UserError(f"partial_rotary_factor must be a number in (0, 1], got {partial!r}")
    dim = int(head_dim * partial) if head_dim else None
    if dim is not None and not kind.whole_head and (dim < 2 or dim % 2):
        raise UserError(f"partial_rotary_factor={partial!r}: rotary dim int({head_dim} * p) = {dim}, odd or 0")
    for key in ("short_factor", "long_factor") if rope_type == "longrope" else ():
        values, n = get(key), dim // 2 if dim else "rotary dim / 2"
        if not (isinstance(values, (list, tuple)) and all(is_number(v) and v > 0 for v in values)
                and len(values) == (n if dim else len(values))):
            raise UserError(f"longrope's {key} must be a list of {n} numbers > 0 (one a pair), got {str(values)[:50]}")
    return rope_type, float(factor)
