# The copier trained natively at 16x its length: retrieval_small at block_size 1024, 2 rows a batch (one text, one
# copy row), for the copier's tokens (10,000 x 2 x 1024 = 20,000 x 16 x 64). The ceiling zero-shot methods are read against.
out_dir, dataset = "out/retrieval_native16x", "shakespeare_bytes"
pos_emb, n_layer, n_head, n_embd, block_size, batch_size = "rope", 2, 2, 64, 1024, 2
learning_rate = min_lr = 3e-3  # constant
max_iters, lr_decay_iters, eval_interval = 10000, 10000, 500
retrieval_mix, retrieval_segment, retrieval_vocab = 0.5, 16, 256
