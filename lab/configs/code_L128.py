# code_small at L = 128: the regime ladder's rung for context past a longer L at base 10,000 (docs/results/ladder.md);
# 32 rows of 128 keep 4,096 tokens per iteration. Its ceiling fine-tunes at 4L = 512.
out_dir, dataset = "out/code_L128", "sympy"
block_size, batch_size = 128, 32
