# The RoPE base bound in its own setting, on a model that copies: trained from scratch at 512 the copier did not learn
# to copy (retrieval_L512, base 500), so each base's copier (retrieval_small, retrieval_base{100,500,1e6}) is trained
# on at 512 at its own base, 4 rows a batch (two text, two copy rows), a tenth of its learning rate. Pass the base:
# python lab/study.py lab/configs/retrieval_ft512.py --train_args="--init_from=out/copier/retrieval_base500_seed{seed} --rope_base=500" ...
out_dir, init_from, dataset = "out/retrieval_ft512", "out/retrieval_small", "shakespeare_bytes"
pos_emb, n_layer, n_head, n_embd, block_size, batch_size = "rope", 2, 2, 64, 512, 4
retrieval_mix, retrieval_segment, retrieval_vocab = 0.5, 16, 256
max_iters, lr_decay_iters, warmup_iters, eval_interval = 1000, 1000, 100, 250
learning_rate = min_lr = 3e-4  # constant after the warmup
