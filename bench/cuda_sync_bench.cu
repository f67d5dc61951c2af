// What one handoff between thread blocks costs on the GPU, measured in isolation: a chain
// of tiny kernels (the decode graph's kernel boundary, with and without programmatic
// dependent launch) against one persistent kernel whose phases are separated by a barrier
// through global memory (a counter, cooperative groups' grid.sync(), or one counter per
// group of blocks, as 8 kv heads would depend only on their own producers).
//
// Every phase hands one float per block to another block: block b writes
// next[b] = cur[neighbour(b)] + 1, so after N phases every value is N, which the program
// checks (a missing or broken barrier shows as a wrong value, not as a fast time).
// The "+stream" rows also read 30 MB of a 1 GB buffer per phase (cold in L2), before the
// wait, as a decode product reads its weights: does the handoff hide behind memory traffic?
//
// Method: N phases captured once into a CUDA graph (a memset of the buffers first), replayed
// 200 times between events; median replay. us_per_phase = median / N at N = 128;
// marginal_us = (t(128) - t(32)) / 96, the cost of one more phase without the fixed costs
// of the replay and launch. The whole table is measured twice (pass 1, pass 2) to show the
// spread. KILN_CUDA_PDL=0 turns the chained launches of the "pdl" rows into plain ones.
//
//   bench_cuda_sync_bench        (no arguments; exits 0 with a message when no GPU is present)
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
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

constexpr int kThreads = 256;
constexpr int kGroups = 8;             // producer groups of the partial-dependency rows
constexpr int kCounterStride = 32;     // unsigned words between counters: one 128-byte line each
constexpr int kShortPhases = 32, kLongPhases = 128;
constexpr int kReplays = 200;
constexpr size_t kWindowBytes = size_t(30) << 20;  // read per phase by the "+stream" rows
constexpr int kWindows = 34;                       // 34 x 30 MB rotate over ~1 GB: cold in L2

constexpr const char* kProgram = "bench_cuda_sync_bench";

void check(cudaError_t e, const char* what) { kiln::bench::exit_on_cuda_error(kProgram, e, what); }

enum class Sync { kNone, kCounter, kGroups, kGridSync };

// What every variant's kernel gets. values: two rows of `blocks` floats (ping-pong between
// phases); counters: the full barrier's counter at [0], group g's at [(g + 1) * stride].
struct PhaseArgs {
  float* values;
  unsigned* counters;
  int blocks;
  int phases;
  const uint4* pool;   // kWindows windows of kWindowBytes; null: no streaming
  unsigned* sink;      // keeps the streamed sums alive
};


__host__ __device__ int group_of(int block) { return block % kGroups; }
__host__ __device__ int group_size(int group, int blocks) {
  return blocks / kGroups + (group < blocks % kGroups ? 1 : 0);
}
// The block whose value block b reads: another block of b's group, so that the group
// barrier alone orders the handoff.
__host__ __device__ int neighbour(int block, int blocks) {
  return block + kGroups < blocks ? block + kGroups : group_of(block);
}

// This block's share of phase p's window, 4 independent 16-byte loads in flight per thread.
__device__ void stream_window(const PhaseArgs& a, int phase) {
  if (a.pool == nullptr) return;
  const size_t window_u4 = kWindowBytes / 16;
  const size_t per_block = (window_u4 + a.blocks - 1) / a.blocks;
  const uint4* base = a.pool + size_t(phase % kWindows) * window_u4;
  const size_t begin = size_t(blockIdx.x) * per_block;
  const size_t end = min(begin + per_block, window_u4);
  unsigned acc = 0;
  for (size_t i = begin + threadIdx.x; i < end; i += 4 * kThreads) {
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) v[u] = i + u * kThreads < end ? __ldcs(base + i + u * kThreads) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < 4; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x9e3779b9u) a.sink[blockIdx.x] = acc;  // practically never; stops the loads being dropped
}

// One phase's handoff, done by thread 0: read a neighbour's value of the last phase, write ours.
__device__ __forceinline__ void hand_off(const PhaseArgs& a, int phase) {
  if (threadIdx.x != 0) return;
  const float* cur = a.values + (phase & 1) * a.blocks;
  float* next = a.values + ((phase + 1) & 1) * a.blocks;
  next[blockIdx.x] = __ldcg(cur + neighbour(blockIdx.x, a.blocks)) + 1.0f;
}

// (a) One phase per kernel. A chained launch lets the next kernel's blocks be scheduled at
// allow_next_kernel(); it waits for this one's results in wait_for_previous_kernels().
__global__ void __launch_bounds__(kThreads) chained_phase(PhaseArgs a, int phase) {
  if (a.pool == nullptr) {
    begin_chained_kernel();
  } else {
    allow_next_kernel();
    stream_window(a, phase);  // weights need no wait
    wait_for_previous_kernels();
  }
  hand_off(a, phase);
}

