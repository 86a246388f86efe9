# retrieval_small at rope_base 100, a point of the RoPE base sweep on a model that copies (README,
# "The RoPE base bound"). B_m first falls below 0 at distance 28, inside the training length 64.
# Every other key is retrieval_small's.
out_dir = "out/retrieval_base100"
rope_base = 100.0
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
