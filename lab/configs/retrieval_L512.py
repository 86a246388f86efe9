# The RoPE base bound in its own setting (Men et al. 2024: a model trained at a length needs a base above the bound for
# it): the copier trained at 512, 2 rows a batch (one text, one copy row: its 1,024 tokens per iteration). Run at bases
# whose B_m fails inside 512 and one that passes (head dim 32: 500 fails at 103, 2000 at 236, 1e5 holds to 1283):
# python lab/study.py lab/configs/retrieval_L512.py --train_args=--rope_base=500 --out out/bound_L512_base500 ...
out_dir, dataset = "out/retrieval_L512", "shakespeare_bytes"
pos_emb, n_layer, n_head, n_embd, block_size, batch_size = "rope", 2, 2, 64, 512, 2
learning_rate = min_lr = 3e-3  # constant
max_iters, lr_decay_iters, eval_interval = 20000, 20000, 1000
retrieval_mix, retrieval_segment, retrieval_vocab = 0.5, 16, 256
