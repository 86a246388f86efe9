# The copier (retrieval_small) with iRoPE's interleaving: of its 2 layers the 2nd attends globally with no positions
# (NoPE), the 1st uses RoPE. It differs from retrieval_small in nope_every only.
out_dir, dataset, nope_every = "out/retrieval_irope", "shakespeare_bytes", 2
pos_emb, n_layer, n_head, n_embd, block_size = "rope", 2, 2, 64, 64
learning_rate = min_lr = 3e-3  # constant
max_iters, lr_decay_iters, eval_interval = 20000, 20000, 1000
retrieval_mix, retrieval_segment, retrieval_vocab = 0.5, 16, 256
