# GPT-2 small's shape with RoPE, trained as nanoGPT trains it, for GPUs and a large corpus (docs/reference.md,
# "configs/gpt2_124m.py"): 123.6M parameters; 12 sequences x 1024 tokens x 40 micro steps = 491,520 tokens per
# optimizer step per process (with torchrun, divide gradient_accumulation_steps by the number of GPUs to keep it);
# 20,000 steps = 9.8B tokens, about one pass over the corpus. Prepare it first (~10B tokens, 20 GB; `pip install datasets`):
#   python data/text/prepare.py hf:HuggingFaceFW/fineweb-edu:sample-10BT --name fineweb_edu
out_dir, dataset = "out/gpt2_124m", "fineweb_edu"
n_layer, n_head, n_embd = 12, 12, 768
block_size, pos_emb, dropout = 1024, "rope", 0.0
batch_size, gradient_accumulation_steps = 12, 40
learning_rate, min_lr = 6e-4, 6e-5
warmup_iters, max_iters, lr_decay_iters = 2000, 20000, 20000
eval_interval, eval_iters, log_interval = 1000, 200, 10
weight_decay, compile = 0.1, True
