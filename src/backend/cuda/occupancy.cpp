#include "backend/cuda/occupancy.h"

#include <cxxabi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <string>
#include <tuple>

#include "backend/cuda/env_switch.h"

namespace kiln::cuda {

namespace {
// An attribute of the current device; 0 where it cannot be read.
int current_device_attribute(cudaDeviceAttr attribute) {
  int device = 0, value = 0;
  if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetAttribute(&value, attribute, device) != cudaSuccess)
    return 0;
  return value;
}
}  // namespace

int multiprocessor_count() {
  static const int count = current_device_attribute(cudaDevAttrMultiProcessorCount);
  return count;
}

int compute_capability_major() {
  static const int major = current_device_attribute(cudaDevAttrComputeCapabilityMajor);
  return major;
}

size_t spread_padding(const void* kernel, int threads, int want, int at_least) {
  int device = 0, optin = 0, fit = 0;
  cudaFuncAttributes attributes{};
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, kernel, threads, 0) != cudaSuccess || fit < at_least ||
      cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess ||
      cudaFuncGetAttributes(&attributes, kernel) != cudaSuccess)
    return 0;
  const size_t padding = spread_shared_bytes(kernel, threads, 0, want, size_t(optin) - attributes.sharedSizeBytes);
  if (padding == 0 || cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(padding)) !=
                          cudaSuccess)
    return 0;
  return padding;
}

size_t spread_shared_bytes(const void* kernel, int threads, size_t shared, int want, size_t max_dynamic) {
  int device = 0, smem_per_sm = 0, reserved = 0, fit = 0;
  cudaFuncAttributes attributes{};
  if (want <= 0 || cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, kernel, threads, shared) != cudaSuccess ||
      fit <= want || cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, device) != cudaSuccess ||
      cudaFuncGetAttributes(&attributes, kernel) != cudaSuccess)
    return shared;
  // want + 1 blocks of (static + dynamic + reserved) bytes must not fit.
  const long one_too_many = long(smem_per_sm / (want + 1)) - reserved - long(attributes.sharedSizeBytes) + 1;
  const long most = long(smem_per_sm / want) - reserved - long(attributes.sharedSizeBytes);
  const long bytes = std::min<long>(most, long(max_dynamic)) / 128 * 128;
  if (bytes < one_too_many || bytes <= long(shared)) return shared;
  return size_t(bytes);
}

bool launch_report_enabled() {
  static const bool on = env_is("KILN_CUDA_LAUNCH_REPORT", "1");
  return on;
}

namespace {

std::string kernel_name(const void* kernel) {
  const char* mangled = nullptr;
  if (cudaFuncGetName(&mangled, kernel) != cudaSuccess || !mangled) return "(unnamed kernel)";
  int status = 0;
  char* plain = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string name = status == 0 && plain ? plain : mangled;
  std::free(plain);
  return name;
}

}  // namespace

void report_launch(const void* kernel, dim3 grid, dim3 block, size_t shared_bytes) {
  static std::mutex mutex;
  static std::set<std::tuple<const void*, unsigned long long, size_t>> seen;
  const unsigned long long blocks = 1ull * grid.x * grid.y * grid.z;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (!seen.insert({kernel, blocks, shared_bytes}).second) return;
  }
  const int threads = int(block.x * block.y * block.z);
  int fit = 0;
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, kernel, threads, shared_bytes);
  const int sms = multiprocessor_count();
  const double share = sms > 0 ? double(blocks) / sms : 0.0;
  std::fprintf(stderr, "kiln cuda launch: %llu blocks of %d threads, %zu B dynamic shared: %d fit a multiprocessor, "
               "even share %.2f%s | %s\n", blocks, threads, shared_bytes, fit, share,
               fit >= 2 * share + 1 ? " (can pile up)" : "", kernel_name(kernel).c_str());
}

}  // namespace kiln::cuda
