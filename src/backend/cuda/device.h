#pragma once
// CUDA device discovery. Everything here is safe to call on machines without a GPU or
// driver: it then reports zero devices and says why.
#include <cuda_runtime_api.h>

#include <string>
#include <vector>

namespace kiln::cuda {

struct DeviceInfo {
  int index = 0;
  std::string name;
  size_t total_memory = 0;
  int compute_major = 0, compute_minor = 0;
  int multiprocessors = 0;
};

// The usable devices; empty (with `why` set) when there is no driver or GPU.
std::vector<DeviceInfo> list_devices(std::string* why = nullptr);

// Keeps the stream busy for about `microseconds` (one thread spinning on the GPU clock), so
// that work queued behind it meanwhile runs back to back: profiling aid.
void hold_stream(cudaStream_t stream, int microseconds);

}  // namespace kiln::cuda
