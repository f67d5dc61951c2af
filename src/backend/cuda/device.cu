#include "backend/cuda/device.h"

#include <cuda_runtime.h>

namespace kiln::cuda {

std::vector<DeviceInfo> list_devices(std::string* why) {
  std::vector<DeviceInfo> out;
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    if (why) *why = cudaGetErrorString(err);
    cudaGetLastError();  // clear the sticky error so later probes start clean
    return out;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    out.push_back({i, prop.name, prop.totalGlobalMem, prop.major, prop.minor, prop.multiProcessorCount});
  }
  if (out.empty() && why) *why = "no CUDA device";
  return out;
}

namespace {
__global__ void spin_kernel(long long nanoseconds) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < (unsigned long long)nanoseconds);
}
}  // namespace

void hold_stream(cudaStream_t stream, int microseconds) {
  spin_kernel<<<1, 1, 0, stream>>>(1000ll * microseconds);
}

}  // namespace kiln::cuda
