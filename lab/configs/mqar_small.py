# The copier's recipe with multi-query associative recall (Zoology's MQAR) instead of copy rows: half of each batch
# 8 key-value pairs asked again later in the row (data/synthetic.py), half Shakespeare bytes. Else retrieval_small.
from lab.configs.retrieval_small import *  # the copier's keys; below, what differs
out_dir = "out/mqar_small"
retrieval_task = "mqar"
