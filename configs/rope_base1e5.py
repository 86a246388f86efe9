# The base sweep of the RoPE base bound (Men et al. 2024; README, "The RoPE base bound"): rope_small with
# rope_base 1e5. With head dim 32, B_m first falls below 0 at distance 1283;
# rope_small (base 1e4) is the sweep's fourth point, at 474.
out_dir = "out/rope_base1e5"
pos_emb, rope_base = "rope", 1e5
