# code_yarn4x with Position Interpolation instead of YaRN (Chen et al. 2023 fine-tuned PI the same way).
out_dir, init_from, dataset = "out/code_pi4x", "out/code_small", "sympy"
block_size, batch_size = 256, 16
rope_scaling = {"rope_type": "linear", "factor": 4.0, "original_max_position_embeddings": 64}
max_iters, lr_decay_iters, warmup_iters, eval_interval = 1000, 1000, 50, 250
learning_rate, min_lr = 1e-3, 1e-4
