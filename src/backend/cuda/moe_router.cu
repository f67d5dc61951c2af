// The MoE layer's front in one launch (ops_extra.h's moe_norm_route): RMS norm, router
// logits, routing. It replaces three chained launches (rmsnorm, the f32 router matvec,
// moe_route), each boundary ~2-3 us of a decode step.
//
// Grid (ceil(n_expert / kRouterWarps), tokens), one router row per warp. Each block:
//   1. loads its warp's row of the router and the norm weights (no kernel writes them) into
//      registers before it waits for the kernel before, so their latency hides behind it;
//   2. reads x (one 16-byte load per 4 values, all issued at once), computes the norm
//      (rmsnorm()'s formula) into shared memory and writes its share of the normed row;
//   3. each warp: one logit (+ bias) to global memory;
//   4. takes a ticket; the block that takes the token's last one reads all logits back
//      (after a fence; the others' writes precede their tickets) and routes the token with
//      moe_route's warp routine, then sets the ticket back to zero for the next launch.
// Deterministic: each logit is one warp's fixed-order sum, the routing sees them all.
//
// Where a token's blocks fit one thread block cluster (at most kMaxClusterBlocks: 128
// experts), step 4 is instead: each warp also writes its logit into the shared memory of the
// cluster's first block, the cluster meets at its barrier, and that block routes the token
// from its own shared memory. This drops the chain of global round trips at the end (the
// fence after the logit stores, the ticket's atomic, the last block's fence and its reads of
// the logits back through L2). KILN_CUDA_ROUTER_CLUSTER=0 keeps the tickets.
// (v1 read x and the norm weights in loops of dependent 4-byte loads, with global stores
// between them: ~16 L2 round trips after the wait, 13.5 us per layer in the chained graph
// against ~10 for the three kernels it replaced.)
#include <cooperative_groups.h>

#include <string>

#include "backend/cuda/env_switch.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/matvec.h"
#include "backend/cuda/moe_route.cuh"

