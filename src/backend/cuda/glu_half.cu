// The prefill FFN's activation rounded to the down product's half type (see glu_half.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <string>

#include "backend/cuda/common.cuh"
#include "backend/cuda/glu_half.h"
#include "backend/cuda/glu_math.cuh"
#include "backend/cuda/launch.cuh"

namespace kiln::cuda {
namespace {

template <bool kBf16>
struct HalfOf;
template <>
struct HalfOf<false> {
  using Pair = __half2;
  __device__ static Pair pair(float a, float b) { return __halves2half2(__float2half_rn(a), __float2half_rn(b)); }
  __device__ static __half one(float a) { return __float2half_rn(a); }
};
template <>
struct HalfOf<true> {
  using Pair = __nv_bfloat162;
  __device__ static Pair pair(float a, float b) {
    return __halves2bfloat162(__float2bfloat16_rn(a), __float2bfloat16_rn(b));
  }
  __device__ static __nv_bfloat16 one(float a) { return __float2bfloat16_rn(a); }
};

// Grid (blocks across a row, rows); each thread takes 4 neighbouring values per step: two
// 16-byte loads and one 8-byte store where kVector (n % 4 == 0, aligned rows), else one by one.
template <GluKind kKind, bool kBf16, bool kVector>
__global__ void __launch_bounds__(256) glu_half_kernel(GluHalfArgs a) {
  using H = HalfOf<kBf16>;
  detail::begin_chained_kernel();
  const int64_t r = blockIdx.y;
  const float* g = a.gate + r * a.gate_stride;
  const float* u = a.up + r * a.up_stride;
  auto* o = static_cast<typename H::Pair*>(a.out) + r * a.n / 2;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x * 4;
  for (int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * 4; i < a.n; i += stride) {
    if constexpr (kVector) {
      const float4 gv = *reinterpret_cast<const float4*>(g + i), uv = *reinterpret_cast<const float4*>(u + i);
      typename H::Pair two[2];
      two[0] = H::pair(detail::glu_of(kKind, gv.x, uv.x, a.alpha, a.limit),
                       detail::glu_of(kKind, gv.y, uv.y, a.alpha, a.limit));
      two[1] = H::pair(detail::glu_of(kKind, gv.z, uv.z, a.alpha, a.limit),
                       detail::glu_of(kKind, gv.w, uv.w, a.alpha, a.limit));
      *reinterpret_cast<uint2*>(o + i / 2) = *reinterpret_cast<const uint2*>(two);
    } else {
      auto* row = reinterpret_cast<decltype(H::one(0.0f))*>(static_cast<uint8_t*>(a.out) + size_t(r * a.n) * 2);
      for (int64_t k = i; k < i + 4 && k < a.n; ++k)
        row[k] = H::one(detail::glu_of(kKind, g[k], u[k], a.alpha, a.limit));
    }
  }
}

template <GluKind kKind, bool kBf16>
void launch(const GluHalfArgs& a, cudaStream_t stream) {
  const bool vector = a.n % 4 == 0 && a.gate_stride % 4 == 0 && a.up_stride % 4 == 0 &&
                      reinterpret_cast<uintptr_t>(a.gate) % 16 == 0 && reinterpret_cast<uintptr_t>(a.up) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(a.out) % 8 == 0;
  // As glu(): 4 steps of 4 values per thread across a row, at most 1024 blocks per row.
  constexpr int64_t kPerBlock = 256 * 4 * 4;
  const dim3 grid(unsigned(std::min<int64_t>((a.n + kPerBlock - 1) / kPerBlock, 1024)), unsigned(a.rows));
  if (vector)
    launch_chained(glu_half_kernel<kKind, kBf16, true>, grid, 256, 0, stream, a);
  else
    launch_chained(glu_half_kernel<kKind, kBf16, false>, grid, 256, 0, stream, a);
}

template <GluKind kKind>
void launch_kind(const GluHalfArgs& a, cudaStream_t stream) {
  if (a.bf16)
    launch<kKind, true>(a, stream);
  else
    launch<kKind, false>(a, stream);
}

}  // namespace

Status glu_to_half(const GluHalfArgs& a, cudaStream_t stream) {
  if (!a.gate || !a.up || !a.out || a.rows <= 0 || a.n <= 0 || a.rows > 65535 || a.n % 2 != 0 ||
      a.gate_stride < a.n || a.up_stride < a.n)
    return Status::invalid("glu_to_half: gate, up and out must be set, rows in 1..65535, an even n and strides of at "
                           "least n (rows " + std::to_string(a.rows) + ", n " + std::to_string(a.n) + ")");
  switch (a.kind) {
    case GluKind::Silu: launch_kind<GluKind::Silu>(a, stream); break;
    case GluKind::GeluTanh: launch_kind<GluKind::GeluTanh>(a, stream); break;
    case GluKind::SwigluOai: launch_kind<GluKind::SwigluOai>(a, stream); break;
    default: return Status::invalid("glu_to_half: unknown kind; supported: silu gelu_tanh swiglu_oai");
  }
  return launch_status("glu_half_kernel");
}

}  // namespace kiln::cuda
