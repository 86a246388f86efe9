# Fine-tune rope_small at 4x its training length with YaRN (Peng et al. 2023 fine-tuned 400 steps at
# factor 16; this is the small-scale version): the weights start from the run, the optimizer fresh.
# The same tokens per iteration as rope_small (4 x 1024 = 16 x 256).
out_dir = "out/rope_small_yarn4x"
init_from = "out/rope_small"
pos_emb = "rope"
block_size = 1024
rope_scaling = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256}
batch_size = 4
max_iters = 300
lr_decay_iters = 300
warmup_iters = 30
learning_rate = 3e-4
min_lr = 3e-5
eval_interval = 100
