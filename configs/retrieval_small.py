# The smallest config measured to copy inside its training length on the 2-core CPU (README, "Probes"):
# half of each batch is synthetic copy rows (data/synthetic.py: random chunks of 2..16 byte ids, half of
# them copies of an earlier stretch), half Shakespeare at a byte vocabulary. Its induction circuit formed
# after a long plateau (13,000-14,000 iterations at seed 1337); a constant learning rate keeps it reachable.
out_dir = "out/retrieval_small"
dataset = "shakespeare_bytes"
pos_emb = "rope"
n_layer = 2
n_head = 2
n_embd = 64
block_size = 64
learning_rate = 3e-3
min_lr = 3e-3
max_iters = 20000
lr_decay_iters = 20000
eval_interval = 1000
retrieval_mix = 0.5
retrieval_segment = 16
retrieval_vocab = 256
