// The MoE layer's front in one launch (ops_extra.h's moe_norm_route): RMS norm, router
// logits, routing. It replaces three chained launches (rmsnorm, the f32 router matvec,
// moe_route), each boundary ~2-3 us of a decode step.
//
// Grid (ceil(n_expert / kRouterWarps), tokens), one router row per warp. Each block:
//   1. loads its warp's row of the router (no kernel writes it) into registers before it
//      waits for the kernel before, so the weights' latency hides behind that kernel;
//   2. reads x, computes the norm (rmsnorm()'s formula) into shared memory and writes its
//      share of the normed row;
//   3. each warp: one logit (+ bias) to global memory;
//   4. takes a ticket; the block that takes the token's last one reads all logits back
//      (after a fence; the others' writes precede their tickets) and routes the token with
//      moe_route's warp routine, then sets the ticket back to zero for the next launch.
// Deterministic: each logit is one warp's fixed-order sum, the routing sees them all.
#include <string>

#include "backend/cuda/launch.cuh"
#include "backend/cuda/moe_route.cuh"

namespace kiln::cuda {
namespace router_detail {

using detail::kWarpSize;

constexpr int kRouterWarps = 4;
constexpr int kRouterThreads = kRouterWarps * kWarpSize;
// Columns of a router row held in registers from before the wait: 16 float4 per lane.
constexpr int kPrefetchVecs = 16;
constexpr int64_t kPrefetchCols = int64_t(kPrefetchVecs) * kWarpSize * 4;
constexpr int64_t kMaxEmbd = 8192;  // the normed row in shared memory: 32 KB

template <int kPerLane>
__global__ void __launch_bounds__(kRouterThreads) moe_norm_route_kernel(MoeNormRouteArgs a) {
  extern __shared__ __align__(16) float xs[];  // the normed row [n_embd]
  __shared__ float partial[kRouterWarps];
  __shared__ bool last;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int64_t t = blockIdx.y, n = a.n_embd;
  const int64_t row = int64_t(blockIdx.x) * kRouterWarps + warp;
  const bool owns_row = row < a.route.n_expert;
  const float4* w = reinterpret_cast<const float4*>(a.router + (owns_row ? row : 0) * a.router_stride);

  float4 wv[kPrefetchVecs];
#pragma unroll
  for (int i = 0; i < kPrefetchVecs; ++i) {
    const int64_t v = int64_t(i) * kWarpSize + lane;
    wv[i] = 4 * v < n ? __ldg(w + v) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  detail::begin_chained_kernel();

  const float* x = a.x + t * a.x_stride;
  float sum_sq = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += kRouterThreads) {
    const float v = x[i];
    xs[i] = v;
    sum_sq = fmaf(v, v, sum_sq);
  }
  const float inv = rsqrtf(detail::block_sum<kRouterWarps>(sum_sq, partial) / float(n) + a.eps);  // rmsnorm()'s
  float* normed = a.normed + t * a.normed_stride;
  for (int64_t i = threadIdx.x; i < n; i += kRouterThreads) {
    const float v = __fmul_rn(xs[i], inv);
    const float out = a.norm_weight ? __fmul_rn(v, a.norm_weight[i]) : v;
    xs[i] = out;
    if ((i / kRouterThreads) % gridDim.x == blockIdx.x) normed[i] = out;  // each block writes a share
  }
  __syncthreads();

  if (owns_row) {
    const float4* x4 = reinterpret_cast<const float4*>(xs);
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < kPrefetchVecs; ++i) {
      const int64_t v = int64_t(i) * kWarpSize + lane;
      if (4 * v < n) {
        const float4 xv = x4[v];
        acc = fmaf(wv[i].x, xv.x, acc), acc = fmaf(wv[i].y, xv.y, acc);
        acc = fmaf(wv[i].z, xv.z, acc), acc = fmaf(wv[i].w, xv.w, acc);
      }
    }
    for (int64_t v = kPrefetchCols / 4 + lane; 4 * v < n; v += kWarpSize) {  // wider rows
      const float4 wr = __ldg(w + v), xv = x4[v];
      acc = fmaf(wr.x, xv.x, acc), acc = fmaf(wr.y, xv.y, acc);
      acc = fmaf(wr.z, xv.z, acc), acc = fmaf(wr.w, xv.w, acc);
    }
    acc = detail::warp_sum(acc);
    if (lane == 0) a.logits[t * a.route.logits_stride + row] = acc + (a.router_bias ? a.router_bias[row] : 0.0f);
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

}  // namespace router_detail

bool moe_norm_route_fits(const MoeNormRouteArgs& a) {
  using namespace router_detail;
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return a.n_embd > 0 && a.n_embd % 4 == 0 && a.n_embd <= kMaxEmbd && aligned(a.router) && a.router_stride % 4 == 0 &&
         a.route.n_tokens > 0 && a.route.n_tokens <= 65535 && a.tickets && a.logits && a.route.logits == a.logits &&
         route_detail::route_refusal(a.route).empty();
}

Status moe_norm_route(const MoeNormRouteArgs& a, cudaStream_t stream) {
  using namespace router_detail;
  if (!moe_norm_route_fits(a)) {
    const std::string why = route_detail::route_refusal(a.route);
    return Status::invalid("moe_norm_route: " + (why.empty() ? "width " + std::to_string(a.n_embd) +
                                                                   " (a multiple of 4 up to " +
                                                                   std::to_string(kMaxEmbd) +
                                                                   ") or the router's alignment (16 bytes) does not fit"
                                                             : why));
  }
  const dim3 grid(unsigned((a.route.n_expert + kRouterWarps - 1) / kRouterWarps), unsigned(a.route.n_tokens));
  const size_t shared = size_t(a.n_embd) * sizeof(float);
  const cudaError_t e = route_detail::visit_per_lane(a.route.n_expert, [&](auto per_lane) {
    return launch_chained(moe_norm_route_kernel<decltype(per_lane)::value>, grid, dim3(kRouterThreads), shared, stream,
                          a);
  });
  if (e != cudaSuccess) return Status::from_cuda(e, "moe_norm_route_kernel");
  return launch_status("moe_norm_route_kernel");
}

}  // namespace kiln::cuda
