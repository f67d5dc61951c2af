// The router's logits for a prefill batch (router_logits.h). Grid (expert tiles, token
// tiles, k shares); the k shares of one tile are one cluster.
//
// Each block: 256 threads, a 64 x 64 tile of outputs, thread (ty, tx) = (tid / 16, tid % 16)
// owns tokens ty + 16 i and experts tx + 16 j (i, j < 4). Its k share goes through shared
// memory in steps of 32: the x rows and router rows of the step as they lie in memory (pitch
// 36 floats, so that the eight 16-byte reads of a quarter warp - eight router rows at one k -
// hit eight different bank groups), the next step's loads in registers while this one is
// summed. Per step and thread: 8 shared 16-byte reads, 64 FMA, k in ascending order.
// Then the block leaves its 64 x 64 partial sums in shared memory, the cluster syncs, and
// the cluster's blocks each add up a share of the tile's outputs over the ranks in order.
//
// Placement (router_logits.h): v1 left it to the default cluster policy and measured 24 us
// in the prefill op profile (cuBLAS: 20.5), about 3x the estimate below; three instances that
// differ only in where their blocks go measured 24.1 / 23.4 / 29.6 us, so crowding was not
// the cause. Not yet measured, the next suspect: one step of register prefetch with one block
// (8 warps) per SM leaves each 32-k step waiting on an L2 round trip (~1 us, against ~0.75 us
// of FMA per step); a cp.async pipeline of 3-4 stages would hide it.
//
// Floor at T = 512, K = 2048, E = 128: 134 M FMA; the f32 FMA rate of 132 SMs (~33 T/s)
// gives 4 us; bytes (4 MB of x, 1 MB of router, 0.25 MB out) 1.3 us at 4.2 TB/s.
#include <cooperative_groups.h>

#include "backend/cuda/common.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/router_logits.h"

namespace kiln::cuda {
namespace router_logits_detail {

namespace cg = cooperative_groups;
using detail::kWarpSize;

constexpr int kTile = 64;         // tokens and experts per block
constexpr int kStep = 32;         // k per shared-memory step
constexpr int kThreads = 256;
constexpr int kPitch = kStep + 4;  // floats per staged row
constexpr int kPartPitch = kTile;  // floats per row of the partial sums
constexpr int kMaxShares = 8;      // a portable cluster
constexpr int64_t kShareTarget = 256;  // k per block where k allows
// With the 34 KB of static shared memory, more than half of an SM's 228 KB: one block per SM.
constexpr size_t kOnePerSmReserve = size_t(100) << 10;

// The step's 64 rows x 32 k of a [rows][k] matrix: two 16-byte pieces per thread (row =
// piece / 8, columns piece % 8 * 4 ..), zero past the rows or past k_end.
__device__ __forceinline__ void load_step(const float* m, int64_t stride, int64_t first_row, int64_t n_rows, int64_t k0,
                                          int64_t k_end, float4 (&r)[2]) {
#pragma unroll
  for (int p = 0; p < 2; ++p) {
    const int piece = threadIdx.x + p * kThreads;
    const int64_t row = first_row + piece / 8, k = k0 + (piece % 8) * 4;
    r[p] = row < n_rows && k < k_end ? __ldg(reinterpret_cast<const float4*>(m + row * stride + k))
                                     : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
}

__device__ __forceinline__ void stage(float* s, const float4 (&r)[2]) {
#pragma unroll
  for (int p = 0; p < 2; ++p) {
    const int piece = threadIdx.x + p * kThreads;
    *reinterpret_cast<float4*>(s + (piece / 8) * kPitch + (piece % 8) * 4) = r[p];
  }
}

// kPlacement: 0 default, 1 spread, 2 one block per SM (the launch reserves kOnePerSmReserve
// bytes of dynamic shared memory that the kernel never touches); the code is the same.
template <int kPlacement>
__global__ void __launch_bounds__(kThreads) router_logits_kernel(RouterLogitsArgs a, int64_t chunk) {
  __shared__ __align__(16) float xs[kTile * kPitch];
  __shared__ __align__(16) float ws[kTile * kPitch];
  __shared__ __align__(16) float part[kTile * kPartPitch];
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = int(cluster.block_rank()), shares = int(cluster.num_blocks());
  const int64_t e0 = int64_t(blockIdx.x) * kTile, t0 = int64_t(blockIdx.y) * kTile;
  const int64_t k_begin = detail::min64(int64_t(rank) * chunk, a.k), k_end = detail::min64(k_begin + chunk, a.k);
  const int steps = int((k_end - k_begin + kStep - 1) / kStep);
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;

  float acc[4][4] = {};
  float4 xr[2], wr[2];
  // The router's first step before the wait (no kernel writes it), x after.
  if (steps > 0) load_step(a.router, a.router_stride, e0, a.n_expert, k_begin, k_end, wr);
  detail::begin_chained_kernel();
  if (steps > 0) load_step(a.x, a.x_stride, t0, a.n_tokens, k_begin, k_end, xr);
  for (int s = 0; s < steps; ++s) {
    stage(xs, xr), stage(ws, wr);
    __syncthreads();
    if (s + 1 < steps) {
      const int64_t k0 = k_begin + int64_t(s + 1) * kStep;
      load_step(a.x, a.x_stride, t0, a.n_tokens, k0, k_end, xr);
      load_step(a.router, a.router_stride, e0, a.n_expert, k0, k_end, wr);
    }
#pragma unroll
    for (int kk = 0; kk < kStep; kk += 4) {
      float4 xv[4], wv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) xv[i] = *reinterpret_cast<const float4*>(xs + (ty + 16 * i) * kPitch + kk);
#pragma unroll
      for (int j = 0; j < 4; ++j) wv[j] = *reinterpret_cast<const float4*>(ws + (tx + 16 * j) * kPitch + kk);
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          float v = acc[i][j];
          v = fmaf(xv[i].x, wv[j].x, v), v = fmaf(xv[i].y, wv[j].y, v);
          v = fmaf(xv[i].z, wv[j].z, v), v = fmaf(xv[i].w, wv[j].w, v);
          acc[i][j] = v;
        }
    }
    __syncthreads();  // the next step overwrites xs and ws
  }

#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) part[(ty + 16 * i) * kPartPitch + tx + 16 * j] = acc[i][j];
  cluster.sync();  // every rank's partial sums in place

