# retrieval_small with p-RoPE (Barbero et al. 2024), fraction 0.5: the 8 slowest of each head's 16 pairs do not
# rotate; every other key is retrieval_small's.
from lab.configs.retrieval_small import *  # the copier's keys; below, what differs
out_dir = "out/retrieval_prope"
rope_fraction = 0.5
