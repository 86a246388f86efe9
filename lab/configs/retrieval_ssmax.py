# The copier (retrieval_small) with Scalable-Softmax: each head's logits times a learned s_h * log n. It differs from
# retrieval_small in ssmax only.
from lab.configs.retrieval_small import *  # the copier's keys; below, what differs
out_dir = "out/retrieval_ssmax"
ssmax = True
