#!/bin/bash
# The CUDA backend on a GPU machine, in one run: builds test_cuda and kiln, runs the
# backend's op tests and the architecture reference tests on the GPU, then measures
# `kiln bench -p 512 -n 128` on a synthetic Llama-3-8B of each weight type given.
# Run from the repository root, with .devicedeps and .device-testdata carried:
#
#   mkdir -p .device-testdata/arch && cp ../shared/testdata/arch/*.{gguf,f32,json} .device-testdata/arch/
#   scripts/gpu-model-check.sh [types...]     (default: q4_0)
#
# Logs land under $OUT; the last lines printed are the test summary and the bench tables.
set -u -o pipefail
OUT=${OUT:-/tmp/kiln-gpu-out}
BUILD=${KILN_GPU_BUILD:-/tmp/kiln-build}
types=("$@")
[ ${#types[@]} -eq 0 ] && types=(q4_0)
mkdir -p "$OUT"
t0=$(date +%s)
stamp() { echo "[gpu-model-check +$(( $(date +%s) - t0 ))s] $*"; }

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader
mkdir -p /tmp/deps && for f in .devicedeps/*.deb; do dpkg -x "$f" /tmp/deps; done
stamp configure
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DKILN_PCRE2_ROOT=/tmp/deps/usr -DKILN_SERVER=OFF -DKILN_BENCH=OFF > "$OUT/configure.log" 2>&1 \
  || { tail -40 "$OUT/configure.log"; exit 1; }
stamp build
timeout 300 cmake --build "$BUILD" --target test_cuda kiln -j16 > "$OUT/build.log" 2>&1 \
  || { grep -E "error|FAILED" "$OUT/build.log" | head -40; tail -5 "$OUT/build.log"; exit 1; }
stamp built

export KILN_TESTDATA=$PWD/.device-testdata
timeout 150 "$BUILD/tests/test_cuda" --gtest_filter='BackendOps*:Arch/CudaArch*' > "$OUT/test_backend.log" 2>&1
status=$?
grep -E "^\[  (FAILED|PASSED|SKIPPED) |tests? ran|Failure|outside tolerance|differ|\[ cuda " "$OUT/test_backend.log" | head -80
stamp "backend tests exit $status"

for type in "${types[@]}"; do
  model=/tmp/llama3-8b-$type.gguf
  timeout 120 "$BUILD/src/kiln" synth --preset llama3-8b --type "$type" -o "$model" > "$OUT/synth-$type.log" 2>&1 \
    || { echo "synth $type failed:"; tail -5 "$OUT/synth-$type.log"; continue; }
  stamp "synth $type done"
  timeout 150 "$BUILD/src/kiln" bench -m "$model" -p 512 -n 128 -r 3 --device cuda 2>&1 | tee "$OUT/bench-$type.log"
  stamp "bench $type exit $?"
  if [ "$type" = "${types[0]}" ]; then  # the same without step graphs: what replay saves
    KILN_CUDA_GRAPHS=0 timeout 100 "$BUILD/src/kiln" bench -m "$model" -p 0 -n 128 -r 3 --device cuda 2>&1 \
      | tee "$OUT/bench-$type-nographs.log"
  fi
  rm -f "$model"
done
exit $status
