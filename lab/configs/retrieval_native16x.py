# The copier trained natively at 16x its length: retrieval_small at block_size 1024, 2 rows a batch (one text, one
# copy row), for the copier's tokens (10,000 x 2 x 1024 = 20,000 x 16 x 64). The ceiling zero-shot methods are read against.
from lab.configs.retrieval_small import *  # the copier's keys; below, what differs
out_dir = "out/retrieval_native16x"
eval_interval, batch_size, block_size, max_iters, lr_decay_iters = 500, 2, 1024, 10000, 10000
