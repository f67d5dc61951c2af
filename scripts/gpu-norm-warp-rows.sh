#!/bin/bash
# Prefill's small ops on one GPU: the warp-per-row rmsnorm (head norms) and the MoE prefill
# combine taking the residual add. The whole of test_cuda, the MoE and architecture tests
# again with tile engine v7 (KILN_CUDA_MOE_PREFILL_V=7, the candidate default), then a
# Qwen3-30B-A3B Q4_K_M prefill with KILN_CUDA_NORM_WARP_ROWS=0 / default in turn (pp512 and
# the prefill op profiles). Carry .devicedeps and .device-testdata; logs under $OUT.
set -u -o pipefail
OUT=${OUT:-/tmp/kiln-gpu-out}
SRC=${KILN_SRC:-.}
B=${KILN_BUILD:-/tmp/kiln-normrows-build}
mkdir -p "$OUT" /tmp/deps && for f in .devicedeps/*.deb; do dpkg -x "$f" /tmp/deps; done
cmake -S "$SRC" -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DKILN_PCRE2_ROOT=/tmp/deps/usr -DKILN_SERVER=OFF -DKILN_BENCH=OFF > "$OUT/configure.log" 2>&1 || exit 1
timeout 300 cmake --build "$B" --target test_cuda kiln -j16 > "$OUT/build.log" 2>&1 \
  || { grep -E " error|FAILED" "$OUT/build.log" | head -20; exit 1; }
KILN_TESTDATA=${KILN_TESTDATA:-$PWD/.device-testdata} timeout 150 "$B/tests/test_cuda" > "$OUT/test_cuda.log" 2>&1
echo "test_cuda exit $?"
grep -E "^\[  +(FAILED|PASSED|SKIPPED) +\] [0-9]|FAILED" "$OUT/test_cuda.log" | head -20
KILN_CUDA_MOE_PREFILL_V=7 KILN_TESTDATA=${KILN_TESTDATA:-$PWD/.device-testdata} timeout 100 "$B/tests/test_cuda" \
  --gtest_filter='*Moe*:*moe*:*Arch*' > "$OUT/test_cuda_v7.log" 2>&1
echo "MoE + arch tests with tile engine v7: exit $?"
grep -E "^\[  +(FAILED|PASSED|SKIPPED) +\] [0-9]|FAILED" "$OUT/test_cuda_v7.log" | head -10
K=$B/src/kiln
timeout 100 "$K" synth --preset qwen3-30b-a3b --type q4_k_m --fast -o /tmp/moe.gguf > /dev/null 2>&1 || exit 1
for arm in 0 1 0 1; do
  echo "KILN_CUDA_NORM_WARP_ROWS=$arm: $(KILN_CUDA_NORM_WARP_ROWS=$arm timeout 60 "$K" bench -m /tmp/moe.gguf -p 512 -n 0 -r 3 --device cuda 2>&1 | grep pp512)"
done
for arm in 0 1; do
  KILN_CUDA_NORM_WARP_ROWS=$arm KILN_CUDA_OP_TIMING=2 timeout 60 "$K" bench -m /tmp/moe.gguf -p 512 -n 0 -r 1 --device cuda \
    > "$OUT/prefill-ops-$arm.log" 2>&1
  echo "op profile, KILN_CUDA_NORM_WARP_ROWS=$arm: $(grep -c rmsnorm "$OUT/prefill-ops-$arm.log") rmsnorm lines (see the log)"
done
rm -f /tmp/moe.gguf