  // Rank r adds up outputs r * 256 + tid, then every shares * 256-th, over the ranks in order
  // (all ranks' values requested before the first add).
  for (int o = rank * kThreads + int(threadIdx.x); o < kTile * kTile; o += shares * kThreads) {
    const int row = o / kTile, col = o % kTile;
    const int64_t t = t0 + row, e = e0 + col;
    float share[kMaxShares];
#pragma unroll
    for (int r = 0; r < kMaxShares; ++r)
      share[r] = r < shares ? cluster.map_shared_rank(part, r)[row * kPartPitch + col] : 0.0f;
    float sum = 0.0f;
#pragma unroll
    for (int r = 0; r < kMaxShares; ++r)
      if (r < shares) sum += share[r];
    if (t < a.n_tokens && e < a.n_expert) a.logits[t * a.logits_stride + e] = a.bias ? sum + a.bias[e] : sum;
  }
  cluster.sync();  // no block leaves while another still reads its partial sums
}

}  // namespace router_logits_detail

RouterSplit router_logits_split(int64_t k) {
  using namespace router_logits_detail;
  RouterSplit s;
  const int64_t want = (k + kShareTarget - 1) / kShareTarget;
  s.blocks = int(want < 1 ? 1 : want > kMaxShares ? kMaxShares : want);
  const int64_t per = (k + s.blocks - 1) / s.blocks;
  s.chunk = (per + kStep - 1) / kStep * kStep;
  return s;
}

std::string router_logits_refusal(const RouterLogitsArgs& a) {
  using namespace router_logits_detail;
  if (!a.x || !a.router || !a.logits) return "x, router and logits must be set";
  if (a.n_tokens <= 0 || a.n_expert <= 0 || a.k <= 0) return "empty shape";
  if (a.k % 4 != 0) return "k " + std::to_string(a.k) + " is not a multiple of 4";
  if (!detail::aligned16(a.x) || !detail::aligned16(a.router) || a.x_stride % 4 != 0 || a.router_stride % 4 != 0 ||
      a.x_stride < a.k || a.router_stride < a.k)
    return "rows of x and of the router must start 16-byte aligned and hold k values";
  if (a.logits_stride < a.n_expert) return "the logits' row stride is shorter than a row";
  if ((a.n_tokens + kTile - 1) / kTile > 65535 || (a.n_expert + kTile - 1) / kTile > 65535)
    return "too many tokens or experts for the grid";
  return {};
}

Status router_logits(const RouterLogitsArgs& a, cudaStream_t stream) {
  using namespace router_logits_detail;
  if (const std::string why = router_logits_refusal(a); !why.empty()) return Status::invalid("router_logits: " + why);
  const RouterSplit split = router_logits_split(a.k);
  const dim3 grid(unsigned((a.n_expert + kTile - 1) / kTile), unsigned((a.n_tokens + kTile - 1) / kTile),
                  unsigned(split.blocks));
  // Each placement its own instance of the kernel: the policy is an attribute of the function.
  auto* kernel = a.placement == RouterPlacement::Spread     ? router_logits_kernel<1>
                 : a.placement == RouterPlacement::OnePerSm ? router_logits_kernel<2>
                                                            : router_logits_kernel<0>;
  const size_t reserve = a.placement == RouterPlacement::OnePerSm ? kOnePerSmReserve : 0;
  // Each instance's attribute once, when it is first used.
  if (a.placement == RouterPlacement::Spread) {
    static const cudaError_t spread =
        cudaFuncSetAttribute(router_logits_kernel<1>, cudaFuncAttributeClusterSchedulingPolicyPreference,
                             int(cudaClusterSchedulingPolicySpread));
    if (spread != cudaSuccess) return Status::from_cuda(spread, "router_logits_kernel (spread policy)");
  }
  if (a.placement == RouterPlacement::OnePerSm) {
    static const cudaError_t reserved = cudaFuncSetAttribute(
        router_logits_kernel<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kOnePerSmReserve));
    if (reserved != cudaSuccess) return Status::from_cuda(reserved, "router_logits_kernel (shared-memory reserve)");
  }
  const cudaError_t e = launch_chained_in_clusters(kernel, grid, dim3(1, 1, unsigned(split.blocks)), dim3(kThreads),
                                                   reserve, stream, a, split.chunk);
  if (e != cudaSuccess) return Status::from_cuda(e, "router_logits_kernel");
  return launch_status("router_logits_kernel");
}

}  // namespace kiln::cuda
