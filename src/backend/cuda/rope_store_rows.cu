// Prefill's q/k head norms, rope of q and k and the KV-cache store in one launch
// (rope_store.h's rope_store_rows). Grid (tokens, row groups of 8): a token's rows are its q
// heads, then its k heads, then its values in pieces of 128; one warp each.
//
// Why this shape: at T = 512 the five kernels it replaces (q norm, k norm, rope q, rope k,
// kv_store; 40 us per Qwen3-30B-A3B layer, each synced alone) move ~20 MB, 5 us at 4.2 TB/s.
// The decode kernel (rope_store.cu) gives a block 4 heads of one token and walks them with
// dependent scalar loads, and without a table each block computes the angles again; at 512
// tokens it was not faster than the three plain kernels (docs/perf-notes.md). Here a warp
// reads its head row with one 8- or 16-byte load per lane before anything else, norms it in
// registers (one warp sum), leaves the normed row in shared memory for the lanes that need a
// partner value, and writes the rotated row back and, for k, into the cache with one store
// per lane. The angles come from the pass's rope_table (cos then sin per token, L2-resident).
#include <string>

#include "backend/cuda/launch.cuh"
#include "backend/cuda/rope_math.cuh"
#include "backend/cuda/rope_store.h"

namespace kiln::cuda {
namespace rope_rows_detail {

using detail::kWarpSize;

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kValuesPerWarp = 4 * kWarpSize;  // v: one 16-byte piece per lane

template <int N>
__device__ __forceinline__ void load_floats(const float* p, float (&v)[N]) {
  if constexpr (N == 2) {
    const float2 a = *reinterpret_cast<const float2*>(p);
    v[0] = a.x, v[1] = a.y;
  } else {
#pragma unroll
    for (int i = 0; i < N; i += 4) {
      const float4 a = *reinterpret_cast<const float4*>(p + i);
      v[i] = a.x, v[i + 1] = a.y, v[i + 2] = a.z, v[i + 3] = a.w;
    }
  }
}

template <int N>
__device__ __forceinline__ void store_floats(float* p, const float (&v)[N]) {
  if constexpr (N == 2) {
    *reinterpret_cast<float2*>(p) = make_float2(v[0], v[1]);
  } else {
#pragma unroll
    for (int i = 0; i < N; i += 4) *reinterpret_cast<float4*>(p + i) = make_float4(v[i], v[i + 1], v[i + 2], v[i + 3]);
  }
}

// N values into f16 (round to nearest even, as store_as) with one 4-, 8- or 16-byte store.
template <int N>
__device__ __forceinline__ void store_floats(__half* p, const float (&v)[N]) {
  __half2 h[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) h[i] = __floats2half2_rn(v[2 * i], v[2 * i + 1]);
  if constexpr (N == 2) {
    *reinterpret_cast<__half2*>(p) = h[0];
  } else if constexpr (N == 4) {
    *reinterpret_cast<uint2*>(p) = *reinterpret_cast<const uint2*>(h);
  } else {
#pragma unroll
    for (int i = 0; i < N / 8; ++i) reinterpret_cast<uint4*>(p)[i] = reinterpret_cast<const uint4*>(h)[i];
  }
}

// kPerLane values of a head per lane: head_dim = 32 * kPerLane.
template <int kPerLane, typename KV>
__global__ void __launch_bounds__(kThreads)
    rope_store_rows_kernel(RopeArgs q, RopeArgs k, KvStoreArgs st, const float* angles, HeadNorms norms,
                           int64_t v_pieces) {
  constexpr int kDim = kPerLane * kWarpSize;
  __shared__ __align__(16) float normed_s[kWarps][kDim];
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int64_t t = blockIdx.x, row = int64_t(blockIdx.y) * kWarps + warp;
  const int64_t nq = q.n_heads, nk = k.n_heads;
  if (row >= nq + nk + v_pieces) return;  // (no block-wide barrier follows)
  const bool is_q = row < nq, is_k = !is_q && row < nq + nk;
  const int d0 = lane * kPerLane;
  const float* norm_w = is_q ? norms.q : is_k ? norms.k : nullptr;
  float w[kPerLane];
  if (norm_w) load_floats(norm_w + d0, w);  // before the wait: no kernel writes the weights
  detail::begin_chained_kernel();
  const int64_t slot = st.slots[t];
  const bool slot_ok = slot >= 0 && slot < st.n_slots;  // never write outside the cache

  if (!is_q && !is_k) {  // 128 values of v into the cache
    const int64_t i = (row - nq - nk) * kValuesPerWarp + lane * 4;
    if (!slot_ok || i >= st.v_width) return;
    float v[4];
    load_floats(st.v + t * st.v_stride + i, v);
    store_floats(static_cast<KV*>(st.cache_v) + slot * st.cache_v_stride + i, v);
    return;
  }

  // (Fields picked one by one: a reference to q or k would copy both to local memory.)
  const int64_t head = is_q ? row : row - nq;
  float* x = (is_q ? q.x : k.x) + t * (is_q ? q.token_stride : k.token_stride) + head * kDim;
  float v[kPerLane];
  load_floats(x + d0, v);
  if (norm_w) {  // rmsnorm()'s formula over the head: (x * inv) * weight, rounded at each step
    float sum_sq = 0.0f;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) sum_sq = fmaf(v[j], v[j], sum_sq);
    const float inv = rsqrtf(detail::warp_sum(sum_sq) / float(kDim) + norms.eps);
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) v[j] = __fmul_rn(__fmul_rn(v[j], inv), w[j]);
  }
  float* s = normed_s[warp];
  store_floats(s + d0, v);
  __syncwarp();

