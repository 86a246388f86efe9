# The control for the 16x fine-tunes: fine-tune out/retrieval_small at its own length (64) as retrieval_yarn16x does at
# 1024: 300 iterations of the same tokens (32 rows of 64 a batch, half copy rows), a fresh optimizer, a tenth of its
# learning rate. What the 16x fine-tune gains beyond this is the longer context's, not the extra training's.
from lab.configs.retrieval_small import *  # the copier's keys; below, what differs
out_dir, init_from = "out/retrieval_ft64", "out/retrieval_small"
eval_interval, batch_size, max_iters, warmup_iters, lr_decay_iters = 100, 32, 300, 30, 300
learning_rate = min_lr = 3e-4  # constant after the warmup
