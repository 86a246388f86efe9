# RNoPE-SWA (Yang et al. 2025, "Rope to Nope and Back Again"): one global NoPE layer in four, as in the paper's
# design and Cohere's Command A, the three RoPE layers local, each attending to its last 64 tokens (L/4).
# It differs from irope_small in rope_window only.
out_dir, pos_emb, nope_every, rope_window = "out/rnope_swa_small", "rope", 4, 64
