#!/bin/bash
# Decode attention variants in the chained decode graph: for each setting of the measurement
# switches of backend/cuda/attention.cu (KILN_CUDA_ATTN_CLUSTER, _MIN_KEYS, _PREFETCH), the
# GPU time of a decode step (KILN_CUDA_STEP_TIMING=1, one graph replay) at decode contexts
# ~16-144 (-p 16) and ~512-640 (-p 512), then tg128 of `kiln bench -p 512 -n 128 -r 3`.
# A step with attention left out (KILN_CUDA_SKIP_OPS=attention) gives what attention costs.
#
#   scripts/gpu-attention-variants.sh path/to/kiln model.gguf
set -u -o pipefail
[ $# -eq 2 ] || { echo "usage: $0 KILN MODEL" >&2; exit 2; }
K=$1
M=$2
variants=(
  "KILN_CUDA_ATTN_CLUSTER=0 KILN_CUDA_ATTN_PREFETCH=0"
  "KILN_CUDA_ATTN_PREFETCH=0"
  "KILN_CUDA_ATTN_MIN_KEYS=64"
  ""
)
step_ms() {  # env settings, prompt length
  env $1 KILN_CUDA_STEP_TIMING=1 timeout 120 "$K" bench -m "$M" -p "$2" -n 128 -r 1 --device cuda 2>&1 |
    grep -o "[0-9.]* ms of GPU time" | head -1
}
tg128() {
  env $1 timeout 120 "$K" bench -m "$M" -p 512 -n 128 -r 3 --device cuda 2>&1 | grep -E "tg128|pp512" | tr -s ' ' | tr '\n' ' '
}
echo "without attention: p16 $(step_ms KILN_CUDA_SKIP_OPS=attention 16) | p512 $(step_ms KILN_CUDA_SKIP_OPS=attention 512)"
for v in "${variants[@]}"; do
  echo "[${v:-default}] p16 $(step_ms "$v" 16) | p512 $(step_ms "$v" 512)"
done
for v in "${variants[@]}"; do
  echo "[${v:-default}] $(tg128 "$v")"
done
