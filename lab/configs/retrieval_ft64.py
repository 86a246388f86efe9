# The control for the 16x fine-tunes: fine-tune out/retrieval_small at its own length (64) as retrieval_yarn16x does at
# 1024: 300 iterations of the same tokens (32 rows of 64 a batch, half copy rows), a fresh optimizer, a tenth of its
# learning rate. What the 16x fine-tune gains beyond this is the longer context's, not the extra training's.
out_dir, init_from, dataset = "out/retrieval_ft64", "out/retrieval_small", "shakespeare_bytes"
pos_emb, n_layer, n_head, n_embd, block_size, batch_size = "rope", 2, 2, 64, 64, 32
retrieval_mix, retrieval_segment, retrieval_vocab = 0.5, 16, 256
max_iters, lr_decay_iters, warmup_iters, eval_interval = 300, 300, 30, 100
learning_rate = min_lr = 3e-4  # constant after the warmup
