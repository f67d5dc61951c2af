// Why a decode step reaches only ~63% of the read bandwidth, measured on a synthetic step:
// does the chain of kernels (one per phase: q/k/v product, attention, o product, gate/up
// product, down product, per layer) lose the stream at every kernel boundary, and would one
// persistent kernel whose blocks keep a ring of weight chunks in shared memory, filled by a
// producer warp that runs ahead across phase boundaries, keep it near the bandwidth?
// Weights never depend on activations, so only their consumption has to wait for the
// previous phase; the ring lets the copies of phase p + 1 be in flight while phase p's
// barrier is still open. Kiln's products use fat blocks (~100 KB of shared memory, 2 per SM),
// so the next kernel's blocks cannot become resident before the previous kernel's leave,
// whatever programmatic dependent launch allows.
//
// The step: `layers` x 5 phases whose byte sizes are those of Llama-3-8B's decode (preset
// q4_0 or q8_0); each phase of each layer reads its own region of one weight buffer (~3.9 GB
// for q4_0, ~7.4 GB for q8_0, far more than the 60 MB L2). Each block reads a contiguous,
// balanced share of each phase's region, folds the words (standing for the dot product),
// and hands one value to another block: block b writes next[b] = cur[neighbour(b)] + 1,
// read by the next phase only after its wait, so after the step every value must equal the
// number of phases; the program checks it and exits 1 otherwise (a broken barrier shows as
// an error, not as a fast time). Variants:
//   stream_floor        one kernel reading the whole step in one pass: the ceiling;
//   chain_regs          one kernel per phase, chained (PDL), small blocks at full occupancy,
//                       the first 4 loads of each thread issued before the wait;
//   chain_regs9         the same with 9 loads a thread (a q4_0 group of 8 blocks, as a product
//                       holding its weights in registers would), 4 blocks per SM;
//   chain_lanes9        as chain_regs9, but each thread's 9 loads are 9 consecutive words
//                       (a lane's q4_0 group in kiln's block layout: uncoalesced), through
//                       __ldcs or (_ldg) through L1;
//   chain_fat           one kernel per phase, chained, 2 blocks per SM of 96 KB cp.async
//                       stages shared by the block, filled before the wait;
//   chain_warp          kiln's int8 products' structure: 2 blocks per SM of 8 warps, each warp
//                       streaming its part through 2 private 4.5 KB cp.async stages;
//   <chain>+x           the same with a product's prologue after the wait (x read through L2,
//                       its sum of squares reduced over the block, an int8 copy to shared
//                       memory), which every kiln product pays before its first dot product;
//   persistent_ring     one kernel, 1 block per SM: a producer warp bulk-copies chunks into a
//                       ring of mbarrier-guarded slots across all phases, 8 consumer warps
//                       consume them, phases separated by a barrier through a global counter;
//   persistent_ring_2   the same with 2 blocks per SM (half the ring each);
//   persistent_noring*  the same persistent loop without the ring: consumers load straight
//                       from global memory (first loads before the barrier), at 1 block per
//                       SM and at full occupancy: what the ring buys.
//
// Method: each variant's step is captured once into a CUDA graph (a memset of the handoff
// values and the counter, then the launches) and replayed; median of --replays replays after
// 3 warm-ups. GB/s = step bytes / median; % floor relative to stream_floor of the same pass.
// The table is measured twice (pass 1, pass 2) to show the spread. KILN_CUDA_PDL=0 turns the
// chained launches into plain ones. A wait that lasts over ~10 s traps (launch failure)
// rather than hanging the machine.
//
//   bench_cuda_stream_phases_bench [--preset q4_0|q8_0] [--layers 32] [--ring-kb 192]
//                                  [--chunk-kb 8] [--replays 20]     (--help explains them;
//   exits 0 with a message when no GPU of sm_90 or later is present)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "backend/cuda/common.cuh"
#include "backend/cuda/launch.cuh"
#include "cuda_replay_timing.h"

