# retrieval_small at rope_base 100, a point of the RoPE base sweep on a model that copies; every other key is
# retrieval_small's. B_m first falls below 0 at distance 28, inside the training length 64.
from lab.configs.retrieval_small import *  # the copier's keys; below, what differs
out_dir = "out/retrieval_base100"
rope_base = 100.0
