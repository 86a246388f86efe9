#!/usr/bin/env bash
# The regime ladder's GPU rung (docs/experiments.md): the ladder's study on lab/configs/code_L256_20M.py, 2 seeds (the
# L model, its ceiling fine-tuned at 4L = 1024 with YaRN, then lab/ladder.py's dev choices and test page). Sized for
# one GPU in under 8 minutes at estimated speeds; then the published protocols (lab/protocols.py) on dev and test. Options after OUT go to every training.
#   bash lab/gpu_rung.sh out/ladder_gpu
set -euo pipefail
out=${1:?usage: bash lab/gpu_rung.sh OUT [train.py options]}; shift
size=(--n_layer=6 --n_head=8 --n_embd=512)  # the ceiling is the L model's shape (train.py checks it)
for s in 0 1; do
  start=$SECONDS
  python train.py lab/configs/code_L256_20M.py --out_dir="$out/L256_20M/code_small_seed$s" --seed=$s --wandb_log=False "$@"
  python train.py lab/configs/code_yarn4x.py "${size[@]}" --out_dir="$out/L256_20M/code_yarn4x_seed$s" --seed=$s \
      --wandb_log=False --init_from="$out/L256_20M/code_small_seed$s" --block_size=1024 --batch_size=16 \
      "--rope_scaling={'rope_type': 'yarn', 'factor': 4.0, 'original_max_position_embeddings': 256}" "$@"
  echo "gpu_rung: seed $s trained in $((SECONDS - start)) s"
done
start=$SECONDS
python lab/ladder.py "$out/L256_20M" --seeds 2 --out "$out/page"
echo "gpu_rung: ladder page in $((SECONDS - start)) s"
start=$SECONDS
python lab/protocols.py "$out/L256_20M" --seeds 2 --docs dev --out "$out/protocols_dev"
python lab/protocols.py "$out/L256_20M" --seeds 2 --out "$out/protocols"
echo "gpu_rung: published protocols in $((SECONDS - start)) s, all in $SECONDS s"