// (b, c, d) All phases in one kernel whose blocks are all resident. Phase p starts with a
// wait for every block (or every block of this block's group) to have finished phase p - 1:
// the counters only grow, so phase p waits for counter >= p * (blocks counted).
template <Sync kSync>
__global__ void __launch_bounds__(kThreads) persistent_phases(PhaseArgs a) {
  const int group = group_of(blockIdx.x);
  for (int phase = 0; phase < a.phases; ++phase) {
    stream_window(a, phase);
    if (phase > 0) {
      if constexpr (kSync == Sync::kGridSync) {
        cooperative_groups::this_grid().sync();
      } else if constexpr (kSync == Sync::kCounter || kSync == Sync::kGroups) {
        if (threadIdx.x == 0) {
          const unsigned* counter = kSync == Sync::kCounter ? a.counters : a.counters + (group + 1) * kCounterStride;
          const unsigned target = unsigned(phase) * unsigned(kSync == Sync::kCounter ? a.blocks : group_size(group, a.blocks));
          while (load_acquire(counter) < target) {
          }
        }
        __syncthreads();
      }
    }
    hand_off(a, phase);
    if constexpr (kSync == Sync::kCounter || kSync == Sync::kGroups) {
      __syncthreads();  // the whole block's writes before the release (here only thread 0 writes)
      if (threadIdx.x == 0) add_release(kSync == Sync::kCounter ? a.counters : a.counters + (group + 1) * kCounterStride, 1);
    }
  }
}

__global__ void fill_pool(uint4* pool, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const unsigned h = unsigned(i) * 2654435761u;
    pool[i] = make_uint4(h, h ^ 0x5bd1e995u, h + 0x27d4eb2fu, ~h);
  }
}


// ---- host side ----

struct Row {
  std::string name;
  int blocks;
  bool stream;
  bool checked;  // whether the final values must all equal the phase count
  std::function<cudaError_t(cudaStream_t, const PhaseArgs&)> launch;
};

cudaError_t launch_chain(cudaStream_t s, const PhaseArgs& a, bool pdl) {
  for (int p = 0; p < a.phases; ++p) {
    if (pdl) {
      const cudaError_t e = launch_chained(chained_phase, dim3(a.blocks), dim3(kThreads), 0, s, a, p);
      if (e != cudaSuccess) return e;
    } else {
      chained_phase<<<a.blocks, kThreads, 0, s>>>(a, p);
      if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
    }
  }
  return cudaSuccess;
}

template <Sync kSync>
cudaError_t launch_persistent(cudaStream_t s, const PhaseArgs& a) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(a.blocks);
  config.blockDim = dim3(kThreads);
  config.stream = s;
  cudaLaunchAttribute cooperative{};
  cooperative.id = cudaLaunchAttributeCooperative;
  cooperative.val.cooperative = 1;
  if (kSync == Sync::kGridSync) {
    config.attrs = &cooperative;
    config.numAttrs = 1;
  }
  return cudaLaunchKernelEx(&config, persistent_phases<kSync>, a);
}

template <Sync kSync>
int resident_blocks_per_sm() {
  int n = 0;
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, persistent_phases<kSync>, kThreads, 0), "occupancy");
  return n;
}

// Times `row` at `phases` phases and checks that the last phase left every value at `phases`.
double time_row(cudaStream_t s, const Row& row, PhaseArgs a, int phases, bool& as_graph) {
  a.blocks = row.blocks;
  a.phases = phases;
  if (!row.stream) a.pool = nullptr;
  const auto enqueue = [&]() -> cudaError_t {
    if (const cudaError_t e = cudaMemsetAsync(a.values, 0, sizeof(float) * row.blocks, s); e != cudaSuccess) return e;
    const size_t counter_bytes = sizeof(unsigned) * kCounterStride * (kGroups + 1);
    if (const cudaError_t e = cudaMemsetAsync(a.counters, 0, counter_bytes, s); e != cudaSuccess) return e;
    return row.launch(s, a);
  };
  const double us = kiln::bench::median_replay_us(kProgram, s, enqueue, kReplays, as_graph);
  if (row.checked) {
    std::vector<float> got(row.blocks);
    check(cudaMemcpy(got.data(), a.values + (phases & 1) * row.blocks, sizeof(float) * row.blocks, cudaMemcpyDeviceToHost),
          "read back values");
    for (int b = 0; b < row.blocks; ++b) {
      if (got[b] != float(phases)) {
        std::fprintf(stderr, "bench_cuda_sync_bench: %s, %d blocks, %d phases: value[%d] = %g, expected %d\n",
                     row.name.c_str(), row.blocks, phases, b, got[b], phases);
        std::exit(1);
      }
    }
  }
  return us;
}

}  // namespace

