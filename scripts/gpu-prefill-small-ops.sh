#!/bin/bash
# The prefill layer's small ops on one GPU: router_logits (KILN_CUDA_PREFILL_ROUTER=1, off by
# default; block placement KILN_CUDA_ROUTER_PLACEMENT), rope_store_rows (KILN_CUDA_PREFILL_ROPE_STORE) and
# mixed-type q/k/v parts (KILN_CUDA_PREFILL_MIXED_PARTS). The whole of test_cuda, then a
# Qwen3-30B-A3B Q4_K_M prefill with all new / all old in turn (pp512), an arm with mixed parts
# off, the prefill op profiles (router placements 2 and 1, and old; per-layer view by
# prefill_op_layers.py), pp512 with ops left out (KILN_CUDA_SKIP_OPS: what they cost in the
# pass), and a Llama-3-8B Q4_K_M pp512 with mixed parts on / off.
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
# pp512 of model $1 with the environment's assignments after it.
pp() { env "${@:2}" timeout 60 "$K" bench -m "$1" -p 512 -n 0 -r 3 --device cuda 2>&1 | grep pp512 | awk -F'|' '{print $(NF-1)}'; }
old_env="KILN_CUDA_PREFILL_ROUTER=0 KILN_CUDA_PREFILL_ROPE_STORE=0 KILN_CUDA_PREFILL_MIXED_PARTS=0"
# new: the defaults (router_logits off since it measured slower than cuBLAS; the second run's
# new arms had it on, with placement 2).
for arm in new old new old; do
  if [ $arm = new ]; then echo "moe new: $(pp /tmp/moe.gguf)"; else echo "moe old: $(pp /tmp/moe.gguf $old_env)"; fi
done
for placement in 2 1; do
  KILN_CUDA_PREFILL_ROUTER=1 KILN_CUDA_ROUTER_PLACEMENT=$placement KILN_CUDA_OP_TIMING=2 timeout 60 "$K" bench -m /tmp/moe.gguf -p 512 -n 0 \
    -r 1 --device cuda > "$OUT/moe-ops-new-p$placement.log" 2>&1
done
env $old_env KILN_CUDA_OP_TIMING=2 timeout 60 "$K" bench -m /tmp/moe.gguf -p 512 -n 0 -r 1 --device cuda \
  > "$OUT/moe-ops-old.log" 2>&1
python3 "$SRC/scripts/prefill_op_layers.py" "$OUT"/moe-ops-*.log > "$OUT/moe-ops-layers.txt" 2>&1
cat "$OUT/moe-ops-layers.txt"
say "moe profiles done"
# What the ops cost inside the pass (results wrong, timing only): left out altogether.
echo "moe new without router_logits, norm_rope_kv_store: $(pp /tmp/moe.gguf KILN_CUDA_SKIP_OPS=router_logits,norm_rope_kv_store)"
echo "moe new without moe_ffn: $(pp /tmp/moe.gguf KILN_CUDA_SKIP_OPS=moe_ffn)"
echo "moe new but MIXED_PARTS=0: $(pp /tmp/moe.gguf KILN_CUDA_PREFILL_MIXED_PARTS=0)"
rm -f /tmp/moe.gguf
say "moe done"
timeout 60 "$K" synth --preset llama3-8b --type q4_k_m --fast -o /tmp/l.gguf > /dev/null 2>&1 || exit 1
for arm in 1 0; do echo "llama q4_k_m MIXED_PARTS=$arm: $(pp /tmp/l.gguf KILN_CUDA_PREFILL_MIXED_PARTS=$arm)"; done
rm -f /tmp/l.gguf
say done
