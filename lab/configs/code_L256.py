# code_small at L = 256: the regime ladder's longest rung at base 10,000 (docs/results/ladder.md); 16 rows of 256 keep
# 4,096 tokens per iteration. Its ceiling fine-tunes at 4L = 1024.
out_dir, dataset = "out/code_L256", "sympy"
block_size, batch_size = 256, 16
