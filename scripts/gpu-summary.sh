#!/bin/bash
# One GPU-machine run that yields the figures docs/perf-notes.md summarises: build kiln and
# test_cuda, run the CUDA tests, then `kiln bench -p 512 -n 128` on synthetic Llama-3-8B
# models of each dense type and on the Qwen3-30B-A3B shape. Every step has its own time
# limit and appends to $OUT/summary.log, so a run cut short still reports what it finished.
# Needs .devicedeps (PCRE2 packages) and .device-testdata (see gpu-model-check.sh) carried.
#
#   scripts/gpu-summary.sh [dense types...]      (default: q4_0 q8_0 f16 q4_k_m)
set -u -o pipefail
OUT=${OUT:-/tmp/kiln-gpu-out}
mkdir -p "$OUT"
LOG=$OUT/summary.log
types=("$@")
[ ${#types[@]} -eq 0 ] && types=(q4_0 q8_0 f16 q4_k_m)
t0=$(date +%s)
say() { echo "[+$(( $(date +%s) - t0 ))s] $*" | tee -a "$LOG"; }

mkdir -p /tmp/deps && for f in .devicedeps/*.deb; do dpkg -x "$f" /tmp/deps; done
B=/tmp/kiln-build
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DKILN_PCRE2_ROOT=/tmp/deps/usr -DKILN_SERVER=OFF -DKILN_BENCH=OFF > "$OUT/configure.log" 2>&1 \
  || { tail -20 "$OUT/configure.log"; exit 1; }
timeout 300 cmake --build $B --target test_cuda kiln -j16 > "$OUT/build.log" 2>&1 \
  || { grep -E "error|FAILED" "$OUT/build.log" | head -20 | tee -a "$LOG"; exit 1; }
say "built"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$LOG"

KILN_TESTDATA=$PWD/.device-testdata timeout 120 $B/tests/test_cuda > "$OUT/test_cuda.log" 2>&1
say "test_cuda exit $?"
grep -E "^\[  (FAILED|PASSED|SKIPPED) |tests? ran" "$OUT/test_cuda.log" | head -30 | tee -a "$LOG"

K=$B/src/kiln
bench() {  # preset type repetitions
  local model=/tmp/$1-$2.gguf
  timeout 150 $K synth --preset "$1" --type "$2" --fast -o "$model" > /dev/null 2>&1 || { say "synth $1 $2 failed"; return; }
  say "synth $1 $2"
  timeout 120 $K bench -m "$model" -p 512 -n 128 -r "$3" --device cuda 2>&1 | grep -E "pp512|tg128" | tee -a "$LOG"
  rm -f "$model"
}
for t in "${types[@]}"; do
  [ "$t" = q4_k_m ] && continue
  bench llama3-8b "$t" 3
done
bench qwen3-30b-a3b q8_0 2
for t in "${types[@]}"; do
  [ "$t" = q4_k_m ] && bench llama3-8b q4_k_m 3 && bench qwen3-30b-a3b q4_k_m 2
done
say "done"