namespace {

using namespace kiln::cuda;
using namespace kiln::cuda::detail;
using kiln::bench::add_release;
using kiln::bench::load_acquire;

constexpr const char* kProgram = "bench_cuda_stream_phases_bench";
constexpr int kKinds = 5;                          // phases per layer
constexpr int kThreads = 256;                      // consumer threads of every kernel
constexpr int kConsumerWarps = kThreads / kWarpSize;
constexpr int kRingThreads = kThreads + kWarpSize;  // + the producer warp
constexpr int kHead = 4;                           // 16-byte loads in flight per thread
constexpr int kFatStages = 6;
constexpr int kFatStageUnits = 1024;               // 16 KB: 4 16-byte copies per thread
constexpr int kConsumerBarrier = 1;                // named barrier of the consumer warps (0 is __syncthreads)
constexpr unsigned kUnlikely = 0x9e3779b9u;        // a fold equal to this is written to the sink
constexpr unsigned long long kPatienceNs = 10'000'000'000ull;

void check(cudaError_t e, const char* what) { kiln::bench::exit_on_cuda_error(kProgram, e, what); }

struct Preset {
  const char* name;
  unsigned long long bytes[kKinds];  // qkv, attention, o, gate_up, down
};
constexpr Preset kPresets[] = {
    {"q4_0", {14'155'776, 524'288, 9'437'184, 66'060'288, 33'030'144}},
    {"q8_0", {26'738'688, 524'288, 17'825'792, 124'780'544, 62'390'272}},
};

// Where each phase's weights lie in the buffer, in 16-byte units. In constant memory for the
// persistent kernels, which index it by a run-time phase.
struct StepShape {
  unsigned long long kind_units[kKinds];
  unsigned long long kind_offset[kKinds];
  unsigned long long layer_units;
  int layers;
  __host__ __device__ int phases() const { return layers * kKinds; }
  __host__ __device__ unsigned long long offset(int phase) const {
    return (phase / kKinds) * layer_units + kind_offset[phase % kKinds];
  }
  __host__ __device__ unsigned long long units(int phase) const { return kind_units[phase % kKinds]; }
};
__constant__ StepShape c_shape;

// Two rows of `blocks` values, ping-pong between phases.
struct Handoff {
  unsigned* values;
  int blocks;
};
__host__ __device__ int neighbour(int block, int blocks) { return (block + 1) % blocks; }

// Thread 0's part: the value handed over by the previous phase (after its wait)...
__device__ __forceinline__ unsigned read_handoff(const Handoff& h, int phase) {
  return __ldcg(h.values + (phase & 1) * h.blocks + neighbour(blockIdx.x, h.blocks));
}
// ... and the one handed to the next phase.
__device__ __forceinline__ void write_handoff(const Handoff& h, int phase, unsigned before) {
  h.values[((phase + 1) & 1) * h.blocks + blockIdx.x] = before + 1;
}

// A block's contiguous part of a region of `units` 16-byte words; parts differ by one word at most.
struct Share {
  const uint4* base;
  unsigned count;
};
__device__ __forceinline__ Share share_of(const uint4* region, unsigned long long units, unsigned block,
                                          unsigned blocks) {
  const unsigned long long q = units / blocks, r = units % blocks;
  const unsigned long long begin = block * q + (block < r ? block : r);
  return {region + begin, unsigned(q + (block < r ? 1 : 0))};
}

// Stands for the dot product: cheap, but depends on every word, so no load can be dropped.
__device__ __forceinline__ unsigned fold(unsigned acc, uint4 v) { return (acc ^ v.x ^ v.y) + (v.z ^ v.w); }

// The first N words of this thread's part of a share (warp-coalesced: word t + k * kThreads).
template <int N = kHead>
__device__ __forceinline__ void load_head(const Share& s, uint4 (&head)[N]) {
#pragma unroll
  for (int k = 0; k < N; ++k) {
    const unsigned i = threadIdx.x + k * kThreads;
    head[k] = i < s.count ? __ldcs(s.base + i) : make_uint4(0, 0, 0, 0);
  }
}
// The head's words and then the rest of the share, N loads in flight per thread.
template <int N = kHead>
__device__ __forceinline__ unsigned stream_rest(const Share& s, const uint4 (&head)[N], unsigned acc) {
#pragma unroll
  for (int k = 0; k < N; ++k) acc = fold(acc, head[k]);
  for (unsigned i = threadIdx.x + N * kThreads; i < s.count; i += N * kThreads) {
    uint4 v[N];
#pragma unroll
    for (int k = 0; k < N; ++k) {
      v[k] = i + k * kThreads < s.count ? __ldcs(s.base + i + k * kThreads) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int k = 0; k < N; ++k) acc = fold(acc, v[k]);
  }
  return acc;
}

// Stands for a product's prologue after its wait: x (kXFloats floats, which the previous
// kernel wrote, so read through L2) loaded, its sum of squares reduced over the block, and an
// int8 copy written to shared memory, as kiln's products normalize and quantize x before
// their first dot product. Returns a word of the copy, so that the work cannot be dropped.
constexpr int kXFloats = 4096;
constexpr int kGroupUnits = 9;  // 16-byte words of a q4_0 group of 8 blocks (144 bytes)
constexpr size_t kXSharedBytes = kXFloats + 64;  // the int8 copy + the warps' partial sums
__device__ unsigned x_prologue(const float* x, uint8_t* x_s) {
  constexpr int kPer = kXFloats / kThreads / 4;  // float4 per thread
  const float4* x4 = reinterpret_cast<const float4*>(x);
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const float4 v = __ldcg(x4 + threadIdx.x + k * kThreads);
    ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
  }
  float* partial = reinterpret_cast<float*>(x_s + kXFloats);
  ss = warp_sum(ss);
  if (threadIdx.x % kWarpSize == 0) partial[threadIdx.x / kWarpSize] = ss;
  __syncthreads();
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < kThreads / kWarpSize; ++w) total += partial[w];
  const float scale = 127.0f * rsqrtf(total / kXFloats + 1e-6f) / 4.0f;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {  // read again (L2) rather than held: the small blocks have 32 registers
    const float4 v = __ldcg(x4 + threadIdx.x + k * kThreads);
    const int i = 4 * (threadIdx.x + k * kThreads);
    x_s[i] = uint8_t(__float2int_rn(v.x * scale));
    x_s[i + 1] = uint8_t(__float2int_rn(v.y * scale));
    x_s[i + 2] = uint8_t(__float2int_rn(v.z * scale));
    x_s[i + 3] = uint8_t(__float2int_rn(v.w * scale));
  }
  __syncthreads();
  return reinterpret_cast<const unsigned*>(x_s)[threadIdx.x];
}

// ---- the floor and the kernels of one phase each ----

__global__ void __launch_bounds__(kThreads)
    stream_floor(const uint4* weights, unsigned long long units, unsigned* sink) {
  const Share s = share_of(weights, units, blockIdx.x, gridDim.x);
  uint4 head[kHead];
  load_head(s, head);
  const unsigned acc = stream_rest(s, head, 0);
  if (acc == kUnlikely) sink[blockIdx.x] = acc;
}

// Small blocks (kPerSm of them per SM: 8, full occupancy, caps them at 32 registers): as this
// kernel's blocks leave, the next one's can take their place, and each thread has its first
// N loads in flight before waiting for the previous phase. kPrologue: x_prologue after the wait.
template <int N, int kPerSm, bool kPrologue>
__global__ void __launch_bounds__(kThreads, kPerSm)
    chain_regs_phase(const uint4* region, unsigned long long units, Handoff h, unsigned* sink, int phase,
                     const float* x) {
  __shared__ __align__(16) uint8_t x_s[kPrologue ? kXSharedBytes : 16];
  allow_next_kernel();
  const Share s = share_of(region, units, blockIdx.x, gridDim.x);
  uint4 head[N];
  load_head<N>(s, head);  // weights: no wait needed
  wait_for_previous_kernels();
  const unsigned before = threadIdx.x == 0 ? read_handoff(h, phase) : 0;
  unsigned acc = kPrologue ? x_prologue(x, x_s) : 0;
  acc = stream_rest<N>(s, head, acc);
  if (acc == kUnlikely) sink[blockIdx.x] = acc;
  if (threadIdx.x == 0) write_handoff(h, phase, before);
}

// As chain_regs9+x, but each thread loads 9 consecutive words (a q4_0 group of 8 blocks,
// 144 bytes, as a product that dots a lane's group from registers reads it from kiln's block
// layout): a warp's load k then reads 16 bytes a lane at a 144-byte stride, half of each
// 32-byte sector. kLdg: through L1 (load k + 1 finds the other half there); else __ldcs
// (evict-first, as chain_regs). Words past the last whole group are read plainly.
template <bool kLdg>
__global__ void __launch_bounds__(kThreads, 4)
    chain_lanes_phase(const uint4* region, unsigned long long units, Handoff h, unsigned* sink, int phase,
                      const float* x) {
  __shared__ __align__(16) uint8_t x_s[kXSharedBytes];
  allow_next_kernel();
  const Share s = share_of(region, units, blockIdx.x, gridDim.x);
  const unsigned groups = s.count / kGroupUnits;
  uint4 v[kGroupUnits];
  const auto load = [&](unsigned group) {
#pragma unroll
    for (int k = 0; k < kGroupUnits; ++k) {
      const uint4* p = s.base + size_t(group) * kGroupUnits + k;
      v[k] = group < groups ? (kLdg ? __ldg(p) : __ldcs(p)) : make_uint4(0, 0, 0, 0);
    }
  };
  load(threadIdx.x);  // weights: no wait needed
  wait_for_previous_kernels();
  const unsigned before = threadIdx.x == 0 ? read_handoff(h, phase) : 0;
  unsigned acc = x_prologue(x, x_s);
  for (unsigned group = threadIdx.x; group < groups; group += kThreads) {
#pragma unroll
    for (int k = 0; k < kGroupUnits; ++k) acc = fold(acc, v[k]);
    load(group + kThreads);
  }
  for (unsigned i = groups * kGroupUnits + threadIdx.x; i < s.count; i += kThreads) acc = fold(acc, __ldcs(s.base + i));
  if (acc == kUnlikely) sink[blockIdx.x] = acc;
  if (threadIdx.x == 0) write_handoff(h, phase, before);
}

// Copies stage `stage` of the share into its slot; a stage past the share's end copies
// nothing but still commits a group, so that the count of groups in flight stays kFatStages.
__device__ __forceinline__ void issue_fat_stage(uint4* stages, const Share& s, unsigned stage) {
  const unsigned first = stage * kFatStageUnits;
  uint4* slot = stages + (stage % kFatStages) * kFatStageUnits;
#pragma unroll
  for (int k = 0; k < kFatStageUnits / kThreads; ++k) {
    const unsigned u = threadIdx.x + k * kThreads;
    if (first + u < s.count) cp_async_16(slot + u, s.base + first + u);
  }
  cp_async_commit();
}

// Fat blocks, as kiln's products: the stages are filled before the wait, and the next
// kernel's blocks (as fat) fit on an SM only once this one's have left it.
template <bool kPrologue>
__global__ void __launch_bounds__(kThreads)
    chain_fat_phase(const uint4* region, unsigned long long units, Handoff h, unsigned* sink, int phase,
                    const float* x) {
  extern __shared__ uint4 stages[];  // kFatStages stages, then (kPrologue) x's int8 copy
  allow_next_kernel();
  const Share s = share_of(region, units, blockIdx.x, gridDim.x);
  const unsigned n_stages = (s.count + kFatStageUnits - 1) / kFatStageUnits;
  for (int st = 0; st < kFatStages; ++st) issue_fat_stage(stages, s, st);
  wait_for_previous_kernels();
  const unsigned before = threadIdx.x == 0 ? read_handoff(h, phase) : 0;
  unsigned acc = 0;
  if constexpr (kPrologue) acc = x_prologue(x, reinterpret_cast<uint8_t*>(stages + kFatStages * kFatStageUnits));
  for (unsigned st = 0; st < n_stages; ++st) {
    cp_async_wait<kFatStages - 1>();
    __syncthreads();
    const uint4* slot = stages + (st % kFatStages) * kFatStageUnits;
    const unsigned first = st * kFatStageUnits;
#pragma unroll
    for (int k = 0; k < kFatStageUnits / kThreads; ++k) {
      // Another warp's copies, as a product reads a tile many threads filled.
      const unsigned u = (threadIdx.x + kWarpSize) % kThreads + k * kThreads;
      if (first + u < s.count) acc = fold(acc, slot[u]);
    }
    __syncthreads();  // the slot is refilled next
    issue_fat_stage(stages, s, st + kFatStages);
  }
  cp_async_wait<0>();
  if (acc == kUnlikely) sink[blockIdx.x] = acc;
  if (threadIdx.x == 0) write_handoff(h, phase, before);
}

// Kiln's int8 products as they are: 2 blocks per SM of 8 warps, each warp streaming its own
// part of the block's share through 2 private stages of kWarpStageUnits words (32 lanes x 9
// words: a q4_0 group of 8 blocks, 144 bytes, a lane), the first issued before the wait, the
// next one issued as the current one is consumed; a lane consumes the 9 words of its group,
// which other lanes copied (hence __syncwarp after the copy's wait).
constexpr int kWarpStageUnits = kWarpSize * kGroupUnits;
constexpr int kWarpStages = 2;
constexpr size_t kWarpStageBytes = size_t(kConsumerWarps) * kWarpStages * kWarpStageUnits * 16;
template <bool kPrologue>
__global__ void __launch_bounds__(kThreads)
    chain_warp_phase(const uint4* region, unsigned long long units, Handoff h, unsigned* sink, int phase,
                     const float* x) {
  extern __shared__ uint4 warp_stages[];  // [warp][stage][kWarpStageUnits], then (kPrologue) x's int8 copy
  allow_next_kernel();
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const Share block_share = share_of(region, units, blockIdx.x, gridDim.x);
  const Share s = share_of(block_share.base, block_share.count, warp, kConsumerWarps);
  uint4* mine = warp_stages + size_t(warp) * kWarpStages * kWarpStageUnits;
  const unsigned items = (s.count + kWarpStageUnits - 1) / kWarpStageUnits;
  const auto issue = [&](unsigned item) {
    if (item < items) {
      uint4* slot = mine + (item % kWarpStages) * kWarpStageUnits;
      const unsigned first = item * kWarpStageUnits;
      for (unsigned u = lane; u < kWarpStageUnits && first + u < s.count; u += kWarpSize)
        cp_async_16(slot + u, s.base + first + u);
    }
    cp_async_commit();
  };
  issue(0);
  wait_for_previous_kernels();
  const unsigned before = threadIdx.x == 0 ? read_handoff(h, phase) : 0;
  unsigned acc = 0;
  if constexpr (kPrologue) acc = x_prologue(x, reinterpret_cast<uint8_t*>(warp_stages) + kWarpStageBytes);
  for (unsigned item = 0; item < items; ++item) {
    issue(item + 1);
    cp_async_wait<1>();
    __syncwarp();
    const uint4* slot = mine + (item % kWarpStages) * kWarpStageUnits;
    const unsigned first = item * kWarpStageUnits;
#pragma unroll
    for (int k = 0; k < kGroupUnits; ++k) {
      const unsigned u = lane * kGroupUnits + k;
      if (first + u < s.count) acc = fold(acc, slot[u]);
    }
    __syncwarp();  // the stage is refilled by the next issue
  }
  cp_async_wait<0>();
  if (acc == kUnlikely) sink[blockIdx.x] = acc;
  __syncthreads();  // the block's result is complete before it is handed over
  if (threadIdx.x == 0) write_handoff(h, phase, before);
}

// ---- the persistent kernels ----

// Waits that should last microseconds trap after kPatienceNs: a broken barrier or ring
// becomes a launch failure on the host instead of a hung machine.
struct Patience {
  unsigned polls = 0;
  unsigned long long since = 0;
  __device__ __forceinline__ void tick() {
    if ((++polls & 1023u) != 0) return;
    unsigned long long now;
    asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(now));
    if (since == 0) {
      since = now;
    } else if (now - since > kPatienceNs) {
      __trap();
    }
  }
};

__device__ __forceinline__ uint32_t smem(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

__device__ __forceinline__ void mbar_init(uint64_t* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem(bar)), "r"(count) : "memory");
}
// A thread's arrival (release, CTA scope) that also tells the barrier to expect `bytes`
// more bytes of asynchronous copies in its current phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem(bar)) : "memory");
}
// Until the phase of parity `parity` of the barrier has completed (acquire, CTA scope).
__device__ __forceinline__ void mbar_wait(uint64_t* bar, unsigned parity) {
  Patience patience;
  for (;;) {
    unsigned done;
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(smem(bar)), "r"(parity)
        : "memory");
    if (done) return;
    patience.tick();
  }
}
// `bytes` (a multiple of 16; both addresses 16-byte aligned) global -> shared by the copy
// engine; completion counts the bytes off `bar`'s expected transactions. The CTA's own
// shared addresses are valid shared::cluster addresses (a CTA outside a cluster is its own).
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, unsigned bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem(dst)),
               "l"(__cvta_generic_to_global(src)), "r"(bytes), "r"(smem(bar))
               : "memory");
}
__device__ __forceinline__ void consumer_barrier() {
  asm volatile("bar.sync %0, %1;\n" ::"n"(kConsumerBarrier), "n"(kThreads) : "memory");
}

