#pragma once
// Per-block timestamps at the chained kernels' wait, for builds configured with
// -DKILN_CUDA_BLOCK_TRACE=ON only (common.cuh includes this file then; other builds compile
// none of it). Thread 0 of every block that calls wait_for_previous_kernels() records when
// the block arrived there (it had become resident and issued what it reads before the wait)
// and when the wait released it (the kernels before it had completed), with its multiprocessor
// and its kernel's shape. In a chained decode step the release of kernel n + 1 marks the
// completion of kernel n, so the releases give each kernel's time in the chain, and the
// arrivals how early its blocks found room beside the kernel before. Phase stamps after the
// wait (trace_stamp in common.cuh): 0 once the block has also let the next kernel start
// (every begin_chained_kernel), 1 - 3 where a kernel puts them (e.g. its first inputs in, its
// result written). block_trace.h enables the buffer and writes it out;
// scripts/block-trace-summary.py reads it.
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

// The ring slot of the calling block's record (set by thread 0 at its wait).
__device__ __forceinline__ unsigned long long& record_slot() {
  __shared__ unsigned long long slot;
  return slot;
}

// Thread 0, before its wait: the block's slot in the ring (the last records stay). Taken there,
// so that the atomic's round trip overlaps the wait instead of holding up the block after it
// (and every phase stamp after it).
__device__ __forceinline__ unsigned long long reserve() {
  if (threadIdx.x + threadIdx.y + threadIdx.z != 0 || !g_sink.records) return 0;
  return atomicAdd(g_sink.count, 1ull) % g_sink.capacity;
}
// Thread 0, after its wait: the block's record in the slot reserve() gave.
__device__ __forceinline__ void record(unsigned long long i, uint64_t arrived, uint64_t released) {
  if (threadIdx.x + threadIdx.y + threadIdx.z != 0 || !g_sink.records) return;
  record_slot() = i;
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

// Phase stamp k of the calling block (thread 0, after its wait): when thread 0 got there.
__device__ __forceinline__ void stamp(int k) {
  if (threadIdx.x + threadIdx.y + threadIdx.z != 0 || !g_sink.records) return;
  g_sink.records[record_slot() % g_sink.capacity].stamps[k] = now();
}

}  // namespace kiln::cuda::block_trace
