# GPT-2 small's shape, trained as nanoGPT trains it, with RoPE, for one GPU on a large corpus: 12 layers,
# 12 heads, 768 wide, 1024 tokens, full GPT-2 vocabulary: 123.6M parameters (token embedding tied to the
# output layer; RoPE has no position table: GPT-2's learned one adds 0.8M, 124.3M with pos_emb="learned").
# Tokens per optimizer step: 12 sequences x 1024 tokens x 40 micro steps = 491,520 per process
# (nanoGPT's ~0.5M; with torchrun divide gradient_accumulation_steps by the number of GPUs to keep it).
#
# Prepare the corpus first (about 10B tokens, 20 GB of uint16 tokens; needs `pip install datasets`):
#   python data/text/prepare.py hf:HuggingFaceFW/fineweb-edu:sample-10BT --name fineweb_edu
# or any folder of JSONL / Parquet files:  python data/text/prepare.py FOLDER --name fineweb_edu
# 20,000 steps x 491,520 = 9.8B tokens: about one pass over that sample.
out_dir = "out/gpt2_124m"
dataset = "fineweb_edu"
n_layer, n_head, n_embd = 12, 12, 768
block_size = 1024
pos_emb = "rope"
dropout = 0.0
batch_size, gradient_accumulation_steps = 12, 40
learning_rate, min_lr = 6e-4, 6e-5
warmup_iters = 2000
max_iters = lr_decay_iters = 20000
weight_decay = 0.1
eval_interval, eval_iters, log_interval = 1000, 200, 10
compile = True