  // Pairs (i, i + n_rot / 2) (neox) or (2i, 2i + 1), rotated as rotate_heads() does; dims
  // past n_rot keep their values.
  const int n_rot = q.n_rot, half = n_rot / 2;  // k's are the same (same_rotation)
  const bool neox = q.neox;
  const float* cos_t = angles + t * n_rot;
  float y[kPerLane];
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int d = d0 + j;
    if (d >= n_rot) {
      y[j] = v[j];
      continue;
    }
    const bool first = neox ? d < half : (d & 1) == 0;
    const int i = neox ? (first ? d : d - half) : d >> 1;
    const int partner = neox ? (first ? d + half : d - half) : d ^ 1;
    const float c = __ldg(cos_t + i), sn = __ldg(cos_t + half + i), p = s[partner];
    y[j] = first ? detail::rotated_first(v[j], p, c, sn) : detail::rotated_second(p, v[j], c, sn);
  }
  store_floats(x + d0, y);
  if (is_k && slot_ok) store_floats(static_cast<KV*>(st.cache_k) + slot * st.cache_k_stride + head * kDim + d0, y);
}

bool aligned_to(const void* p, int64_t bytes) { return reinterpret_cast<uintptr_t>(p) % uint64_t(bytes) == 0; }

template <int kPerLane>
cudaError_t launch(const RopeArgs& q, const RopeArgs& k, const KvStoreArgs& st, const float* angles,
                   const HeadNorms& norms, int64_t v_pieces, dim3 grid, cudaStream_t stream) {
  if (st.cache_type == GgmlType::F16)
    return launch_chained(rope_store_rows_kernel<kPerLane, __half>, grid, dim3(kThreads), 0, stream, q, k, st, angles,
                          norms, v_pieces);
  return launch_chained(rope_store_rows_kernel<kPerLane, float>, grid, dim3(kThreads), 0, stream, q, k, st, angles,
                        norms, v_pieces);
}

}  // namespace rope_rows_detail

