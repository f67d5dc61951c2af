#!/bin/bash
# On a GPU machine: the MoE tests, the architecture references, and `kiln bench` on the
# synthetic Qwen3-30B-A3B in the given types. Uses the binaries in $KILN_BIN_TGZ (kiln,
# test_cuda and the shared libraries the GPU image lacks) when they run there; otherwise
# builds them from $KILN_SRC (default: this checkout) with .devicedeps carried.
# Logs land under $OUT.
#
#   scripts/gpu-moe-check.sh [types...]     (default: q8_0 q4_k_m)
#
# The models are synthesized with --fast (a pool of quantized rows): seconds for either type.
set -u -o pipefail
OUT=${OUT:-/tmp/kiln-gpu-out}
SRC=${KILN_SRC:-.}
types=("$@")
[ ${#types[@]} -eq 0 ] && types=(q8_0 q4_k_m)
mkdir -p "$OUT"
t0=$(date +%s)
stamp() { echo "[gpu-moe-check +$(( $(date +%s) - t0 ))s] $*"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader

BIN=/tmp/kiln-bin
mkdir -p "$BIN"
export LD_LIBRARY_PATH=$BIN:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
if [ -n "${KILN_BIN_TGZ:-}" ] && [ -f "$KILN_BIN_TGZ" ]; then tar xzf "$KILN_BIN_TGZ" -C "$BIN"; fi
if ! "$BIN/test_cuda" --gtest_list_tests > /dev/null 2> "$OUT/carried.err"; then
  stamp "carried binaries do not run ($(head -c 200 "$OUT/carried.err")); building"
  mkdir -p /tmp/deps && for f in .devicedeps/*.deb; do dpkg -x "$f" /tmp/deps; done
  B=/tmp/kiln-build
  cmake -S "$SRC" -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DKILN_PCRE2_ROOT=/tmp/deps/usr -DKILN_SERVER=OFF -DKILN_BENCH=OFF > "$OUT/configure.log" 2>&1 \
    || { tail -20 "$OUT/configure.log"; exit 1; }
  timeout 400 cmake --build $B --target test_cuda kiln -j16 > "$OUT/build.log" 2>&1 \
    || { grep -E "error|FAILED" "$OUT/build.log" | head -20; exit 1; }
  cp $B/tests/test_cuda $B/src/kiln "$BIN/"
fi
# The MoE kernel benchmark comes only with carried binaries (a KILN_BENCH build).
stamp ready

export KILN_TESTDATA=${KILN_TESTDATA:-$PWD/.device-testdata}
timeout 200 "$BIN/test_cuda" --gtest_filter="${KILN_TEST_FILTER:-*Moe*:*moe*:*CudaArch*:*BackendOps*}" \
  > "$OUT/test_cuda.log" 2>&1
echo "test_cuda exit $?"
grep -E "^\[  (FAILED|PASSED|SKIPPED) |tests? ran|Failure|outside tolerance|differ:|^  \[" "$OUT/test_cuda.log" | head -40
stamp tests
if [ -x "$BIN/bench_cuda_moe_bench" ]; then
  timeout 120 "$BIN/bench_cuda_moe_bench" 2>&1 | tee "$OUT/moe_bench.log"
  stamp "moe kernel bench"
fi

for t in "${types[@]}"; do
  m=/tmp/moe-$t.gguf
  timeout "${KILN_SYNTH_TIMEOUT:-120}" "$BIN/kiln" synth --preset qwen3-30b-a3b --type "$t" --fast -o "$m" > "$OUT/synth-$t.log" 2>&1 \
    || { echo "synth $t failed"; tail -5 "$OUT/synth-$t.log"; continue; }
  stamp "synth $t"
  timeout 240 "$BIN/kiln" bench -m "$m" -p 512 -n 128 -r "${KILN_BENCH_REPS:-2}" --device cuda 2>&1 \
    | tee "$OUT/bench-$t.log" | tail -6
  rm -f "$m"
  stamp "bench $t"
done
