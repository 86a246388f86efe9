# The copier (retrieval_small) with iRoPE's interleaving: of its 2 layers the 2nd attends globally with no positions
# (NoPE), the 1st uses RoPE. It differs from retrieval_small in nope_every only.
from lab.configs.retrieval_small import *  # the copier's keys; below, what differs
out_dir = "out/retrieval_irope"
nope_every = 2
