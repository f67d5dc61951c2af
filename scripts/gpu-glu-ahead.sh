#!/bin/bash
# Why the interleaved gate / up launch gains from items ahead for q4_K and loses for q4_0
# (docs/perf-notes.md, round 24): on one GPU, build kiln, make Llama-3-8B Q4_0 and Q4_K_M
# files, then for each model with KILN_CUDA_GLU_AHEAD=0 and 2: the step time (two rounds,
# alternating), and Nsight Compute's memory throughput, issue figures and stall hints of four glu
# launches of the third decode step. Carry .devicedeps; logs under $OUT.
set -u -o pipefail
OUT=${OUT:-/tmp/kiln-gpu-out}
SRC=${KILN_SRC:-.}
B=${KILN_BUILD:-/tmp/kiln-glu-ahead-build}
mkdir -p "$OUT" /tmp/deps && for f in .devicedeps/*.deb; do dpkg -x "$f" /tmp/deps; done
cmake -S "$SRC" -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DKILN_PCRE2_ROOT=/tmp/deps/usr -DKILN_SERVER=OFF -DKILN_BENCH=OFF -DKILN_TESTS=OFF > "$OUT/configure.log" 2>&1 || exit 1
timeout 300 cmake --build "$B" --target kiln -j16 > "$OUT/build.log" 2>&1 \
  || { grep -E " error|FAILED" "$OUT/build.log" | head -20; exit 1; }
K=$B/src/kiln
for type in q4_0 q4_K_M; do
  timeout 120 "$K" synth --preset llama3-8b --type $type --fast -o /tmp/glu-$type.gguf > /dev/null 2>&1 || exit 1
done
for round in 1 2; do
  for type in q4_0 q4_K_M; do
    for ahead in 0 2; do
      echo "$type ahead $ahead round $round: $(KILN_CUDA_GLU_AHEAD=$ahead KILN_CUDA_STEP_TIMING=1 timeout 60 "$K" bench \
        -m /tmp/glu-$type.gguf -p 0 -n 128 -r 2 --device cuda 2>&1 | grep -o '[0-9.]* ms of GPU time' | head -1)" \
        | tee -a "$OUT/step-times.txt"
    done
  done
done
ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1 || echo ncu)
for type in q4_0 q4_K_M; do
  for ahead in 0 2; do
    # 32 glu launches a step: skip two steps, profile four launches of the third.
    KILN_CUDA_GLU_AHEAD=$ahead timeout 120 "$ncu_bin" --clock-control none --kernel-name regex:'matvec_glu_kernel' \
      --launch-skip 64 --launch-count 4 --section SpeedOfLight --section MemoryWorkloadAnalysis \
      --section WarpStateStats --section Occupancy --section LaunchStats \
      "$K" bench -m /tmp/glu-$type.gguf -p 0 -n 4 -r 1 --device cuda > "$OUT/ncu-$type-ahead$ahead.txt" 2>&1
    echo "== $type, KILN_CUDA_GLU_AHEAD=$ahead (ncu exit $?)"
    grep -E "Duration|DRAM Throughput|Memory Throughput|Issue Slots Busy|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|stalled" \
      "$OUT/ncu-$type-ahead$ahead.txt" | sed -E 's/ +/ /g' | head -24
  done
done
rm -f /tmp/glu-q4_0.gguf /tmp/glu-q4_K_M.gguf
