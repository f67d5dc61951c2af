#!/bin/bash
# Builds kiln's CUDA kernels, their tests and benchmarks on a GPU machine and runs
# them in one go; every log lands under $OUT (default /tmp/kiln-gpu-out).
# Run from the repository root, with .devicedeps carried (see ../shared/tools/device-deps.sh):
#
#   scripts/gpu-check.sh [all|test|bench] [extra gtest filter]
#
# Steps are time-boxed so that the call ends well inside its limit; the last lines printed
# are the test summary and the benchmark table.
set -u -o pipefail
what=${1:-all}
filter=${2:-*}
OUT=${OUT:-/tmp/kiln-gpu-out}
BUILD=${KILN_GPU_BUILD:-/tmp/kiln-build}
mkdir -p "$OUT"
t0=$(date +%s)
stamp() { echo "[gpu-check +$(( $(date +%s) - t0 ))s] $*"; }

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw \
  --format=csv > "$OUT/nvidia-smi.csv" 2>&1
cat "$OUT/nvidia-smi.csv"

# PCRE2 headers and the static library, which the GPU machine's image lacks.
mkdir -p /tmp/deps && for f in .devicedeps/*.deb; do dpkg -x "$f" /tmp/deps; done

stamp configure
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DKILN_PCRE2_ROOT=/tmp/deps/usr -DKILN_SERVER=OFF > "$OUT/configure.log" 2>&1 \
  || { tail -40 "$OUT/configure.log"; exit 1; }
stamp build
timeout 420 cmake --build "$BUILD" --target test_cuda -j16 > "$OUT/build.log" 2>&1 \
  || { grep -E "error|FAILED" "$OUT/build.log" | head -40; tail -5 "$OUT/build.log"; exit 1; }
if [ "$what" != test ]; then
  timeout 120 cmake --build "$BUILD" --target bench_cuda_kernels_bench -j16 >> "$OUT/build.log" 2>&1 \
    || { echo "benchmark build failed:"; grep -E "error|FAILED" "$OUT/build.log" | head -20; }
fi
stamp built

status=0
if [ "$what" != bench ]; then
  stamp tests
  timeout 240 "$BUILD/tests/test_cuda" --gtest_filter="$filter" > "$OUT/test_cuda.log" 2>&1
  status=$?
  grep -E "^\[  (FAILED|PASSED|SKIPPED) |tests? ran|Failure|outside tolerance|differ:|^  \[" "$OUT/test_cuda.log" | head -60
  stamp "tests exit $status"
fi
if [ "$what" != bench ] && [ "${SANITIZE:-0}" = 1 ]; then
  # Out-of-bounds and shared-memory race checks on small cases of each kernel family.
  sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  small='*PaddedRows*q4_0:*PaddedRows*q6_K:*PaddedRows*mxfp4:*PaddedRows*f16:QuantizeQ8*:*GatherRows*q5_K*'
  small="$small:*GemmTest*q4_K*:CudaDecodeAttention.GqaF16Cache:CudaDecodeAttention.Sinks*:CudaRope*:CudaArgmax*:CudaGlu*"
  stamp memcheck
  timeout 150 "$sanitizer" --tool memcheck "$BUILD/tests/test_cuda" --gtest_filter="$small" > "$OUT/memcheck.log" 2>&1
  stamp "memcheck exit $?: $(grep -E 'ERROR SUMMARY' "$OUT/memcheck.log" | tail -1)"
  stamp racecheck
  timeout 120 "$sanitizer" --tool racecheck "$BUILD/tests/test_cuda" \
    --gtest_filter='*PaddedRows*q4_K:CudaDecodeAttention.Sinks*:CudaArgmax*' > "$OUT/racecheck.log" 2>&1
  stamp "racecheck exit $?: $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/racecheck.log" | tail -1)"
fi
if [ "$what" != test ] && [ -x "$BUILD/bench/bench_cuda_kernels_bench" ]; then
  stamp bench
  timeout 240 "$BUILD/bench/bench_cuda_kernels_bench" > "$OUT/bench.log" 2>&1
  stamp "bench exit $?"
  sed -n '/== summary/,$p' "$OUT/bench.log"
fi
if [ "${PROFILE:-0}" = 1 ] && [ -x "$BUILD/bench/bench_cuda_kernels_bench" ]; then
  # Hardware counters of the matvec and attention kernels (clocks left alone).
  ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1 || echo ncu)
  stamp ncu
  timeout 150 "$ncu_bin" --clock-control none --kernel-name regex:'matvec_q8_kernel|attention_kernel' \
    --launch-count 6 --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
    --section WarpStateStats --section Occupancy --section LaunchStats \
    "$BUILD/bench/bench_cuda_kernels_bench" --profile > "$OUT/ncu.txt" 2>&1
  stamp "ncu exit $?"
  grep -E "matvec_q8_kernel|attention_kernel|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Duration|Achieved Occupancy|Issue Slots Busy|Registers Per|Waves Per SM|L1/TEX Hit|Mem Busy|Max Bandwidth|Stall" "$OUT/ncu.txt" | head -80
fi
nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv >> "$OUT/nvidia-smi.csv" 2>&1
stamp done
exit $status
