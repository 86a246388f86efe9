# DroPE on the copier: fine-tune out/retrieval_small with its rotation dropped (pos_emb "none") at its own length for
# 10% of its tokens (2,000 iterations of its batch), on its mixture; weights as they are, a fresh optimizer, a tenth of
# its learning rate, constant after a 10% warmup (as configs/drope_small.py).
from lab.configs.retrieval_small import *  # the copier's keys; below, what differs
out_dir, init_from = "out/retrieval_drope", "out/retrieval_small"
eval_interval, pos_emb, max_iters, warmup_iters, lr_decay_iters = 500, "none", 2000, 200, 2000
learning_rate = min_lr = 3e-4  # constant after the warmup
