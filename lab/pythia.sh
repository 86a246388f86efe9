#!/usr/bin/env bash
# The Pythia ladder (docs/pretrained.md): every model folder converted once into a run (OUT/<name>, kept: a
# second call on the same folder reads it again) and read at 1x, 2x and 4x of its trained length L (2,048
# for Pythia) on the same held-out text, prepared once with the first model's tokenizer (the others must
# share it). Two readings: eval/extrapolate.py (windows from position 0, exact crop strided by L/8), and
# lab/context.py --targets L, which is bojone's protocol (the final L tokens of each window scored in one
# forward of 1x, 2x or 4x L) with exact crop on the same targets. Then one comparison across the models, and
# lab/protocols.py's decomposition of bojone's protocol (the swapped prefix).
#   bash lab/pythia.sh TEXT OUT MODEL_DIR...     (TEXT: a folder of .txt, or a .jsonl / .parquet file)
# Environment: METHODS (default below), UNITS (context.py's windows, default 32), TOKENS (extrapolate.py's
# scored tokens per length, default 8 L), VAL_FRACTION (the held-out share of the documents, default 0.1), DOCS
# (the held-out half lab/protocols.py reads: test, or all; default test).
set -euo pipefail
usage="usage: bash lab/pythia.sh TEXT OUT MODEL_DIR..."
text=${1:?$usage}; out=${2:?$usage}; shift 2
[ $# -gt 0 ] || { echo "pythia.sh: give at least one model folder; $usage" >&2; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)  # the scripts run from any folder; paths stay the caller's
methods=${METHODS:-none,crop,pi,ntk,yarn,llama3,self-extend,rerope}
# before anything is computed: a model's run is OUT/<its folder's name>, so two names alike would share one,
# and a run already there is read again only if it was converted from this very folder
names=$(for model in "$@"; do basename "$model"; done | sort | uniq -d)
[ -z "$names" ] || { echo "pythia.sh: two model folders are named $(echo $names): each one's run is" \
  "OUT/<name>; give them different names (a link named otherwise will do)" >&2; exit 2; }
for model in "$@"; do
  run=$out/$(basename "$model")
  [ ! -f "$run/ckpt.pt" ] || python - "$run" "$model" <<'CHECK' || exit 1
import os, sys, torch
run, model = sys.argv[1:]
try:  # mmap: a 7B model's record is read without its weights
    ckpt = torch.load(os.path.join(run, "ckpt.pt"), map_location="cpu", mmap=True, weights_only=True)
    source = (ckpt.get("pretrained") or {}).get("folder")
except Exception as e:  # a damaged or foreign file: one line
    sys.exit(f"pythia.sh: {run}/ckpt.pt cannot be read ({type(e).__name__}): remove that run to convert "
             f"{model} there")
if source != os.path.realpath(model):
    sys.exit(f"pythia.sh: {run} holds a conversion of {source or 'no model folder (a trained run)'}, "
             f"not of {model}: give another OUT, or remove that run to convert this model there")
CHECK
done
python "$root/data/text/prepare.py" "$text" --out_dir "$out/heldout" --tokenizer "$1" \
    --val_fraction "${VAL_FRACTION:-0.1}"
dirs=()
for model in "$@"; do
  start=$SECONDS
  run=$out/$(basename "$model")
  [ -f "$run/ckpt.pt" ] || python "$root/pretrained.py" "$model" --out "$run" --dataset "$out/heldout"
  L=$(python -c "import json, sys; print(json.load(open(sys.argv[1]))['max_position_embeddings'])" \
      "$model/config.json")
  python "$root/eval/extrapolate.py" "$run" --lengths 1,2,4 --protocols windows --methods "$methods" \
      --tokens "${TOKENS:-$((8 * L))}" --no-wandb
  python "$root/lab/context.py" "$run" --contexts 1,2,4 --targets "$L" --units "${UNITS:-32}" \
      --methods "$methods"
  dirs+=("$run")
  echo "pythia.sh: $run read in $((SECONDS - start)) s"
done
python "$root/eval/compare.py" "${dirs[@]}" --out "$out/compare"
# bojone's protocol with exact crop beside, decomposed: the handicap, each method minus crop at 2L and 4L, the
# swapped prefix's distortion and what each reads past L (lab/protocols.py; docs/methodology.md)
python "$root/lab/protocols.py" "${dirs[@]}" --protocols bojone --docs "${DOCS:-test}" --units "${UNITS:-32}" --out "$out/protocols" \
    --no-wandb
