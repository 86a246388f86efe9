# Fine-tune rope_small at 4x its training length with Position Interpolation (Chen et al. 2023 fine-tuned 1000 steps;
# this is the small-scale version): weights from the run, a fresh optimizer, rope_small's tokens per iteration.
out_dir, init_from = "out/rope_small_pi4x", "out/rope_small"
pos_emb, block_size, batch_size = "rope", 1024, 4
rope_scaling = {"rope_type": "linear", "factor": 4.0}
max_iters, lr_decay_iters, warmup_iters, eval_interval = 300, 300, 30, 100
learning_rate, min_lr = 3e-4, 3e-5
