# The matched control for code_yarn4x / code_pi4x: the same fine-tune (weights from code_small, a fresh optimizer,
# 1,000 iterations of 4,096 tokens at the same learning rates) at the run's own length 64. What a 4L fine-tune read
# with its full context gains over this one read with crop is the longer context's, not the extra training's.
out_dir, init_from, dataset = "out/code_ft64", "out/code_small", "sympy"
block_size, batch_size = 64, 64
max_iters, lr_decay_iters, warmup_iters, eval_interval = 1000, 1000, 50, 250
learning_rate, min_lr = 1e-3, 1e-4
