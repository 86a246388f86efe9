# rope_small with Scalable-Softmax (Nakanishi 2025): each head's logits times s_h * log(keys the query sees), s_h
# learned per layer and head from 1 / log 256 (softmax at the training length). It differs from rope_small in ssmax only.
out_dir, pos_emb, ssmax = "out/ssmax_small", "rope", True
