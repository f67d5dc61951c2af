#!/bin/bash
# Decode attention in the chained decode graph, with and without the measurement switches of
# backend/cuda/attention.cu (KILN_CUDA_ATTN_CLUSTER=0, KILN_CUDA_ATTN_PREFETCH=0): the mean
# GPU time of a decode step (KILN_CUDA_STEP_TIMING=1, graph replays) over the steps of tg128
# (contexts 1..128) and tg1024 (contexts 1..1024); a step with attention left out
# (KILN_CUDA_SKIP_OPS=attention) gives what attention costs. Then tg128 of
# `kiln bench -p 512 -n 128 -r 3` (tg tests start from an empty cache: contexts 1..128).
#
#   scripts/gpu-attention-variants.sh path/to/kiln model.gguf
set -u -o pipefail
[ $# -eq 2 ] || { echo "usage: $0 KILN MODEL" >&2; exit 2; }
K=$1
M=$2
variants=("" "KILN_CUDA_ATTN_CLUSTER=0" "KILN_CUDA_ATTN_PREFETCH=0")
step_ms() {  # env settings, tokens generated
  env $1 KILN_CUDA_STEP_TIMING=1 timeout 120 "$K" bench -m "$M" -p 0 -n "$2" -r 1 --device cuda 2>&1 |
    grep -o "[0-9.]* ms of GPU time" | head -1
}
echo "without attention: tg128 $(step_ms KILN_CUDA_SKIP_OPS=attention 128) | tg1024 $(step_ms KILN_CUDA_SKIP_OPS=attention 1024)"
for v in "${variants[@]}"; do
  echo "[${v:-default}] tg128 $(step_ms "$v" 128) | tg1024 $(step_ms "$v" 1024)"
done
timeout 120 "$K" bench -m "$M" -p 512 -n 128 -r 3 --device cuda 2>&1 | grep -E "tg128|pp512"
