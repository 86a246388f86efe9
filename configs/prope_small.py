# The small CPU experiment (the defaults in train.py) with p-RoPE (Barbero et al. 2024), fraction 0.5: the 8 lowest
# of the 16 pairs turn less than half a turn in 256 tokens, so past 256 they meet angles never trained on; unrotated.
out_dir, pos_emb, rope_fraction = "out/prope_small", "rope", 0.5
