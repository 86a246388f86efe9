# The copier (retrieval_small) with Scalable-Softmax: each head's logits times a learned s_h * log n. It differs from
# retrieval_small in ssmax only.
out_dir, dataset, ssmax = "out/retrieval_ssmax", "shakespeare_bytes", True
pos_emb, n_layer, n_head, n_embd, block_size = "rope", 2, 2, 64, 64
learning_rate = min_lr = 3e-3  # constant
max_iters, lr_decay_iters, eval_interval = 20000, 20000, 1000
retrieval_mix, retrieval_segment, retrieval_vocab = 0.5, 16, 256
