#!/bin/bash
# What each decode op costs inside the chained graph: the GPU time of a decode step (one
# graph replay, KILN_CUDA_STEP_TIMING=1) with every op, then with one op name left out at a
# time (KILN_CUDA_SKIP_OPS: the results are wrong, the timing is the point). Eager op timing
# (KILN_CUDA_OP_TIMING=1) over-counts small kernels; this does not.
#
#   scripts/gpu-op-costs.sh path/to/kiln model.gguf [op names...]
#
# Op names as KILN_CUDA_OP_TIMING prints them; by default a llama/qwen decode layer's.
set -u -o pipefail
[ $# -ge 2 ] || { echo "usage: $0 KILN MODEL [op names...]" >&2; exit 2; }
K=$1
M=$2
shift 2
ops=("$@")
[ ${#ops[@]} -eq 0 ] && ops=(qkv_rope_kv_store rope_kv_store norm_rope_kv_store attention matmul_parts rmsnorm_matmul_parts gate_up_glu glu rope_table)
step_ms() {
  KILN_CUDA_STEP_TIMING=1 KILN_CUDA_SKIP_OPS="$1" timeout 120 "$K" bench -m "$M" -p 16 -n 128 -r 2 --device cuda 2>&1 |
    grep -o "[0-9.]* ms of GPU time" | head -1
}
echo "every op: $(step_ms "")"
for op in "${ops[@]}"; do echo "without $op: $(step_ms "$op")"; done
