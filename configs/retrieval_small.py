# rope_small plus synthetic retrieval (data/synthetic.py): every training sequence gets a segment of 64
# random tokens (ids 0..255) repeated at a random distance up to the training length, so that the copy
# and passkey probes (eval/probes.py) have something to measure. Measured: it does NOT copy yet after
# 1,800 iterations (README, "Probes"); these keys are the levers.
out_dir = "out/retrieval_small"
pos_emb = "rope"
retrieval_mix = 1.0
retrieval_segment = 64
retrieval_vocab = 256
max_iters = 2000
lr_decay_iters = 2000
