#pragma once
// Per-block timestamps at the chained kernels' wait, for builds configured with
// -DKILN_CUDA_BLOCK_TRACE=ON only (common.cuh includes this file then; other builds compile
// none of it). Thread 0 of every block that calls wait_for_previous_kernels() records when
// the block arrived there (it had become resident and issued what it reads before the wait)
// and when the wait released it (the kernels before it had completed), with its multiprocessor
// and its kernel's shape. In a chained decode step the release of kernel n + 1 marks the
// completion of kernel n, so the releases give each kernel's time in the chain, and the
// arrivals how early its blocks found room beside the kernel before. block_trace.h enables the
// buffer and writes it out; scripts/block-trace-summary.py reads it.
#include <cstdint>

#include "backend/cuda/block_trace.h"

namespace kiln::cuda::block_trace {

// One per translation unit (the CUDA sources are compiled without separable compilation, so
// each has its own copy); the host sets every registered copy (enable()).
static __device__ Sink g_sink;
namespace {
const bool g_sink_registered = (register_sink(&g_sink), true);
}

__device__ __forceinline__ uint64_t now() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ void record(uint64_t arrived, uint64_t released) {
  if (threadIdx.x + threadIdx.y + threadIdx.z != 0 || !g_sink.records) return;
  const unsigned long long i = atomicAdd(g_sink.count, 1ull) % g_sink.capacity;  // a ring: the last ones stay
  uint32_t sm, smem;
  asm("mov.u32 %0, %%smid;" : "=r"(sm));
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(smem));
  Record r{};
  r.arrived = arrived, r.released = released, r.sm = sm;
  r.block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  r.blocks = gridDim.x * gridDim.y * gridDim.z;
  r.threads = blockDim.x * blockDim.y * blockDim.z;
  r.dynamic_smem = smem;
  g_sink.records[i] = r;
}

}  // namespace kiln::cuda::block_trace
