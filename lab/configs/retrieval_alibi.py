# retrieval_small with ALiBi (Press et al. 2022) in place of RoPE; every other key is retrieval_small's.
out_dir, dataset = "out/retrieval_alibi", "shakespeare_bytes"
pos_emb, n_layer, n_head, n_embd, block_size = "alibi", 2, 2, 64, 64
learning_rate = min_lr = 3e-3  # constant
max_iters, lr_decay_iters, eval_interval = 20000, 20000, 1000
retrieval_mix, retrieval_segment, retrieval_vocab = 0.5, 16, 256