int main() {
  int devices = 0;
  const cudaError_t probe = cudaGetDeviceCount(&devices);
  if (probe != cudaSuccess || devices == 0) {
    std::printf("bench_cuda_sync_bench: no CUDA GPU present (%s); nothing measured\n",
                probe != cudaSuccess ? cudaGetErrorString(probe) : "no devices");
    return 0;
  }
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "device properties");
  if (prop.major < 9) {
    std::printf("bench_cuda_sync_bench: %s is sm_%d%d; these primitives need sm_90; nothing measured\n", prop.name,
                prop.major, prop.minor);
    return 0;
  }
  const int sms = prop.multiProcessorCount;
  const int per_sm = std::min({resident_blocks_per_sm<Sync::kNone>(), resident_blocks_per_sm<Sync::kCounter>(),
                               resident_blocks_per_sm<Sync::kGroups>(), resident_blocks_per_sm<Sync::kGridSync>()});
  const bool grid_sync_ok = prop.cooperativeLaunch != 0;
  std::printf("device: %s, %d multiprocessors, %d resident blocks of %d threads each, L2 %d MB, cooperative launch %s\n",
              prop.name, sms, per_sm, kThreads, prop.l2CacheSize >> 20, grid_sync_ok ? "yes" : "no");

  const int max_blocks = per_sm * sms;
  PhaseArgs args{};
  check(cudaMalloc(&args.values, sizeof(float) * 2 * max_blocks), "cudaMalloc values");
  check(cudaMalloc(&args.counters, sizeof(unsigned) * kCounterStride * (kGroups + 1)), "cudaMalloc counters");
  check(cudaMalloc(&args.sink, sizeof(unsigned) * max_blocks), "cudaMalloc sink");
  uint4* pool = nullptr;
  check(cudaMalloc(&pool, kWindowBytes * kWindows), "cudaMalloc 1 GB read buffer");
  fill_pool<<<4 * sms, kThreads>>>(pool, kWindowBytes * kWindows / 16);
  check(cudaGetLastError(), "fill_pool");
  args.pool = pool;
  cudaStream_t s;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");

  std::vector<Row> rows;
  for (const bool stream : {false, true}) {
    for (const int blocks : {sms, 2 * sms, max_blocks}) {
      const std::string tail = stream ? "+stream" : "";
      rows.push_back({"chained_plain" + tail, blocks, stream, true,
                      [](cudaStream_t st, const PhaseArgs& a) { return launch_chain(st, a, false); }});
      rows.push_back({"chained_pdl" + tail, blocks, stream, true,
                      [](cudaStream_t st, const PhaseArgs& a) { return launch_chain(st, a, true); }});
      rows.push_back({"barrier_counter" + tail, blocks, stream, true, launch_persistent<Sync::kCounter>});
      if (!stream) {
        if (grid_sync_ok) rows.push_back({"barrier_grid_sync", blocks, stream, true, launch_persistent<Sync::kGridSync>});
        rows.push_back({"groups8_counter", blocks, stream, true, launch_persistent<Sync::kGroups>});
      }
      // The persistent loop with no barrier at all: its values are racy (not checked); the
      // floor of the loop itself, and with +stream the floor of the reads.
      rows.push_back({"no_sync" + tail, blocks, stream, false, launch_persistent<Sync::kNone>});
    }
  }

  for (int pass = 1; pass <= 2; ++pass) {
    std::printf("\npass %d: %-26s %6s %6s %12s %11s %9s %s\n", pass, "variant", "blocks", "phases", "us_per_phase",
                "marginal_us", "read_GB/s", "timed_as");
    for (const Row& row : rows) {
      bool graph_short = false, graph_long = false;
      const double t_short = time_row(s, row, args, kShortPhases, graph_short);
      const double t_long = time_row(s, row, args, kLongPhases, graph_long);
      const double per_phase = t_long / kLongPhases;
      const double marginal = (t_long - t_short) / (kLongPhases - kShortPhases);
      char bandwidth[32] = "-";
      if (row.stream) std::snprintf(bandwidth, sizeof bandwidth, "%.0f", kWindowBytes / (marginal * 1e3));
      std::printf("pass %d: %-26s %6d %6d %12.2f %11.2f %9s %s\n", pass, row.name.c_str(), row.blocks, kLongPhases,
                  per_phase, marginal, bandwidth, graph_short && graph_long ? "graph" : "direct");
    }
  }
  check(cudaStreamDestroy(s), "stream");
  check(cudaFree(pool), "cudaFree");
  check(cudaFree(args.values), "cudaFree");
  check(cudaFree(args.counters), "cudaFree");
  check(cudaFree(args.sink), "cudaFree");
  return 0;
}
