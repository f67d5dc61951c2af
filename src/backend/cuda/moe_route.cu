// Mixture-of-experts routing on the device (ops_extra.h's moe_route): each token's k experts
// and their weights from its router logits, one warp per token (moe_route.cuh).
// (v1 ran one thread per token and recomputed every score, a double exp, in each of the k
// rounds: ~1,000 exps and ~4,000 dependent loads in one thread per token.)
#include <string>

#include "backend/cuda/launch.cuh"
#include "backend/cuda/moe_route.cuh"

namespace kiln::cuda {
namespace route_detail {

constexpr int kRouteWarps = 4;  // tokens per block

template <int kPerLane>
__global__ void __launch_bounds__(kRouteWarps * kWarpSize) moe_route_warp_kernel(MoeRouteArgs a) {
  detail::begin_chained_kernel();
  const int64_t t = int64_t(blockIdx.x) * kRouteWarps + threadIdx.x / kWarpSize;
  if (t >= a.n_tokens) return;  // whole warps leave together
  route_token<kPerLane>(a, t);
}

template <int kPerLane>
cudaError_t launch_route(const MoeRouteArgs& a, cudaStream_t stream) {
  const unsigned grid = unsigned((a.n_tokens + kRouteWarps - 1) / kRouteWarps);
  return launch_chained(moe_route_warp_kernel<kPerLane>, dim3(grid), dim3(kRouteWarps * kWarpSize), 0, stream, a);
}

}  // namespace route_detail

Status moe_route(const MoeRouteArgs& a, cudaStream_t stream) {
  using namespace route_detail;
  if (const std::string why = route_refusal(a); !why.empty()) return Status::invalid("moe_route: " + why);
  if (a.n_tokens <= 0) return Status();
  const cudaError_t e = visit_per_lane(a.n_expert, [&](auto per_lane) { return launch_route<decltype(per_lane)::value>(a, stream); });
  if (e != cudaSuccess) return Status::from_cuda(e, "moe_route_warp_kernel");
  return launch_status("moe_route_warp_kernel");
}

}  // namespace kiln::cuda
