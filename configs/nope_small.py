# The small CPU experiment (the defaults in train.py) with no positions at all (NoPE).
# The four *_small configs differ only in pos_emb, so their runs compare position encodings alone.
out_dir = "out/nope_small"
pos_emb = "none"
