# The copier's recipe with multi-query associative recall (Zoology's MQAR) instead of copy rows: half of each batch
# 8 key-value pairs asked again later in the row (data/synthetic.py), half Shakespeare bytes. Else retrieval_small.
out_dir, dataset, retrieval_task = "out/mqar_small", "shakespeare_bytes", "mqar"
pos_emb, n_layer, n_head, n_embd, block_size = "rope", 2, 2, 64, 64
learning_rate = min_lr = 3e-3  # constant
max_iters, lr_decay_iters, eval_interval = 20000, 20000, 1000
retrieval_mix, retrieval_segment, retrieval_vocab = 0.5, 16, 256
