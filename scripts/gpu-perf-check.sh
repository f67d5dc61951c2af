#!/bin/bash
# One device call for decode-speed work: CUDA tests, the kernel benchmark (quick) and
# `kiln bench -p 512 -n 128 -r 3` on synthetic Llama-3-8B models, logs under $OUT.
# Runs binaries built on the development machine when they are carried as
# $KILN_BIN_TGZ (default .cudaperf-bin/bin.tgz) (kiln, test_cuda, bench_cuda_kernels_bench and the shared libraries
# they need that the GPU image lacks); otherwise builds them here. Carry .device-testdata
# (see gpu-model-check.sh) for the architecture tests and .devicedeps for a build.
#
#   scripts/gpu-perf-check.sh [types...]     (default: q4_0 q8_0)
set -u -o pipefail
OUT=${OUT:-/tmp/kiln-gpu-out}
types=("$@")
[ ${#types[@]} -eq 0 ] && types=(q4_0 q8_0)
mkdir -p "$OUT"
t0=$(date +%s)
stamp() { echo "[gpu-perf-check +$(( $(date +%s) - t0 ))s] $*"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader

BIN=/tmp/kiln-bin
mkdir -p "$BIN"
export LD_LIBRARY_PATH=$BIN:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
BIN_TGZ=${KILN_BIN_TGZ:-.cudaperf-bin/bin.tgz}
if [ -f "$BIN_TGZ" ]; then tar xzf "$BIN_TGZ" -C "$BIN"; fi
if ! "$BIN/test_cuda" --gtest_list_tests > /dev/null 2> "$OUT/carried.err"; then
  stamp "carried binaries do not run ($(head -c 200 "$OUT/carried.err")); building"
  mkdir -p /tmp/deps && for f in .devicedeps/*.deb; do dpkg -x "$f" /tmp/deps; done
  B=/tmp/kiln-build
  cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DKILN_PCRE2_ROOT=/tmp/deps/usr -DKILN_SERVER=OFF > "$OUT/configure.log" 2>&1 || { tail -20 "$OUT/configure.log"; exit 1; }
  timeout 400 cmake --build $B --target test_cuda kiln bench_cuda_kernels_bench -j16 > "$OUT/build.log" 2>&1 \
    || { grep -E "error|FAILED" "$OUT/build.log" | head -20; exit 1; }
  cp $B/tests/test_cuda $B/src/kiln $B/bench/bench_cuda_kernels_bench "$BIN/"
fi
stamp ready

export KILN_TESTDATA=$PWD/.device-testdata
timeout 200 "$BIN/test_cuda" > "$OUT/test_cuda.log" 2>&1
status=$?
grep -E "^\[  (FAILED|PASSED|SKIPPED) |tests? ran|Failure|outside tolerance|differ" "$OUT/test_cuda.log" | head -40
stamp "test_cuda exit $status"

bench_model() {
  local type=$1 model=/tmp/llama3-8b-$1.gguf
  timeout 120 "$BIN/kiln" synth --preset llama3-8b --type "$type" -o "$model" > "$OUT/synth-$type.log" 2>&1 \
    || { echo "synth $type failed:"; tail -3 "$OUT/synth-$type.log"; return; }
  stamp "synth $type done"
  timeout 120 "$BIN/kiln" bench -m "$model" -p 512 -n 128 -r 3 --device cuda > "$OUT/bench-$type.log" 2>&1
  stamp "bench $type exit $?"
  # The same without the fused decode paths (KILN_CUDA_FUSED=0), decode only: the A/B.
  KILN_CUDA_FUSED=0 timeout 60 "$BIN/kiln" bench -m "$model" -p 0 -n 128 -r 3 --device cuda \
    > "$OUT/bench-$type-unfused.log" 2>&1
  stamp "bench $type unfused exit $?"
  KILN_CUDA_GRAPH_PIECES=96 timeout 60 "$BIN/kiln" bench -m "$model" -p 0 -n 128 -r 3 --device cuda \
    > "$OUT/bench-$type-pieces.log" 2>&1
  stamp "bench $type graphs of 96 ops exit $?"
  rm -f "$model"
}
bench_model "${types[0]}"
timeout 150 "$BIN/bench_cuda_kernels_bench" --quick > "$OUT/kernels.log" 2>&1
stamp "kernel bench exit $?"
for type in "${types[@]:1}"; do bench_model "$type"; done

echo "== kernels =="
sed -n '/== summary/,$p' "$OUT/kernels.log" | grep -E "copy|matvec|quantize|attention|rmsnorm|argmax" | head -60
echo "== kiln bench =="
for type in "${types[@]}"; do grep -E "^\|" "$OUT/bench-$type.log"; grep -E "tg" "$OUT/bench-$type-unfused.log" | sed 's/$/ (unfused)/'
  grep -E "tg" "$OUT/bench-$type-pieces.log" | sed 's/$/ (graphs of 96 ops)/'; done
exit $status