struct PersistentArgs {
  const uint4* weights;
  Handoff handoff;
  unsigned* counter;  // phases finished, summed over blocks; zeroed before each step
  unsigned* sink;
  int slots;          // ring slots (ring kernel only)
  int chunk_units;    // 16-byte words per slot
};

// The producer (one lane): the block's chunks of every phase of the step, in the order the
// consumers take them. It waits only for empty slots, never for a phase barrier, so it is
// up to a ring ahead of the consumers across phase boundaries. Round n of a slot (parity
// n & 1) needs the consumers' round n - 1 of it: the empty barrier's phase of parity
// (n - 1) & 1. It may return with copies in flight: the consumers wait for all of them.
__device__ void produce(const PersistentArgs& a, uint4* ring, uint64_t* full, uint64_t* empty) {
  int slot = 0;
  unsigned parity = 0;
  bool first_round = true;
  const int phases = c_shape.phases();
  for (int phase = 0; phase < phases; ++phase) {
    const Share s = share_of(a.weights + c_shape.offset(phase), c_shape.units(phase), blockIdx.x, gridDim.x);
    for (unsigned first = 0; first < s.count; first += a.chunk_units) {
      const unsigned bytes = 16 * min(unsigned(a.chunk_units), s.count - first);
      if (!first_round) mbar_wait(empty + slot, parity ^ 1);
      mbar_arrive_expect_tx(full + slot, bytes);
      bulk_copy(ring + size_t(slot) * a.chunk_units, s.base + first, bytes, full + slot);
      if (++slot == a.slots) {
        slot = 0;
        parity ^= 1;
        first_round = false;
      }
    }
  }
}

