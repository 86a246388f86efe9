# retrieval_small with ALiBi (Press et al. 2022) in place of RoPE; every other key is retrieval_small's.
from lab.configs.retrieval_small import *  # the copier's keys; below, what differs
out_dir = "out/retrieval_alibi"
pos_emb = "alibi"
