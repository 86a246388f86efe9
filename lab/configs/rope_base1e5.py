# rope_small at rope_base 1e5, a point of the sweep of the RoPE base bound (Men et al. 2024; rope_small, base 1e4,
# is another): with head dim 32, B_m first falls below 0 at distance 1283 (rope_small: 474).
out_dir, pos_emb, rope_base = "out/rope_base1e5", "rope", 1e5
