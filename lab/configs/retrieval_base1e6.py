# retrieval_small at rope_base 1e6, a point of the RoPE base sweep on a model that copies; every other key is
# retrieval_small's. B_m first falls below 0 at distance 3,478 (54x the training length 64).
from lab.configs.retrieval_small import *  # the copier's keys; below, what differs
out_dir = "out/retrieval_base1e6"
rope_base = 1e+06
