# The small CPU experiment (the defaults, in config.py) with RoPE. The *_small configs differ
# only in their position encoding, so their runs compare position encodings alone.
out_dir, pos_emb = "out/rope_small", "rope"
