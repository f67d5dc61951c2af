#!/bin/bash
# The prefill layer's small ops on one GPU: router_logits (KILN_CUDA_PREFILL_ROUTER) and
# rope_store_rows (KILN_CUDA_PREFILL_ROPE_STORE). The whole of test_cuda, then a Qwen3-30B-A3B
# Q4_K_M prefill with both paths new / old in turn (pp512), the prefill op profiles of both
# (per-layer view by prefill_op_layers.py), and a Llama-3-8B Q4_0 pp512 with the rope path
# new / old (its rope_kv_store takes rope_store_rows too).
#
# Binaries: $KILN_BIN/kiln.gz and $KILN_BIN/test_cuda.gz when given (built elsewhere for
# sm_90), else a build of $KILN_SRC (carry .devicedeps). Carry .device-testdata; logs under $OUT.
set -u -o pipefail
OUT=${OUT:-/tmp/kiln-gpu-out}
SRC=${KILN_SRC:-.}
B=${KILN_BUILD:-/tmp/kiln-small-ops-build}
t0=$(date +%s)
say() { echo "[+$(($(date +%s) - t0))s] $*"; }
mkdir -p "$OUT" "$B/src" "$B/tests"
if [ -n "${KILN_BIN:-}" ]; then
  gunzip -c "$KILN_BIN/kiln.gz" > "$B/src/kiln" && gunzip -c "$KILN_BIN/test_cuda.gz" > "$B/tests/test_cuda" || exit 1
  chmod +x "$B/src/kiln" "$B/tests/test_cuda"
else
  mkdir -p /tmp/deps && for f in .devicedeps/*.deb; do dpkg -x "$f" /tmp/deps; done
  cmake -S "$SRC" -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DKILN_PCRE2_ROOT=/tmp/deps/usr -DKILN_SERVER=OFF -DKILN_BENCH=OFF > "$OUT/configure.log" 2>&1 || exit 1
  timeout 300 cmake --build "$B" --target test_cuda kiln -j16 > "$OUT/build.log" 2>&1 ||
    { grep -E " error|FAILED" "$OUT/build.log" | head -20; exit 1; }
fi
say "binaries ready"
KILN_TESTDATA=${KILN_TESTDATA:-$PWD/.device-testdata} timeout 150 "$B/tests/test_cuda" > "$OUT/test_cuda.log" 2>&1
say "test_cuda exit $?"
grep -E "^\[  +(FAILED|PASSED|SKIPPED) +\] [0-9]|FAILED" "$OUT/test_cuda.log" | head -20
K=$B/src/kiln
timeout 100 "$K" synth --preset qwen3-30b-a3b --type q4_k_m --fast -o /tmp/moe.gguf > /dev/null 2>&1 || exit 1
say "moe model ready"
pp() { timeout 60 "$K" bench -m "$1" -p 512 -n 0 -r 3 --device cuda 2>&1 | grep pp512 | awk -F'|' '{print $(NF-1)}'; }
for arm in 1 0 1 0; do
  echo "moe ROUTER=$arm ROPE_STORE=$arm: $(KILN_CUDA_PREFILL_ROUTER=$arm KILN_CUDA_PREFILL_ROPE_STORE=$arm pp /tmp/moe.gguf)"
done
for arm in 1 0; do
  KILN_CUDA_PREFILL_ROUTER=$arm KILN_CUDA_PREFILL_ROPE_STORE=$arm KILN_CUDA_OP_TIMING=2 timeout 60 "$K" bench \
    -m /tmp/moe.gguf -p 512 -n 0 -r 1 --device cuda > "$OUT/moe-ops-$arm.log" 2>&1
done
python3 "$SRC/scripts/prefill_op_layers.py" "$OUT/moe-ops-1.log" "$OUT/moe-ops-0.log" > "$OUT/moe-ops-layers.txt" 2>&1
cat "$OUT/moe-ops-layers.txt"
rm -f /tmp/moe.gguf
say "moe done"
timeout 60 "$K" synth --preset llama3-8b --type q4_0 --fast -o /tmp/l.gguf > /dev/null 2>&1 || exit 1
for arm in 1 0 1 0; do echo "llama q4_0 ROPE_STORE=$arm: $(KILN_CUDA_PREFILL_ROPE_STORE=$arm pp /tmp/l.gguf)"; done
rm -f /tmp/l.gguf
say done
