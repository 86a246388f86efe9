# The small CPU experiment (the defaults in train.py) with ALiBi (Press et al. 2022): linear distance biases, no table.
# The *_small configs differ only in their position encoding, so their runs compare position encodings alone.
out_dir, pos_emb = "out/alibi_small", "alibi"
