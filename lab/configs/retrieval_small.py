# The smallest config measured to copy inside its training length on the 2-core CPU (README, "Probes"):
# half of each batch is synthetic copy rows (data/synthetic.py: random chunks of 2..16 byte ids, half of
# them copies of an earlier stretch), half Shakespeare at a byte vocabulary. Its induction circuit formed
# after a long plateau (13,000-14,000 iterations at seed 1337); a constant learning rate keeps it reachable.
out_dir, dataset = "out/retrieval_small", "shakespeare_bytes"
pos_emb, n_layer, n_head, n_embd, block_size = "rope", 2, 2, 64, 64
learning_rate = min_lr = 3e-3  # constant
max_iters, lr_decay_iters, eval_interval = 20000, 20000, 1000
retrieval_mix, retrieval_segment, retrieval_vocab = 0.5, 16, 256
