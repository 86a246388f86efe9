# DroPE (Gelberg et al., ICLR 2026): fine-tune rope_small with its rotation dropped (pos_emb "none") at its own length,
# for 10% of its tokens (150 iterations of 16 x 256, its batch): weights as they are, a fresh optimizer. The learning
# rate is constant after a 10% warmup, as in the authors' recalibration configs (3e-4 for SmolLM-360M).
out_dir, init_from = "out/drope_small", "out/rope_small"
pos_emb, block_size, batch_size = "none", 256, 16
max_iters, lr_decay_iters, warmup_iters, eval_interval = 150, 150, 15, 50
learning_rate = min_lr = 3e-4  # constant after the warmup
