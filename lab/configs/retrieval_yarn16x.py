# The ceiling for zero-shot YaRN on the copier: fine-tune out/retrieval_small at 16x its length (1024) with YaRN at
# factor 16 for 300 iterations (Peng et al. fine-tuned 400 steps at factor 16) on its mixture, 2 rows of 1024 a batch
# (one text, one copy row); weights from the run, a fresh optimizer, a tenth of its learning rate.
out_dir, init_from, dataset = "out/retrieval_yarn16x", "out/retrieval_small", "shakespeare_bytes"
pos_emb, n_layer, n_head, n_embd, block_size, batch_size = "rope", 2, 2, 64, 1024, 2
rope_scaling = {"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 64}
retrieval_mix, retrieval_segment, retrieval_vocab = 0.5, 16, 256
max_iters, lr_decay_iters, warmup_iters, eval_interval = 300, 300, 30, 100
learning_rate = min_lr = 3e-4  # constant after the warmup
