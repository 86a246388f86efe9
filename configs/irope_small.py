# Llama 4's iRoPE without its chunked attention: of the 4 layers the 4th attends globally with no positions (NoPE),
# the other three use RoPE over the whole context. It differs from rope_small in nope_every only.
out_dir, pos_emb, nope_every = "out/irope_small", "rope", 4
