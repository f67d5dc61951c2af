#!/bin/bash
# Decode A/B of one CUDA switch on synthetic Llama-3-8B models: for each weight type,
# `kiln synth --fast`, then `KILN_CUDA_STEP_TIMING=1 kiln bench -p 16 -n 128 -r 2` once per
# value of the variable, in the order given (alternate them, e.g. "0 2 0 2", so that drift
# shows), each line giving the tg128 row and the GPU ms per decode step. Logs under $OUT.
#
#   scripts/gpu-switch-ab.sh KILN VARIABLE "v1 v2 ..." type...   (types as kiln synth takes them)
set -u -o pipefail
[ $# -ge 4 ] || { echo "usage: $0 KILN VARIABLE \"values\" type..." >&2; exit 2; }
K=$1
VAR=$2
read -r -a values <<< "$3"
shift 3
OUT=${OUT:-/tmp/kiln-gpu-out}
mkdir -p "$OUT"
for type in "$@"; do
  model=/tmp/ab-llama3-8b-$type.gguf
  timeout 120 "$K" synth --preset llama3-8b --type "$type" --fast -o "$model" > "$OUT/synth-$type.log" 2>&1 \
    || { echo "synth $type failed: $(tail -2 "$OUT/synth-$type.log")"; continue; }
  n=0
  for v in "${values[@]}"; do
    log="$OUT/ab-$type-$n.log"
    env "$VAR=$v" KILN_CUDA_STEP_TIMING=1 timeout 90 "$K" bench -m "$model" -p 16 -n 128 -r 2 --device cuda > "$log" 2>&1
    echo "$type $VAR=$v: $(grep -E "tg128" "$log" | tr -s ' ' | head -1) | $(grep -o "[0-9.]* ms of GPU time" "$log" | head -1)"
    n=$((n + 1))
  done
  rm -f "$model"
done
