# The regime ladder's size rung: code_L32 (Python source at L = 32, 4,096 tokens per iteration) with 4.5M parameters
# instead of 1.0M (5 layers of width 256; 8 heads keep head dimension 32, so the RoPE pairs turn as at L = 32),
# trained on the same tokens with the same schedule. Its ceiling: lab/configs/code_yarn4x.py from it at 128.
out_dir, dataset = "out/code_L32_4M", "sympy"
block_size, batch_size = 32, 128
n_layer, n_head, n_embd = 5, 8, 256
