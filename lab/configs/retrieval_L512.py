# The RoPE base bound in its own setting (Men et al. 2024: a model trained at a length needs a base above the bound for
# it): the copier trained at 512, 2 rows a batch (one text, one copy row: its 1,024 tokens per iteration). Run at bases
# whose B_m fails inside 512 and one that passes (head dim 32: 500 fails at 103, 2000 at 236, 1e5 holds to 1283):
# python lab/study.py lab/configs/retrieval_L512.py --train_args=--rope_base=500 --out out/bound_L512_base500 ...
from lab.configs.retrieval_small import *  # the copier's keys; below, what differs
out_dir = "out/retrieval_L512"
batch_size, block_size = 2, 512
