# retrieval_small at rope_base 500, a point of the RoPE base sweep on a model that copies; every other key is
# retrieval_small's. B_m first falls below 0 at distance 103 (1.6x the training length 64).
from lab.configs.retrieval_small import *  # the copier's keys; below, what differs
out_dir = "out/retrieval_base500"
rope_base = 500.0
