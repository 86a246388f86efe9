# The ceiling for zero-shot PI on the copier: fine-tune out/retrieval_small at 16x its length (1024) with PI at
# factor 16 for 300 iterations (as the YaRN fine-tune, so the two ceilings compare) on its mixture, 2 rows of 1024 a batch
# (one text, one copy row); weights from the run, a fresh optimizer, a tenth of its learning rate.
from lab.configs.retrieval_small import *  # the copier's keys; below, what differs
out_dir, init_from = "out/retrieval_pi16x", "out/retrieval_small"
eval_interval, batch_size, block_size, max_iters, warmup_iters, lr_decay_iters = 100, 2, 1024, 300, 30, 300
rope_scaling = {"rope_type": "linear", "factor": 16.0}
learning_rate = min_lr = 3e-4  # constant after the warmup
