# The small CPU experiment (the defaults in train.py) with sinusoidal positions.
# The four *_small configs differ only in pos_emb, so their runs compare position encodings alone.
out_dir = "out/sinusoidal_small"
pos_emb = "sinusoidal"