// One kernel for the whole step; all its blocks must be resident (the host launches it
// cooperatively). Phase p > 0 waits for counter >= p * blocks. kRing: the ring as described
// above, 8 consumer warps + 1 producer warp; else the 8 warps load from global memory, with
// their first loads of a phase issued before its barrier.
template <bool kRing>
__global__ void __launch_bounds__(kRing ? kRingThreads : kThreads) persistent_step(PersistentArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ uint4 ring[];
  uint64_t* full = reinterpret_cast<uint64_t*>(ring + size_t(a.slots) * a.chunk_units);
  uint64_t* empty = full + a.slots;
  if constexpr (kRing) {
    if (threadIdx.x == 0) {
      for (int i = 0; i < a.slots; ++i) {
        mbar_init(full + i, 1);                 // the producer's arrive.expect_tx
        mbar_init(empty + i, kConsumerWarps);   // one arrival per consumer warp
      }
      asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();  // the last block-wide barrier: from here producer and consumers part
    if (threadIdx.x >= kThreads) {
      if (threadIdx.x == kThreads) produce(a, ring, full, empty);
      return;
    }
  }
  const int blocks = gridDim.x;
  const int phases = c_shape.phases();
  int slot = 0;
  unsigned parity = 0;  // of the slot's current round
  unsigned acc = 0;
  uint4 head[kHead];
  for (int phase = 0; phase < phases; ++phase) {
    const Share s = share_of(a.weights + c_shape.offset(phase), c_shape.units(phase), blockIdx.x, blocks);
    if constexpr (!kRing) load_head(s, head);  // weights: no wait needed
    if (phase > 0) {
      if (threadIdx.x == 0) {
        Patience patience;
        while (load_acquire(a.counter) < unsigned(phase) * unsigned(blocks)) patience.tick();
      }
      consumer_barrier();
    }
    const unsigned before = threadIdx.x == 0 ? read_handoff(a.handoff, phase) : 0;
    if constexpr (kRing) {
      for (unsigned first = 0; first < s.count; first += a.chunk_units) {
        const int n = int(min(unsigned(a.chunk_units), s.count - first));
        mbar_wait(full + slot, parity);
        const uint4* data = ring + size_t(slot) * a.chunk_units;
#pragma unroll 4
        for (int u = threadIdx.x; u < n; u += kThreads) acc = fold(acc, data[u]);
        __syncwarp();  // the whole warp's reads before its one arrival frees the slot
        if (threadIdx.x % kWarpSize == 0) mbar_arrive(empty + slot);
        if (++slot == a.slots) {
          slot = 0;
          parity ^= 1;
        }
      }
    } else {
      acc = stream_rest(s, head, acc);
    }
    consumer_barrier();  // the block's result is complete before it is handed over
    if (threadIdx.x == 0) {
      write_handoff(a.handoff, phase, before);
      add_release(a.counter, 1);
    }
  }
  if (acc == kUnlikely) a.sink[blockIdx.x] = acc;
#else
  __trap();  // the host runs nothing below sm_90
#endif
}

__global__ void fill_weights(uint4* w, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const unsigned h = unsigned(i) * 2654435761u ^ unsigned(i >> 32);
    w[i] = make_uint4(h, h ^ 0x5bd1e995u, h + 0x27d4eb2fu, ~h);
  }
}

