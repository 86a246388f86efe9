# code_small at L = 32: the rung of the regime ladder where a 1.0M-parameter model's ceiling gains most from context past L
# (docs/results/ladder.md); 128 rows of 32 keep 4,096 tokens per iteration.
out_dir, dataset = "out/code_L32", "sympy"
block_size, batch_size = 32, 128