std::string rope_store_rows_refusal(const RopeArgs& q, const RopeArgs& k, const KvStoreArgs& st, const float* angles,
                                    const HeadNorms& norms) {
  using namespace rope_rows_detail;
  detail::RopeConstants c;
  if (Status s = detail::rope_constants(q, &c); !s.ok()) return s.message();
  if (Status s = detail::rope_constants(k, &c); !s.ok()) return s.message();
  if (!detail::same_rotation(q, k)) return "q and k must share positions and rope parameters";
  if (!angles) return "needs the pass's angle table";
  const int64_t dim = q.head_dim;
  if (k.head_dim != dim || (dim != 64 && dim != 128 && dim != 256))
    return "head_dim " + std::to_string(dim) + " / " + std::to_string(k.head_dim) + " (64, 128 or 256, q as k)";
  if (q.head_stride != dim || k.head_stride != dim) return "q and k heads must be packed";
  if (st.k != k.x || st.k_stride != k.token_stride || st.k_width != k.n_heads * dim || st.n_tokens != k.n_tokens ||
      q.n_tokens != k.n_tokens || !st.slots || !st.v)
    return "k must be the store's key rows, with slots and values";
  if (st.cache_type != GgmlType::F32 && st.cache_type != GgmlType::F16)
    return "cache type " + std::string(type_name(st.cache_type)) + " (f32 or f16)";
  // One load per lane of head_dim / 32 floats, one 16-byte load per lane of v; the cache
  // stores of the same counts of its elements.
  const int64_t row_align = dim == 64 ? 8 : 16;
  const int64_t elem = st.cache_type == GgmlType::F16 ? 2 : 4;
  const int64_t k_store = dim / kWarpSize * elem > 16 ? 16 : dim / kWarpSize * elem, v_store = 4 * elem;
  const bool rows_ok = aligned_to(q.x, row_align) && aligned_to(k.x, row_align) &&
                       q.token_stride * 4 % row_align == 0 && k.token_stride * 4 % row_align == 0 &&
                       (!norms.q || aligned_to(norms.q, row_align)) && (!norms.k || aligned_to(norms.k, row_align));
  const bool v_ok = st.v_width % 4 == 0 && aligned_to(st.v, 16) && st.v_stride % 4 == 0;
  const bool cache_ok = aligned_to(st.cache_k, k_store) && st.cache_k_stride * elem % k_store == 0 &&
                        aligned_to(st.cache_v, v_store) && st.cache_v_stride * elem % v_store == 0;
  if (!rows_ok || !v_ok || !cache_ok)
    return "rows of q, k, v, the norm weights or the cache are not aligned for whole-lane loads and stores";
  const int64_t v_pieces = (st.v_width + kValuesPerWarp - 1) / kValuesPerWarp;
  if ((q.n_heads + k.n_heads + v_pieces + kWarps - 1) / kWarps > 65535 || q.n_tokens > 0x7fffffff)
    return "too many heads or tokens for the grid";
  return {};
}

Status rope_store_rows(const RopeArgs& q, const RopeArgs& k, const KvStoreArgs& st, const float* angles,
                       const HeadNorms& norms, cudaStream_t stream) {
  using namespace rope_rows_detail;
  if (const std::string why = rope_store_rows_refusal(q, k, st, angles, norms); !why.empty())
    return Status::invalid("rope_store_rows: " + why);
  const int64_t v_pieces = (st.v_width + kValuesPerWarp - 1) / kValuesPerWarp;
  const dim3 grid(unsigned(q.n_tokens), unsigned((q.n_heads + k.n_heads + v_pieces + kWarps - 1) / kWarps));
  const cudaError_t e = q.head_dim == 64    ? launch<2>(q, k, st, angles, norms, v_pieces, grid, stream)
                        : q.head_dim == 128 ? launch<4>(q, k, st, angles, norms, v_pieces, grid, stream)
                                            : launch<8>(q, k, st, angles, norms, v_pieces, grid, stream);
  if (e != cudaSuccess) return Status::from_cuda(e, "rope_store_rows_kernel");
  return launch_status("rope_store_rows_kernel");
}

}  // namespace kiln::cuda
