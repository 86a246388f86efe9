# The copier (retrieval_small) as RNoPE-SWA: of its 2 layers the 2nd attends globally with no positions (NoPE),
# the 1st uses RoPE within its last 16 tokens (L/4). It differs from retrieval_irope in rope_window only.
from lab.configs.retrieval_small import *  # the copier's keys; below, what differs
out_dir = "out/retrieval_rnope_swa"
nope_every, rope_window = 2, 16
