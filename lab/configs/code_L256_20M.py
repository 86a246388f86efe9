# The regime ladder's GPU rung: Python source at L = 256 with 20M parameters (6 layers of width 512, 8 heads of
# dimension 64: 13 of 32 RoPE pairs complete a period within L at base 10,000), 64 rows of 256 = 16,384 tokens per
# iteration for 1,500 iterations (24.6M tokens, about 3 passes over the corpus). For one GPU: lab/gpu_rung.sh.
out_dir, dataset = "out/code_L256_20M", "sympy"
block_size, batch_size = 256, 64
n_layer, n_head, n_embd = 6, 8, 512
learning_rate, min_lr = 1e-3, 1e-4