// ---- host side ----

struct Options {
  const Preset* preset = &kPresets[0];
  int layers = 32;
  int ring_kb = 192;
  int chunk_kb = 8;
  int replays = 20;
};

void usage(FILE* f) {
  std::fprintf(f,
               "usage: %s [--preset q4_0|q8_0] [--layers N] [--ring-kb N] [--chunk-kb N] [--replays N]\n"
               "  --preset    phase sizes of Llama-3-8B's decode with q4_0 or q8_0 weights (default q4_0)\n"
               "  --layers    layers of 5 phases in the step (default 32)\n"
               "  --ring-kb   shared memory ring of persistent_ring, KB per block (default 192);\n"
               "              persistent_ring_2 gets half of it per block\n"
               "  --chunk-kb  one ring slot, one bulk copy at most (default 8)\n"
               "  --replays   timed replays per variant, median reported (default 20)\n",
               kProgram);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i], value;
    if (flag == "--help" || flag == "-h") {
      usage(stdout);
      std::exit(0);
    }
    if (const size_t eq = flag.find('='); eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag.resize(eq);
    } else if (i + 1 < argc) {
      value = argv[++i];
    }
    const auto number = [&](int lo, int hi) {
      char* end = nullptr;
      const long v = std::strtol(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || v < lo || v > hi) {
        std::fprintf(stderr, "%s: %s wants an integer in [%d, %d], got '%s'\n", kProgram, flag.c_str(), lo, hi,
                     value.c_str());
        std::exit(2);
      }
      return int(v);
    };
    if (flag == "--preset") {
      const Preset* found = nullptr;
      for (const Preset& p : kPresets) {
        if (value == p.name) found = &p;
      }
      if (!found) {
        std::fprintf(stderr, "%s: unknown preset '%s'\n", kProgram, value.c_str());
        std::exit(2);
      }
      o.preset = found;
    } else if (flag == "--layers") {
      o.layers = number(1, 1024);
    } else if (flag == "--ring-kb") {
      o.ring_kb = number(2, 1024);
    } else if (flag == "--chunk-kb") {
      o.chunk_kb = number(1, 512);
    } else if (flag == "--replays") {
      o.replays = number(1, 100000);
    } else {
      std::fprintf(stderr, "%s: unknown flag '%s'\n", kProgram, flag.c_str());
      usage(stderr);
      std::exit(2);
    }
  }
  if (o.ring_kb < 2 * o.chunk_kb) {
    std::fprintf(stderr, "%s: the ring needs 2 slots at least (--ring-kb >= 2 x --chunk-kb)\n", kProgram);
    std::exit(2);
  }
  return o;
}

