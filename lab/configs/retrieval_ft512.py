# The RoPE base bound in its own setting, on a model that copies: trained from scratch at 512 the copier did not learn
# to copy (retrieval_L512, base 500), so each base's copier (retrieval_small, retrieval_base{100,500,1e6}) is trained
# on at 512 at its own base, 4 rows a batch (two text, two copy rows), a tenth of its learning rate. Pass the base:
# python lab/study.py lab/configs/retrieval_ft512.py --train_args="--init_from=out/copier/retrieval_base500_seed{seed} --rope_base=500" ...
from lab.configs.retrieval_small import *  # the copier's keys; below, what differs
out_dir, init_from = "out/retrieval_ft512", "out/retrieval_small"
eval_interval, batch_size, block_size, max_iters, lr_decay_iters = 250, 4, 512, 1000, 1000
learning_rate = min_lr = 3e-4  # constant
