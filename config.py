"""A run's config: the defaults, then config files (plain assignments) and --key=value, each checked (train, bench, study)."""
import ast
import math
from dataclasses import fields
from pathlib import Path
from types import ModuleType

from model import GPTConfig
from runtime import UserError, gpt_config

# vocab_size comes from the data, train_len from the checkpoint a run fine-tunes (train.py): neither is a config key
MODEL_KEYS = tuple(f.name for f in fields(GPTConfig) if f.name not in ("vocab_size", "train_len"))

DEFAULTS = dict(
    out_dir="out/default",
    init_from="scratch",  # 'scratch', 'resume' (from out_dir/ckpt.pt), or a run folder / ckpt.pt to fine-tune
    overwrite=False,  # True: a new run replaces the one in out_dir (else that is an error)
    eval_interval=250, eval_iters=20, log_interval=25,  # iterations between evaluations (and checkpoints); batches per one
    wandb_log=True, wandb_project="ropelab", wandb_run_name="", wandb_group="",  # names: out_dir's; offline if no login
    dataset="shakespeare",  # data/<dataset>/, written by data/*/prepare.py, or an absolute path to such a folder
    batch_size=16, gradient_accumulation_steps=1,  # both per process
    retrieval_mix=0.0, retrieval_segment=32, retrieval_vocab=0,  # copy rows in each batch: data/synthetic.py
    retrieval_task="copy",  # what those rows are: 'copy', or 'mqar' (retrieval_segment // 2 key-value pairs recalled)
    **{f.name: f.default for f in fields(GPTConfig) if f.name in MODEL_KEYS},  # GPTConfig's; block_size: training length
    learning_rate=2e-3, max_iters=1500, weight_decay=0.1, beta1=0.9, beta2=0.95, grad_clip=1.0,  # AdamW
    warmup_iters=100, lr_decay_iters=1500, min_lr=2e-4,  # linear warmup then cosine decay to min_lr
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
    model_config(config, vocab_size=1)  # bad model keys fail now, not after the data is prepared
    if config["min_lr"] > config["learning_rate"]:  # the cosine "decay" would climb
        raise UserError(f"min_lr={config['min_lr']:g} is above learning_rate={config['learning_rate']:g}: the schedule "
                        "decays from learning_rate to min_lr; use min_lr <= learning_rate")
    if config["rope_scaling"] is not None and config["pos_emb"] != "rope":  # it would train and be stored, doing nothing
        raise UserError(f"rope_scaling={config['rope_scaling']!r} given to pos_emb={config['pos_emb']!r}: only a RoPE model "
                        "has a rotation to scale; remove rope_scaling or use pos_emb='rope'")
    if config["retrieval_mix"] and 2 * config["retrieval_segment"] > config["block_size"] + 1:
        raise UserError(f"retrieval_segment={config['retrieval_segment']} does not fit twice in block_size="
                         f"{config['block_size']}; use retrieval_segment <= {(config['block_size'] + 1) // 2}")
    return config


def model_config(config, vocab_size, train_len=None):
    return gpt_config(dict(vocab_size=vocab_size, train_len=train_len, **{k: config[k] for k in MODEL_KEYS}))
