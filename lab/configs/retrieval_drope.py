# DroPE on the copier: fine-tune out/retrieval_small with its rotation dropped (pos_emb "none") at its own length for
# 10% of its tokens (2,000 iterations of its batch), on its mixture; weights as they are, a fresh optimizer, a tenth of
# its learning rate, constant after a 10% warmup (as configs/drope_small.py).
out_dir, init_from, dataset = "out/retrieval_drope", "out/retrieval_small", "shakespeare_bytes"
pos_emb, n_layer, n_head, n_embd, block_size = "none", 2, 2, 64, 64
max_iters, lr_decay_iters, warmup_iters, eval_interval = 2000, 2000, 200, 500
learning_rate = min_lr = 3e-4  # constant after the warmup
retrieval_mix, retrieval_segment, retrieval_vocab = 0.5, 16, 256
