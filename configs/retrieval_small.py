# rope_small plus synthetic retrieval (data/synthetic.py): half of each batch is rows of random
# chunks (ids 0..255, 2..64 tokens), half of them copies of an earlier stretch, so that the copy and
# passkey probes (eval/probes.py) have something to measure. The README ("Probes") says what it reaches.
out_dir = "out/retrieval_small"
pos_emb = "rope"
retrieval_mix = 0.5
retrieval_segment = 64
retrieval_vocab = 256
max_iters = 2000
lr_decay_iters = 2000
