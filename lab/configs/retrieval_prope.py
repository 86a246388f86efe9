# retrieval_small with p-RoPE (Barbero et al. 2024), fraction 0.5: the 8 slowest of each head's 16 pairs do not
# rotate; every other key is retrieval_small's.
out_dir, dataset, rope_fraction = "out/retrieval_prope", "shakespeare_bytes", 0.5
pos_emb, n_layer, n_head, n_embd, block_size = "rope", 2, 2, 64, 64
learning_rate = min_lr = 3e-3  # constant
max_iters, lr_decay_iters, eval_interval = 20000, 20000, 1000
retrieval_mix, retrieval_segment, retrieval_vocab = 0.5, 16, 256
