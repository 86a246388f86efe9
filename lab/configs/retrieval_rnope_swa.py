# The copier (retrieval_small) as RNoPE-SWA: of its 2 layers the 2nd attends globally with no positions (NoPE),
# the 1st uses RoPE within its last 16 tokens (L/4). It differs from retrieval_irope in rope_window only.
out_dir, dataset, nope_every = "out/retrieval_rnope_swa", "shakespeare_bytes", 2
rope_window = 16
pos_emb, n_layer, n_head, n_embd, block_size = "rope", 2, 2, 64, 64
learning_rate = min_lr = 3e-3  # constant
max_iters, lr_decay_iters, eval_interval = 20000, 20000, 1000
retrieval_mix, retrieval_segment, retrieval_vocab = 0.5, 16, 256
