# The small CPU experiment (the defaults in train.py) with learned positions. The *_small configs differ
# only in their position encoding, so their runs compare position encodings alone.
out_dir, pos_emb = "out/learned_small", "learned"
