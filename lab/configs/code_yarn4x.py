# The ceiling on Python source: code_small fine-tuned at 4L = 256 with YaRN at factor 4, as the YaRN and PI papers
# fine-tune; weights from the run, a fresh optimizer, 4,096 tokens per iteration. The recipe (1,000 iterations, half
# code_small's learning rate) was chosen on a seed the study does not use (docs/experiments.md).
out_dir, init_from, dataset = "out/code_yarn4x", "out/code_small", "sympy"
block_size, batch_size = 256, 16
rope_scaling = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
max_iters, lr_decay_iters, warmup_iters, eval_interval = 1000, 1000, 50, 250
learning_rate, min_lr = 1e-3, 1e-4
