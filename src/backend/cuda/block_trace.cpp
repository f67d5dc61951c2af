// The host side of the per-block wait trace (block_trace.h).
#include "backend/cuda/block_trace.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <vector>

namespace kiln::cuda::block_trace {
namespace {

std::vector<const void*>& sinks() {
  static std::vector<const void*> all;
  return all;
}
Record* g_records = nullptr;
unsigned long long* g_count = nullptr;
size_t g_capacity = 0;

}  // namespace

void register_sink(const void* device_symbol) { sinks().push_back(device_symbol); }

bool compiled_in() { return !sinks().empty(); }

bool enable(size_t capacity) {
  if (g_records) return true;  // a second backend of the process shares the ring
  if (!compiled_in() || capacity == 0) return false;
  if (cudaMalloc(reinterpret_cast<void**>(&g_records), capacity * sizeof(Record)) != cudaSuccess) return false;
  if (cudaMalloc(reinterpret_cast<void**>(&g_count), sizeof(unsigned long long)) != cudaSuccess ||
      cudaMemset(g_count, 0, sizeof(unsigned long long)) != cudaSuccess) {
    cudaFree(g_records);
    g_records = nullptr;
    return false;
  }
  g_capacity = capacity;
  const Sink sink{g_records, g_count, capacity};
  for (const void* symbol : sinks())
    if (cudaMemcpyToSymbol(symbol, &sink, sizeof(sink)) != cudaSuccess) return false;
  return true;
}

int64_t write_csv(const std::string& path) {
  if (!g_records) return 0;
  cudaDeviceSynchronize();
  unsigned long long count = 0;
  cudaMemcpy(&count, g_count, sizeof(count), cudaMemcpyDeviceToHost);
  const size_t kept = std::min<size_t>(size_t(count), g_capacity);
  std::vector<Record> records(kept);
  cudaMemcpy(records.data(), g_records, kept * sizeof(Record), cudaMemcpyDeviceToHost);
  cudaFree(g_records);
  cudaFree(g_count);
  g_records = nullptr, g_count = nullptr;
  std::sort(records.begin(), records.end(), [](const Record& a, const Record& b) { return a.arrived < b.arrived; });
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (!f) return -1;
  std::fprintf(f, "arrived_ns,released_ns,stamp0_ns,stamp1_ns,stamp2_ns,stamp3_ns,sm,block,blocks,threads,dynamic_smem\n");
  auto ns = [](uint64_t t) { return static_cast<unsigned long long>(t); };
  static_assert(kStamps == 4);
  for (const Record& r : records)
    std::fprintf(f, "%llu,%llu,%llu,%llu,%llu,%llu,%u,%u,%u,%u,%u\n", ns(r.arrived), ns(r.released), ns(r.stamps[0]),
                 ns(r.stamps[1]), ns(r.stamps[2]), ns(r.stamps[3]), r.sm, r.block, r.blocks, r.threads,
                 r.dynamic_smem);
  std::fclose(f);
  return int64_t(kept);
}

}  // namespace kiln::cuda::block_trace
