# A fine-tuning recipe (lab/recipes.py): code_L32 (the ladder's L = 32 rung) fine-tuned at 4L = 128 with one scaling,
# given as --rope_scaling (none given: plain RoPE); the same tokens, learning rate and schedule for every recipe, the
# ceiling's learning rate over 400 iterations (YaRN's fine-tune length), and the checkpoints along the way kept.
out_dir, init_from, dataset = "out/code_recipe", "out/code_L32", "sympy"
block_size, batch_size = 128, 32
max_iters, warmup_iters, eval_interval = 400, 20, 100
keep_iters = (0, 10, 25, 50, 100, 200, 400)
learning_rate, min_lr = 1e-3, 1e-4
