# RoPE on Python source (data/sympy: one document per file of the sympy package) at L = 64, the default shape: the
# setting where context past L pays (docs/experiments.md, "Text where context pays"). 64 rows of 64 per batch keep
# rope_small's 4,096 tokens per iteration.
out_dir, dataset = "out/code_small", "sympy"
block_size, batch_size = 64, 64