namespace kiln::cuda {
namespace router_detail {

using detail::kWarpSize;

constexpr int kRouterWarps = 8;
constexpr int kRouterThreads = kRouterWarps * kWarpSize;
// Columns of a router row held in registers from before the wait: 16 float4 per lane.
constexpr int kPrefetchVecs = 16;
constexpr int64_t kPrefetchCols = int64_t(kPrefetchVecs) * kWarpSize * 4;
// x and the norm weights: up to 8 float4 per thread, held in registers sized to the width (2 up
// to 2048 values: 48 registers a thread fewer than 8, for room beside other kernels' blocks).
constexpr int kXVecs = 8;
constexpr int kNarrowXVecs = 2;
constexpr int64_t kMaxEmbd = int64_t(kXVecs) * kRouterThreads * 4;  // 8192: 32 KB of shared memory
constexpr int64_t kNarrowMaxEmbd = int64_t(kNarrowXVecs) * kRouterThreads * 4;  // 2048
// A cluster of up to 16 blocks (a non-portable size above 8): 128 experts, one a warp.
constexpr int kMaxClusterBlocks = 16;
constexpr int kMaxClusterExperts = kMaxClusterBlocks * kRouterWarps;

// Routes token t from its logits in shared memory with the whole block (the cluster's first
// block): route_detail::rank_in_block, then warp 0 finishes.
template <int kPerLane>
__device__ __forceinline__ void route_in_block(const MoeRouteArgs& a, int64_t t, const float* logits) {
  __shared__ int slot_id[route_detail::kMaxUsed];
  __shared__ float slot_score[route_detail::kMaxUsed];
  route_detail::rank_in_block<kPerLane, kRouterThreads>(a, [&](int e) { return logits[e]; }, slot_id, slot_score);
  if (threadIdx.x / kWarpSize == 0) {
    const int lane = threadIdx.x % kWarpSize;
    const bool slot = lane < a.n_used;
    route_detail::finish_route(a, t, slot ? slot_id[lane] : 0, slot ? slot_score[lane] : 0.0f);
  }
}

template <int kPerLane, bool kCluster, int kVecs = kXVecs>
__global__ void __launch_bounds__(kRouterThreads) moe_norm_route_kernel(MoeNormRouteArgs a, bool ranked) {
  extern __shared__ __align__(16) float4 xs[];  // the normed row [n_embd / 4]
  __shared__ float cluster_logits[kCluster ? kMaxClusterExperts : 1];  // the first block's: all logits
  __shared__ float partial[kRouterWarps];
  __shared__ bool last;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int64_t t = blockIdx.y, n4 = a.n_embd / 4;
  const int64_t row = int64_t(blockIdx.x) * kRouterWarps + warp;
  const bool owns_row = row < a.route.n_expert;
  const float4* w = reinterpret_cast<const float4*>(a.router + (owns_row ? row : 0) * a.router_stride);
  const float4* norm4 = reinterpret_cast<const float4*>(a.norm_weight);

  float4 wv[kPrefetchVecs], nw[kVecs];
#pragma unroll
  for (int i = 0; i < kPrefetchVecs; ++i) {
    const int64_t v = int64_t(i) * kWarpSize + lane;
    wv[i] = v < n4 ? __ldg(w + v) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
#pragma unroll
  for (int s = 0; s < kVecs; ++s) {
    const int64_t v = int64_t(s) * kRouterThreads + threadIdx.x;
    nw[s] = norm4 && v < n4 ? __ldg(norm4 + v) : make_float4(1.0f, 1.0f, 1.0f, 1.0f);
  }
  detail::begin_chained_kernel();

  const float4* x4 = reinterpret_cast<const float4*>(a.x + t * a.x_stride);
  float4 xv[kVecs];
  float sum_sq = 0.0f;
#pragma unroll
  for (int s = 0; s < kVecs; ++s) {
    const int64_t v = int64_t(s) * kRouterThreads + threadIdx.x;
    xv[s] = v < n4 ? x4[v] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
#pragma unroll
  for (int s = 0; s < kVecs; ++s) {
    sum_sq = fmaf(xv[s].x, xv[s].x, sum_sq), sum_sq = fmaf(xv[s].y, xv[s].y, sum_sq);
    sum_sq = fmaf(xv[s].z, xv[s].z, sum_sq), sum_sq = fmaf(xv[s].w, xv[s].w, sum_sq);
  }
  const float inv = rsqrtf(detail::block_sum<kRouterWarps>(sum_sq, partial) / float(a.n_embd) + a.eps);  // rmsnorm()'s
  float4* normed4 = reinterpret_cast<float4*>(a.normed + t * a.normed_stride);
#pragma unroll
  for (int s = 0; s < kVecs; ++s) {
    const int64_t v = int64_t(s) * kRouterThreads + threadIdx.x;
    if (v >= n4) break;
    // (x * inv) * weight, rounded at each step as rmsnorm() does; no weight: times 1, exact.
    const float4 out = make_float4(__fmul_rn(__fmul_rn(xv[s].x, inv), nw[s].x), __fmul_rn(__fmul_rn(xv[s].y, inv), nw[s].y),
                                   __fmul_rn(__fmul_rn(xv[s].z, inv), nw[s].z), __fmul_rn(__fmul_rn(xv[s].w, inv), nw[s].w));
    xs[v] = out;
    if (s % int(gridDim.x) == int(blockIdx.x)) normed4[v] = out;  // each block writes a share
  }
  // The int8 copy, each block a share of the warps' steps: a warp's 32 float4 are 4 blocks of
  // 32 values, 8 lanes each (n_embd % 32 == 0: a block's lanes are all in the row or all out;
  // those out only join the shuffles).
  if (a.q8) {
    uint8_t* row = a.q8 + t * a.q8_row_bytes;
    float2* ds = reinterpret_cast<float2*>(row + (a.n_embd + 15) / 16 * 16);
#pragma unroll
    for (int s = 0; s < kVecs; ++s) {
      const int64_t v = int64_t(s) * kRouterThreads + threadIdx.x;
      if (v - lane >= n4) break;  // the whole warp past the row
      if ((s * kRouterWarps + warp) % int(gridDim.x) != int(blockIdx.x)) continue;
      const bool in_row = v < n4;
      const float4 out = in_row ? xs[v] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      const float four[4] = {out.x, out.y, out.z, out.w};
      detail::quantize_block_spread<8, 4>(four, reinterpret_cast<int8_t*>(row) + 4 * v, ds + v / 8, in_row);
    }
  }
  __syncthreads();

  if (owns_row) {
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < kPrefetchVecs; ++i) {
      const int64_t v = int64_t(i) * kWarpSize + lane;
      if (v < n4) {
        const float4 xn = xs[v];
        acc = fmaf(wv[i].x, xn.x, acc), acc = fmaf(wv[i].y, xn.y, acc);
        acc = fmaf(wv[i].z, xn.z, acc), acc = fmaf(wv[i].w, xn.w, acc);
      }
    }
    for (int64_t v = kPrefetchCols / 4 + lane; v < n4; v += kWarpSize) {  // wider rows
      const float4 wr = __ldg(w + v), xn = xs[v];
      acc = fmaf(wr.x, xn.x, acc), acc = fmaf(wr.y, xn.y, acc);
      acc = fmaf(wr.z, xn.z, acc), acc = fmaf(wr.w, xn.w, acc);
    }
    acc = detail::warp_sum(acc);
    const float logit = acc + (a.router_bias ? a.router_bias[row] : 0.0f);
    if (lane == 0) a.logits[t * a.route.logits_stride + row] = logit;
    if constexpr (kCluster)
      if (lane == 0) cooperative_groups::this_cluster().map_shared_rank(cluster_logits, 0)[row] = logit;
  }

  if constexpr (kCluster) {  // the cluster's first block routes from its shared memory
    cooperative_groups::this_cluster().sync();
    if (blockIdx.x != 0) return;
    if (ranked)
      route_in_block<kPerLane>(a.route, t, cluster_logits);
    else if (warp == 0)
      route_detail::route_token<kPerLane>(a.route, t, [&](int e) { return cluster_logits[e]; });
    return;
  }

  // The last block of this token routes it.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(a.tickets + t, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  if (warp == 0) route_detail::route_token<kPerLane>(a.route, t);
  if (threadIdx.x == 0) a.tickets[t] = 0;
}

// KILN_CUDA_ROUTER_CLUSTER=0: the per-token tickets even where a token's blocks fit a cluster.
bool router_clusters_allowed() {
  static const bool allowed = !env_is("KILN_CUDA_ROUTER_CLUSTER", "0");
  return allowed;
}

// KILN_CUDA_ROUTER_NARROW=0: the cluster kernel holds x in registers for 8192 values whatever
// the width (kXVecs) instead of for 2048 where the model's width allows (kNarrowXVecs).
bool narrow_registers_allowed() {
  static const bool allowed = !env_is("KILN_CUDA_ROUTER_NARROW", "0");
  return allowed;
}

// KILN_CUDA_ROUTE_RANKED=0: the cluster's first block routes with warp 0's k rounds
// (route_token) instead of route_in_block.
bool ranked_routing_allowed() {
  static const bool allowed = !env_is("KILN_CUDA_ROUTE_RANKED", "0");
  return allowed;
}

// Whether one cluster of `blocks` blocks of this kernel fits the device (sizes above 8 are
// non-portable: allowed on the kernel first).
template <auto kernel>
bool cluster_fits(int blocks, size_t shared) {
  if (blocks > 8 &&
      cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(unsigned(blocks), 1, 1);
  config.blockDim = dim3(kRouterThreads);
  config.dynamicSmemBytes = shared;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = unsigned(blocks), attribute.val.clusterDim.y = 1, attribute.val.clusterDim.z = 1;
  config.attrs = &attribute, config.numAttrs = 1;
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &config) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return clusters > 0;
}

// cluster_fits, asked once per kernel and size (with the shared memory of the first launch of
// that size: n_embd floats, one width per model).
template <auto kernel>
bool cluster_launchable(int blocks, size_t shared) {
  static int known[kMaxClusterBlocks + 1] = {};  // 0 not asked, 1 yes, 2 no
  if (known[blocks] == 0) known[blocks] = cluster_fits<kernel>(blocks, shared) ? 1 : 2;
  return known[blocks] == 1;
}

}  // namespace router_detail

bool moe_norm_route_fits(const MoeNormRouteArgs& a) {
  using namespace router_detail;
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return a.n_embd > 0 && a.n_embd % 4 == 0 && a.n_embd <= kMaxEmbd && aligned(a.router) && a.router_stride % 4 == 0 &&
         aligned(a.x) && a.x_stride % 4 == 0 && aligned(a.normed) && a.normed_stride % 4 == 0 &&
         aligned(a.norm_weight) &&
         a.route.n_tokens > 0 && a.route.n_tokens <= 65535 && a.tickets && a.logits && a.route.logits == a.logits &&
         (!a.q8 || q8_rows_fit(a.q8, a.q8_row_bytes, a.n_embd)) &&
         route_detail::route_refusal(a.route).empty();
}

Status moe_norm_route(const MoeNormRouteArgs& a, cudaStream_t stream) {
  using namespace router_detail;
  if (!moe_norm_route_fits(a)) {
    const std::string why = route_detail::route_refusal(a.route);
    return Status::invalid("moe_norm_route: " + (why.empty() ? "width " + std::to_string(a.n_embd) +
                                                                   " (a multiple of 4 up to " +
                                                                   std::to_string(kMaxEmbd) +
                                                                   ") or the 16-byte alignment of x, normed, the norm "
                                                                   "weights, the router rows or the int8 copy's rows "
                                                                   "does not fit"
                                                             : why));
  }
  const dim3 grid(unsigned((a.route.n_expert + kRouterWarps - 1) / kRouterWarps), unsigned(a.route.n_tokens));
  const size_t shared = size_t(a.n_embd) * sizeof(float);
  const cudaError_t e = route_detail::visit_per_lane(a.route.n_expert, [&](auto per_lane) {
    constexpr int kPerLane = decltype(per_lane)::value;
    if constexpr (kPerLane * kWarpSize <= kMaxClusterExperts) {  // grid.x <= kMaxClusterBlocks
      if (!a.tickets_only && router_clusters_allowed()) {
        const bool narrow = a.n_embd <= kNarrowMaxEmbd && narrow_registers_allowed();
        constexpr auto wide = moe_norm_route_kernel<kPerLane, true>;
        constexpr auto slim = moe_norm_route_kernel<kPerLane, true, kNarrowXVecs>;
        if (narrow && cluster_launchable<slim>(int(grid.x), shared))
          return launch_chained_in_clusters(slim, grid, dim3(grid.x, 1, 1), dim3(kRouterThreads), shared, stream, a,
                                            ranked_routing_allowed());
        if (cluster_launchable<wide>(int(grid.x), shared))
          return launch_chained_in_clusters(wide, grid, dim3(grid.x, 1, 1), dim3(kRouterThreads), shared, stream, a,
                                            ranked_routing_allowed());
      }
    }
    return launch_chained(moe_norm_route_kernel<kPerLane, false>, grid, dim3(kRouterThreads), shared, stream, a,
                          false);
  });
  if (e != cudaSuccess) return Status::from_cuda(e, "moe_norm_route_kernel");
  return launch_status("moe_norm_route_kernel");
}

}  // namespace kiln::cuda
