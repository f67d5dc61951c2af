#!/bin/bash
# MoE prefill tile engine v8 (the default) on one GPU, most important first: build; the
# grouped-GEMM parity tests (every engine, every type pair) with v8's two and three stages;
# the MoE and architecture tests; the kernel bench (q4_K, q4_K + q6_K; q4_K again with two
# stages); a Qwen3-30B-A3B Q4_K_M prefill with v7, v8 and v8 with two stages alternating
# (pp512); last, Nsight Compute on v8's two kernels under concentrated routing. Carry
# .devicedeps and .device-testdata; logs under $OUT.
set -u -o pipefail
OUT=${OUT:-/tmp/kiln-gpu-out}
SRC=${KILN_SRC:-.}
B=${KILN_BUILD:-/tmp/kiln-moe-v8-build}
TESTDATA=${KILN_TESTDATA:-$PWD/.device-testdata}
mkdir -p "$OUT" /tmp/deps && for f in .devicedeps/*.deb; do dpkg -x "$f" /tmp/deps; done
cmake -S "$SRC" -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DKILN_PCRE2_ROOT=/tmp/deps/usr -DKILN_SERVER=OFF -DKILN_BENCH=ON > "$OUT/configure.log" 2>&1 || exit 1
timeout 300 cmake --build "$B" --target test_cuda kiln bench_cuda_moe_bench -j16 > "$OUT/build.log" 2>&1 \
  || { grep -E " error|FAILED" "$OUT/build.log" | head -20; exit 1; }
summary() { grep -E "^\[  +(FAILED|PASSED|SKIPPED) +\] [0-9]|FAILED|Failure|mismatch" "$1" | head -12; }
for stages in 2 3; do
  KILN_CUDA_MOE_V8_STAGES=$stages KILN_TESTDATA=$TESTDATA timeout 90 "$B/tests/test_cuda" --gtest_filter='CudaMoeGemm.*' \
    > "$OUT/gemm_tests_$stages.log" 2>&1
  status=$?
  echo "CudaMoeGemm.* (v8 with $stages stages) exit $status"; summary "$OUT/gemm_tests_$stages.log"
  [ $status -eq 0 ] || exit 1
done
KILN_TESTDATA=$TESTDATA timeout 100 "$B/tests/test_cuda" --gtest_filter='*Moe*:*moe*:*Arch*' > "$OUT/arch_tests.log" 2>&1
echo "MoE + arch tests (default engine): exit $?"; summary "$OUT/arch_tests.log"
timeout 60 "$B/bench/bench_cuda_moe_bench" q4_K q4_K q4_K q6_K 2>&1 | grep prefill | sed -E 's/ +TFLOP.*//'
KILN_CUDA_MOE_V8_STAGES=2 timeout 60 "$B/bench/bench_cuda_moe_bench" q4_K q4_K 2>&1 | grep "prefill v8" \
  | sed -E 's/ +TFLOP.*/ (2 stages)/'
K=$B/src/kiln
timeout 100 "$K" synth --preset qwen3-30b-a3b --type q4_k_m --fast -o /tmp/moe.gguf > /dev/null 2>&1 || exit 1
for arm in 7:2 8:2 8:3 7:2 8:2 8:3; do
  v=${arm%:*} stages=${arm#*:}
  echo "v$v stages $stages: $(KILN_CUDA_MOE_PREFILL_V=$v KILN_CUDA_MOE_V8_STAGES=$stages timeout 60 "$K" bench \
    -m /tmp/moe.gguf -p 512 -n 0 -r 3 --device cuda 2>&1 | grep pp512 | sed -E 's/.*pp512 *\|//')"
done
rm -f /tmp/moe.gguf
# v8's kernels (gate/up, down) of the 6th concentrated-routing call (bench order: T=64, T=512
# uniform, T=512 concentrated, 23 calls each).
timeout 60 ncu --clock-control none --set full -k regex:'moe_(gate_up|down)_v8' --launch-skip 102 -c 2 \
  "$B/bench/bench_cuda_moe_bench" q4_K q4_K > "$OUT/ncu_v8_concentrated.txt" 2>&1
grep -E "moe_.*v8_kernel|Duration|Issue Slots Busy|DRAM Throughput|No Eligible|Registers Per|Achieved Occ" \
  "$OUT/ncu_v8_concentrated.txt" | sed -E 's/ +/ /g'
