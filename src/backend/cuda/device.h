#pragma once
// CUDA device discovery. Everything here is safe to call on machines without a GPU or
// driver: it then reports zero devices and says why.
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

}  // namespace kiln::cuda