struct Row {
  std::string name;
  int blocks;
  bool handoff;        // whether the step's values must all equal the phase count
  std::string skip;    // why it cannot run here; empty: it runs
  std::function<cudaError_t(cudaStream_t)> launch;
};

int occupancy(const void* kernel, int threads, size_t shared_bytes) {
  int n = 0;
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, shared_bytes), "occupancy");
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  const Options opt = parse(argc, argv);
  int devices = 0;
  const cudaError_t probe = cudaGetDeviceCount(&devices);
  if (probe != cudaSuccess || devices == 0) {
    std::printf("%s: no CUDA GPU present (%s); nothing measured\n", kProgram,
                probe != cudaSuccess ? cudaGetErrorString(probe) : "no devices");
    return 0;
  }
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "device properties");
  if (prop.major < 9) {
    std::printf("%s: %s is sm_%d%d; PDL, mbarriers and bulk copies need sm_90; nothing measured\n", kProgram,
                prop.name, prop.major, prop.minor);
    return 0;
  }
  const int sms = prop.multiProcessorCount;
  int clock_khz = 0;
  check(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0), "clock rate");

  // The step's layout: layer after layer, each layer's phases in order.
  StepShape shape{};
  shape.layers = opt.layers;
  for (int k = 0; k < kKinds; ++k) {
    shape.kind_units[k] = opt.preset->bytes[k] / 16;
    shape.kind_offset[k] = shape.layer_units;
    shape.layer_units += shape.kind_units[k];
  }
  const int phases = shape.phases();
  const unsigned long long step_units = shape.layer_units * opt.layers;
  const double step_bytes = 16.0 * double(step_units);
  check(cudaMemcpyToSymbol(c_shape, &shape, sizeof shape), "copy step shape");

  uint4* weights = nullptr;
  check(cudaMalloc(&weights, step_units * 16), "cudaMalloc weight buffer");
  fill_weights<<<4 * sms, 256>>>(weights, step_units);
  check(cudaGetLastError(), "fill_weights");
  check(cudaDeviceSynchronize(), "fill_weights");  // the timing stream does not wait for the default one

  // Shared memory and occupancy of each design.
  const size_t fat_bytes = size_t(kFatStages) * kFatStageUnits * 16;
  check(cudaFuncSetAttribute(chain_fat_phase<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(fat_bytes)),
        "chain_fat shared memory");
  check(cudaFuncSetAttribute(chain_fat_phase<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             int(fat_bytes + kXSharedBytes)),
        "chain_fat shared memory");
  check(cudaFuncSetAttribute(chain_warp_phase<false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             int(kWarpStageBytes)),
        "chain_warp shared memory");
  check(cudaFuncSetAttribute(chain_warp_phase<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             int(kWarpStageBytes + kXSharedBytes)),
        "chain_warp shared memory");
  const int chunk_units = opt.chunk_kb * 1024 / 16;
  const int slots1 = opt.ring_kb / opt.chunk_kb, slots2 = opt.ring_kb / 2 / opt.chunk_kb;
  const auto ring_bytes = [&](int slots) { return size_t(slots) * chunk_units * 16 + 2 * sizeof(uint64_t) * slots; };
  const bool ring1_fits = ring_bytes(slots1) <= prop.sharedMemPerBlockOptin;
  const bool ring2_fits = slots2 >= 2 && ring_bytes(slots2) <= prop.sharedMemPerBlockOptin;
  if (ring1_fits || ring2_fits) {
    const size_t most = ring1_fits ? ring_bytes(slots1) : ring_bytes(slots2);
    check(cudaFuncSetAttribute(persistent_step<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(most)),
          "persistent_ring shared memory");
  }
  const int floor_per_sm = occupancy(reinterpret_cast<const void*>(stream_floor), kThreads, 0);
  const auto per_sm = [&](auto kernel, size_t shared_bytes) {
    return occupancy(reinterpret_cast<const void*>(kernel), kThreads, shared_bytes);
  };
  const int fat_per_sm = std::min(per_sm(chain_fat_phase<false>, fat_bytes),
                                  per_sm(chain_fat_phase<true>, fat_bytes + kXSharedBytes));
  const int warp_per_sm = std::min(per_sm(chain_warp_phase<false>, kWarpStageBytes),
                                   per_sm(chain_warp_phase<true>, kWarpStageBytes + kXSharedBytes));
  const void* ring_kernel = reinterpret_cast<const void*>(persistent_step<true>);
  const int ring1_per_sm = ring1_fits ? occupancy(ring_kernel, kRingThreads, ring_bytes(slots1)) : 0;
  const int ring2_per_sm = ring2_fits ? occupancy(ring_kernel, kRingThreads, ring_bytes(slots2)) : 0;
  const int noring_per_sm = occupancy(reinterpret_cast<const void*>(persistent_step<false>), kThreads, 0);

  std::printf("device: %s, %d SMs, %.0f MHz, L2 %d MB\n", prop.name, sms, clock_khz / 1e3, prop.l2CacheSize >> 20);
  std::printf("step: preset %s, %d layers x %d phases, %.1f MB per step (%.2f MB per layer)\n", opt.preset->name,
              opt.layers, kKinds, step_bytes / 1e6, step_bytes / 1e6 / opt.layers);
  std::printf("ring: %d slots of %d KB per block (persistent_ring_2: %d slots); fat stages: %d x %d KB\n", slots1,
              opt.chunk_kb, slots2, kFatStages, kFatStageUnits * 16 / 1024);

  const int max_blocks = std::max({floor_per_sm, 8, 2, noring_per_sm}) * sms;
  unsigned *values = nullptr, *counter = nullptr, *sink = nullptr;
  check(cudaMalloc(&values, sizeof(unsigned) * 2 * max_blocks), "cudaMalloc values");
  check(cudaMalloc(&counter, 128), "cudaMalloc counter");
  check(cudaMalloc(&sink, sizeof(unsigned) * max_blocks), "cudaMalloc sink");
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  // The products' input vector of the "+x" rows (its values do not matter, only its reads).
  float* x = nullptr;
  check(cudaMalloc(&x, sizeof(float) * kXFloats), "cudaMalloc x");
  {
    std::vector<float> host_x(kXFloats);
    for (int i = 0; i < kXFloats; ++i) host_x[i] = float((i * 37) % 101 - 50) / 25.0f;
    check(cudaMemcpy(x, host_x.data(), sizeof(float) * kXFloats, cudaMemcpyHostToDevice), "copy x");
  }

  const auto chain = [&](auto kernel, size_t shared_bytes, int blocks) {
    return [=](cudaStream_t s) -> cudaError_t {
      const Handoff h{values, blocks};
      for (int p = 0; p < phases; ++p) {
        const cudaError_t e = launch_chained(kernel, dim3(blocks), dim3(kThreads), shared_bytes, s,
                                             static_cast<const uint4*>(weights + shape.offset(p)), shape.units(p), h,
                                             sink, p, static_cast<const float*>(x));
        if (e != cudaSuccess) return e;
      }
      return cudaSuccess;
    };
  };
  const auto persistent = [&](bool with_ring, int blocks, int slots) {
    return [=](cudaStream_t s) -> cudaError_t {
      const PersistentArgs a{weights, Handoff{values, blocks}, counter, sink, slots, chunk_units};
      cudaLaunchConfig_t config{};
      config.gridDim = dim3(blocks);
      config.blockDim = dim3(with_ring ? kRingThreads : kThreads);
      config.dynamicSmemBytes = with_ring ? ring_bytes(slots) : 0;
      config.stream = s;
      cudaLaunchAttribute cooperative{};  // refuses a grid that cannot be resident at once
      cooperative.id = cudaLaunchAttributeCooperative;
      cooperative.val.cooperative = 1;
      config.attrs = &cooperative;
      config.numAttrs = 1;
      return with_ring ? cudaLaunchKernelEx(&config, persistent_step<true>, a)
                       : cudaLaunchKernelEx(&config, persistent_step<false>, a);
    };
  };
  const auto need = [](bool ok, const char* why) { return ok ? std::string() : std::string(why); };

  std::vector<Row> rows;
  rows.push_back({"stream_floor", floor_per_sm * sms, false, "", [=](cudaStream_t s) {
                    stream_floor<<<floor_per_sm * sms, kThreads, 0, s>>>(weights, step_units, sink);
                    return cudaGetLastError();
                  }});
  // chain_regs: 4 words a thread before the wait, 8 blocks per SM; chain_regs9: 9 (a q4_0 group
  // of 8 blocks a lane, as a register-streaming product would hold it), 4 blocks per SM.
  const auto add_chain = [&](const std::string& name, auto kernel, size_t shared_bytes, int want_per_sm) {
    const int fits = per_sm(kernel, shared_bytes);
    rows.push_back({name, want_per_sm * sms, true,
                    need(fits >= want_per_sm, "fewer blocks per SM fit than the variant wants"),
                    chain(kernel, shared_bytes, want_per_sm * sms)});
  };
  add_chain("chain_regs", chain_regs_phase<kHead, 8, false>, 0, 8);
  add_chain("chain_regs+x", chain_regs_phase<kHead, 8, true>, 0, 8);
  add_chain("chain_regs9", chain_regs_phase<kGroupUnits, 4, false>, 0, 4);
  add_chain("chain_regs9+x", chain_regs_phase<kGroupUnits, 4, true>, 0, 4);
  add_chain("chain_lanes9+x", chain_lanes_phase<false>, 0, 4);
  add_chain("chain_lanes9_ldg+x", chain_lanes_phase<true>, 0, 4);
  add_chain("chain_fat", chain_fat_phase<false>, fat_bytes, 2);
  add_chain("chain_fat+x", chain_fat_phase<true>, fat_bytes + kXSharedBytes, 2);
  add_chain("chain_warp", chain_warp_phase<false>, kWarpStageBytes, 2);
  add_chain("chain_warp+x", chain_warp_phase<true>, kWarpStageBytes + kXSharedBytes, 2);
  (void)fat_per_sm;
  (void)warp_per_sm;
  rows.push_back({"persistent_ring", sms, true,
                  need(ring1_per_sm >= 1, "the ring does not fit in one block's shared memory"),
                  persistent(true, sms, slots1)});
  rows.push_back({"persistent_ring_2", 2 * sms, true,
                  need(ring2_per_sm >= 2, "2 blocks with half the ring each (2 slots at least) do not fit"),
                  persistent(true, 2 * sms, slots2)});
  rows.push_back({"persistent_noring", sms, true, need(noring_per_sm >= 1, "no block fits"),
                  persistent(false, sms, 0)});
  rows.push_back({"persistent_noring_full", noring_per_sm * sms, true, need(noring_per_sm >= 1, "no block fits"),
                  persistent(false, noring_per_sm * sms, 0)});

  for (int pass = 1; pass <= 2; ++pass) {
    std::printf("\npass %d: %-23s %6s %10s %9s %7s %7s %-8s %s\n", pass, "variant", "blocks", "us/step", "us/layer",
                "GB/s", "%floor", "timed_as", "handoff");
    double floor_gbs = 0;
    for (const Row& row : rows) {
      if (!row.skip.empty()) {
        std::printf("pass %d: %-23s skipped: %s\n", pass, row.name.c_str(), row.skip.c_str());
        continue;
      }
      const auto enqueue = [&]() -> cudaError_t {
        const size_t value_bytes = sizeof(unsigned) * 2 * max_blocks;
        if (const cudaError_t e = cudaMemsetAsync(values, 0, value_bytes, stream); e != cudaSuccess) return e;
        if (const cudaError_t e = cudaMemsetAsync(counter, 0, 128, stream); e != cudaSuccess) return e;
        return row.launch(stream);
      };
      bool as_graph = false;
      const double us = kiln::bench::median_replay_us(kProgram, stream, enqueue, opt.replays, as_graph);
      const char* verdict = "-";
      if (row.handoff) {
        // The last replay's values: row (phases & 1) was written by the last phase.
        std::vector<unsigned> got(row.blocks);
        check(cudaMemcpy(got.data(), values + (phases & 1) * row.blocks, sizeof(unsigned) * row.blocks,
                         cudaMemcpyDeviceToHost),
              "read back values");
        for (int b = 0; b < row.blocks; ++b) {
          if (got[b] != unsigned(phases)) {
            std::fprintf(stderr, "%s: %s, %d blocks: value[%d] = %u after the step, expected %d\n", kProgram,
                         row.name.c_str(), row.blocks, b, got[b], phases);
            return 1;
          }
        }
        verdict = "ok";
      }
      const double gbs = step_bytes / (us * 1e3);
      if (row.name == "stream_floor") floor_gbs = gbs;
      std::printf("pass %d: %-23s %6d %10.1f %9.2f %7.0f %6.1f%% %-8s %s\n", pass, row.name.c_str(), row.blocks, us,
                  us / opt.layers, gbs, floor_gbs > 0 ? 100.0 * gbs / floor_gbs : 0.0, as_graph ? "graph" : "direct",
                  verdict);
    }
  }
  check(cudaStreamDestroy(stream), "stream");
  check(cudaFree(weights), "cudaFree");
  check(cudaFree(values), "cudaFree");
  check(cudaFree(counter), "cudaFree");
  check(cudaFree(sink), "cudaFree");
  check(cudaFree(x), "cudaFree");
  return 0;
}
