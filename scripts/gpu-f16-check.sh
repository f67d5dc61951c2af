#!/bin/bash
# One GPU-machine run for the f16 / bf16 decode path: build, the CUDA tests (all of
# test_cuda by default: the new kernel's, the fused ops' and the architecture references),
# the kernel benchmark of the f16 matvecs, then a synthetic Llama-3-8B F16 model:
# `kiln bench -p 512 -n 128 -r 3`, decode again with the fused paths off (KILN_CUDA_FUSED=0,
# the composed ops), GPU time per decode step and a per-op profile of decode. Each step has
# its own time limit; logs go to $OUT.
#
#   scripts/gpu-f16-check.sh [source dir] [test filter]
# Needs .devicedeps (PCRE2 packages) carried; reference data from $KILN_TESTDATA.
set -u -o pipefail
SRC=${1:-.}
FILTER=${2:-'*'}
OUT=${OUT:-/tmp/kiln-gpu-out}
mkdir -p "$OUT"
t0=$(date +%s)
say() { echo "[+$(( $(date +%s) - t0 ))s] $*"; }

mkdir -p /tmp/deps && for f in .devicedeps/*.deb; do dpkg -x "$f" /tmp/deps; done
B=/tmp/kiln-f16-build
cmake -S "$SRC" -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DKILN_PCRE2_ROOT=/tmp/deps/usr -DKILN_SERVER=OFF -DKILN_BENCH=ON > "$OUT/build.log" 2>&1 \
  || { tail -20 "$OUT/build.log"; exit 1; }
timeout 300 cmake --build $B --target test_cuda kiln bench_cuda_kernels_bench -j16 >> "$OUT/build.log" 2>&1 \
  || { grep -E "error|FAILED" "$OUT/build.log" | head -20; exit 1; }
say built
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader

timeout 200 $B/tests/test_cuda --gtest_filter="$FILTER" > "$OUT/test_cuda.log" 2>&1
say "test_cuda exit $?"
grep -E "^\[  (FAILED|PASSED) |tests? ran|Failure|outside tolerance|differ|tiny256" "$OUT/test_cuda.log" | head -30

timeout 90 $B/bench/bench_cuda_kernels_bench --matvec-f16 > "$OUT/kernels.log" 2>&1
say "kernel bench exit $?"
grep -E "copy|matvec" "$OUT/kernels.log"

K=$B/src/kiln
M=/tmp/llama3-8b-f16.gguf
df -h /tmp | tail -1
timeout 150 $K synth --preset llama3-8b --type f16 --fast -o $M > "$OUT/synth.log" 2>&1 || { say "synth failed"; tail -3 "$OUT/synth.log"; exit 1; }
say synth
run_bench() {  # label, then the bench arguments; environment from the caller
  echo "== $1" >> "$OUT/bench.log"
  shift
  timeout 120 $K bench -m $M "$@" --device cuda >> "$OUT/bench.log" 2>&1
  say "bench exit $?"
  tail -4 "$OUT/bench.log" | grep -E "pp512|tg128"
}
run_bench "default" -p 512 -n 128 -r 3
KILN_CUDA_FUSED=0 run_bench "KILN_CUDA_FUSED=0" -p 0 -n 128 -r 3
KILN_CUDA_STEP_TIMING=1 timeout 60 $K bench -m $M -p 0 -n 128 -r 1 --device cuda > "$OUT/steptime.log" 2>&1
say "step timing exit $?"
grep -E "graph replays" "$OUT/steptime.log" | tail -1
KILN_CUDA_OP_TIMING=1 timeout 60 $K bench -m $M -p 0 -n 16 -r 1 --device cuda > "$OUT/optime.log" 2>&1
say "op timing exit $?"
grep "per-op" "$OUT/optime.log" | tail -1
# One late layer's ops, then the totals per op name over the pass.
grep "^  op " "$OUT/optime.log" | tail -12
grep "^  op " "$OUT/optime.log" | awk '{s[$3] += $4; n[$3]++} END {for (k in s) printf "%-22s %4d ops %9.1f us\n", k, n[k], s[k]}'
