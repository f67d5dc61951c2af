#!/bin/bash
# F16 / Q4_0 prefill on one GPU: joined q/k/v and gate/up products (KILN_CUDA_PREFILL_JOIN)
# and the glu writing the down product's half input (KILN_CUDA_PREFILL_GLU_HALF). The whole
# of test_cuda, then llama3-8b F16 pp512 with both off / both on in turn, the prefill op
# profiles (one late layer), and Q4_0 pp512 off / on. TEST_FILTER
# narrows the tests, TESTS_ONLY=1 stops after them, QUICK=1 after the F16 arms. Carry
# .devicedeps and .device-testdata; logs under $OUT.
set -u -o pipefail
OUT=${OUT:-/tmp/kiln-gpu-out}
SRC=${KILN_SRC:-.}
B=${KILN_BUILD:-/tmp/kiln-f16pp-build}
mkdir -p "$OUT" /tmp/deps && for f in .devicedeps/*.deb; do dpkg -x "$f" /tmp/deps; done
cmake -S "$SRC" -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DKILN_PCRE2_ROOT=/tmp/deps/usr -DKILN_SERVER=OFF -DKILN_BENCH=OFF > "$OUT/configure.log" 2>&1 || exit 1
SECONDS=0
timeout 300 cmake --build "$B" --target test_cuda kiln -j16 > "$OUT/build.log" 2>&1 \
  || { grep -E " error|FAILED" "$OUT/build.log" | head -20; exit 1; }
echo "build ${SECONDS}s"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  KILN_TESTDATA=${KILN_TESTDATA:-$PWD/.device-testdata} timeout 150 "$B/tests/test_cuda" ${TEST_FILTER:+--gtest_filter=$TEST_FILTER} \
    > "$OUT/test_cuda.log" 2>&1
  echo "test_cuda exit $? (${SECONDS}s)"
  grep -E "^\[  +(FAILED|PASSED|SKIPPED) +\] [0-9]|FAILED|joined vs separate" "$OUT/test_cuda.log" | head -30
fi
[ "${TESTS_ONLY:-0}" = 1 ] && exit 0
K=$B/src/kiln
bench() {  # type, env...
  local m=/tmp/$1.gguf; shift
  echo "$* : $(env "$@" timeout 60 "$K" bench -m "$m" -p 512 -n 0 -r 5 --device cuda 2>&1 | grep pp512)"
}
timeout 60 "$K" synth --preset llama3-8b --type f16 --fast -o /tmp/f16.gguf > /dev/null 2>&1 || exit 1
OLD="KILN_CUDA_PREFILL_JOIN=0 KILN_CUDA_PREFILL_GLU_HALF=0"
for arm in old new old new; do
  if [ $arm = old ]; then bench f16 $OLD; else bench f16 KILN_CUDA_PREFILL_JOIN=1; fi
done
echo "(${SECONDS}s)"
[ "${QUICK:-0}" = 1 ] && exit 0  # QUICK=1: the tests and the F16 arms only
profile() {  # name, env...
  local name=$1; shift
  env "$@" KILN_CUDA_OP_TIMING=2 timeout 60 "$K" bench -m /tmp/f16.gguf -p 512 -n 0 -r 1 --device cuda > "$OUT/ops-$name.log" 2>&1
  # One late layer (the first one's products include the algorithm timing): from the 20th
  # attention to the ops before the 21st.
  echo "op profile $name (us, one layer):"
  awk '$1 == "op" { if ($3 == "attention") n++; if (n == 20) print }' "$OUT/ops-$name.log"
}
profile new KILN_CUDA_PREFILL_JOIN=1
profile old $OLD
rm -f /tmp/f16.gguf
timeout 60 "$K" synth --preset llama3-8b --type q4_0 --fast -o /tmp/q4_0.gguf > /dev/null 2>&1 || exit 1
for arm in old new old new; do
  if [ $arm = old ]; then bench q4_0 $OLD; else bench q4_0 KILN_CUDA_PREFILL_JOIN=1; fi
done
echo "done (${SECONDS}s)"
