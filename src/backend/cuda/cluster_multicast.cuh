#pragma once
// Copies that one block of a thread block cluster asks for once and every block of the
// cluster receives in its shared memory (sm_90 bulk copies with .multicast::cluster), each
// block's copies counted on a transaction barrier (mbarrier) in its own shared memory.
//
// Why: a decode product's blocks all read the same activations (e.g. 18 KB of Llama-3-8B's
// int8 h in each of the down product's 264 blocks, ~4.7 MB from L2 right after the wait). In
// clusters of C blocks each block asks for 1/C of the pieces and the L2 serves each piece once
// a cluster.
//
// Protocol (every thread of every block of the cluster takes part where it says "all"):
//   before the wait:   multicast_prepare(bar)          all: barrier set up, cluster synced
//   after the wait:    thread 0 multicast_expect(bar, total bytes the block will receive);
//                      each piece issued by one thread of one block (multicast_copy)
//                      all: multicast_wait(bar), then multicast_arrived()
//   before exiting:    multicast_finish()               all
// The cluster barrier between multicast_arrived and multicast_finish keeps every block
// resident until every block's pieces have landed: no block leaves while a copy it issued
// may still be writing into another's shared memory.
#include <cstdint>

#include "backend/cuda/common.cuh"

namespace kiln::cuda::detail {

// Clusters need sm_90. Compiled for an older architecture, the functions below are empty and
// cluster_blocks() is 1; the callers run them only in kernels launched in clusters (launch_grouped
// asks for those on sm_90 devices unless told otherwise).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define KILN_CLUSTER_ASM(...)
#else
#define KILN_CLUSTER_ASM(...) asm volatile(__VA_ARGS__)
#endif

// The blocks of this block's cluster (1 for a launch without clusters) and its rank there.
__device__ __forceinline__ unsigned cluster_blocks() {
  unsigned n = 1;
  KILN_CLUSTER_ASM("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
  return n;
}
__device__ __forceinline__ unsigned cluster_rank() {
  unsigned r = 0;
  KILN_CLUSTER_ASM("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

__device__ __forceinline__ void cluster_sync_all() {
  KILN_CLUSTER_ASM("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
  KILN_CLUSTER_ASM("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

// All threads: thread 0 sets up the barrier for one arrival (its own, with the expected bytes);
// the cluster barrier makes it visible to the other blocks before any copy can reach it.
__device__ __forceinline__ void multicast_prepare(uint64_t* bar) {
  if (threadIdx.x == 0) {
    KILN_CLUSTER_ASM("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(shared_address(bar)) : "memory");
    KILN_CLUSTER_ASM("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  cluster_sync_all();
}

// Thread 0: the bytes this block will receive (its barrier's phase completes when they have).
__device__ __forceinline__ void multicast_expect(uint64_t* bar, uint32_t bytes) {
  KILN_CLUSTER_ASM("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(shared_address(bar)),
                   "r"(bytes)
                   : "memory");
}

// `bytes` (a multiple of 16; both addresses 16-byte aligned) from global `src` to `dst` in the
// shared memory of every block of the cluster (the same offset in each), counted on each
// block's `bar` (the same offset too).
__device__ __forceinline__ void multicast_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  const uint16_t every_block = uint16_t((1u << cluster_blocks()) - 1u);
  KILN_CLUSTER_ASM(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1], %2, [%3], "
      "%4;\n" ::"r"(shared_address(dst)),
      "l"(src), "r"(bytes), "r"(shared_address(bar)), "h"(every_block)
      : "memory");
}

// Until this block's expected bytes have landed (phase 0: the barrier serves one launch).
__device__ __forceinline__ void multicast_wait(uint64_t* bar) {
  uint32_t done = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  done = 1;
#endif
  while (!done) {
    KILN_CLUSTER_ASM(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(shared_address(bar))
        : "memory");
  }
}

// All threads, after multicast_wait: this block has what it asked for.
__device__ __forceinline__ void multicast_arrived() {
  KILN_CLUSTER_ASM("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}
// All threads, before leaving: every block of the cluster has had its bytes.
__device__ __forceinline__ void multicast_finish() { KILN_CLUSTER_ASM("barrier.cluster.wait.aligned;\n" ::: "memory"); }

#undef KILN_CLUSTER_ASM

}  // namespace kiln::cuda::detail
