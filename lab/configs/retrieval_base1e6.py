# retrieval_small at rope_base 1e6, a point of the RoPE base sweep on a model that copies; every other key is
# retrieval_small's. B_m first falls below 0 at distance 3,478 (54x the training length 64).
out_dir, dataset, rope_base = "out/retrieval_base1e6", "shakespeare_bytes", 1e6
pos_emb, n_layer, n_head, n_embd, block_size = "rope", 2, 2, 64, 64
learning_rate = min_lr = 3e-3  # constant
max_iters, lr_decay_iters, eval_interval = 20000, 20000, 1000
retrieval_mix, retrieval_segment, retrieval_vocab = 0.5, 16, 256
