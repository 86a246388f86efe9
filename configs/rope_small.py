# The small CPU experiment (the defaults in train.py) with rope positions.
# The four *_small configs differ only in pos_emb, so their runs compare position encodings alone.
out_dir = "out/rope_small"
pos_emb = "rope"
