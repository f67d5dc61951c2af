#!/bin/bash
# One GPU-machine run for the f16 / bf16 decode path: build, the CUDA tests that cover it
# (and the architecture references), the kernel benchmark of the f16 matvecs, then a
# synthetic Llama-3-8B F16 model: `kiln bench -p 512 -n 128 -r 3`, the same decode with the
# fused paths off (KILN_CUDA_FUSED=0, the composed ops) and with other L2 prefetch sizes
# (PREFETCH_AB, bytes per warp), GPU time per decode step and a per-op profile of decode.
# Each step has its own time limit; logs go to $OUT.
#
#   scripts/gpu-f16-check.sh [source dir] [test filter]
# Needs .devicedeps (PCRE2 packages) carried; reference data from $KILN_TESTDATA.
set -u -o pipefail
SRC=${1:-.}
FILTER=${2:-'MatvecHalfGrouped.*:FusedHalf*:FusedOps.*:CudaArchReference.*:*LlamaShapes*'}
OUT=${OUT:-/tmp/kiln-gpu-out}
mkdir -p "$OUT"
t0=$(date +%s)
say() { echo "[+$(( $(date +%s) - t0 ))s] $*"; }

mkdir -p /tmp/deps && for f in .devicedeps/*.deb; do dpkg -x "$f" /tmp/deps; done
B=/tmp/kiln-f16-build
cmake -S "$SRC" -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DKILN_PCRE2_ROOT=/tmp/deps/usr -DKILN_SERVER=OFF -DKILN_BENCH=ON > "$OUT/configure.log" 2>&1 \
  || { tail -20 "$OUT/configure.log"; exit 1; }
timeout 300 cmake --build $B --target test_cuda kiln bench_cuda_kernels_bench -j16 > "$OUT/build.log" 2>&1 \
  || { grep -E "error|FAILED" "$OUT/build.log" | head -20; exit 1; }
say built
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader

timeout 150 $B/tests/test_cuda --gtest_filter="$FILTER" > "$OUT/test_cuda.log" 2>&1
say "test_cuda exit $?"
grep -E "^\[  (FAILED|PASSED|SKIPPED) |tests? ran|Failure|outside tolerance|differ|tiny256|max relative" \
  "$OUT/test_cuda.log" | head -40

timeout 90 $B/bench/bench_cuda_kernels_bench --matvec-f16 > "$OUT/kernels.log" 2>&1
say "kernel bench exit $?"
grep -E "copy|matvec" "$OUT/kernels.log"

K=$B/src/kiln
M=/tmp/llama3-8b-f16.gguf
timeout 150 $K synth --preset llama3-8b --type f16 --fast -o $M > "$OUT/synth.log" 2>&1 || { tail -5 "$OUT/synth.log"; exit 1; }
say synth
timeout 120 $K bench -m $M -p 512 -n 128 -r 3 --device cuda > "$OUT/bench.log" 2>&1
say "bench exit $?"
grep -E "pp512|tg128" "$OUT/bench.log"
KILN_CUDA_FUSED=0 timeout 60 $K bench -m $M -p 0 -n 128 -r 3 --device cuda > "$OUT/bench-unfused.log" 2>&1
say "bench, fused paths off, exit $?"
grep -E "tg128" "$OUT/bench-unfused.log"
for bytes in ${PREFETCH_AB:-0 16384}; do  # the L2 prefetch per warp against its default
  KILN_CUDA_HALF_PREFETCH=$bytes timeout 60 $K bench -m $M -p 0 -n 128 -r 3 --device cuda > "$OUT/bench-prefetch$bytes.log" 2>&1
  say "bench, KILN_CUDA_HALF_PREFETCH=$bytes, exit $?"
  grep -E "tg128" "$OUT/bench-prefetch$bytes.log"
done
KILN_CUDA_STEP_TIMING=1 timeout 60 $K bench -m $M -p 0 -n 128 -r 1 --device cuda > "$OUT/steptime.log" 2>&1
say "step timing exit $?"
grep -iE "step|ms" "$OUT/steptime.log" | tail -5
KILN_CUDA_OP_TIMING=1 timeout 60 $K bench -m $M -p 0 -n 16 -r 1 --device cuda > "$OUT/optime.log" 2>&1
say "op timing exit $?"
grep "per-op" "$OUT/optime.log" | tail -1
# One late layer's ops, then the totals per op name over the pass.
grep "^  op " "$OUT/optime.log" | tail -12
grep "^  op " "$OUT/optime.log" | awk '{s[$3] += $4; n[$3]++} END {for (k in s) printf "%-22s %4d ops %9.1f us\n", k, n[k], s[k]}'
