# The matched control for rope_small_pi4x / rope_small_yarn4x: the same fine-tune (weights from the run, a fresh
# optimizer, 300 iterations at the same learning rates, the same 4,096 tokens per iteration) at the run's own length,
# so a fine-tune's gain over it is the longer length's, not the extra training's.
out_dir, init_from = "out/rope_small_cont", "out/rope_small"
pos_emb, block_size, batch_size = "rope", 256, 16
max_iters, lr_decay_iters, warmup_iters, eval_interval = 300, 300, 30, 100
learning_rate, min_lr = 3e-4, 3e-5
