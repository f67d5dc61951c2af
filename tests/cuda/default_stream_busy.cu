// A kernel that keeps the legacy default stream busy for a while, so that work queued there
// behind it (a cudaMemset) runs late: tests use it to show whether the backend's stream waits
// for that work.
#include "default_stream_busy.h"

namespace kiln::testing {
namespace {

__global__ void spin_kernel(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

}  // namespace

bool keep_default_stream_busy(long long cycles) {
  spin_kernel<<<1, 1, 0, cudaStreamLegacy>>>(cycles);
  return cudaGetLastError() == cudaSuccess;
}

}  // namespace kiln::testing
