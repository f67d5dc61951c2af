// The prefill attention kernel (see prefill_attention.h).
//
// Layout: 4 warps per block, warp w owns query rows 16w..16w+15 of the block's 64. The
// fragments follow mma.m16n8k16 (row.col, f16 in, f32 accumulate): lane = 4 * g + t holds
// rows g and g + 8, columns 2t, 2t + 1 (and + 8) of each 16 x 16 / 16 x 8 piece. The score
// accumulators of two neighbouring 8-key pieces are, once rounded to f16, exactly the
// A fragment of P for the 16 keys they cover — so P never leaves registers.
//
// Shared memory holds Q (once), and the current K and V tiles, as f16 rows padded by 8
// elements: rows then start 4 banks apart, and the fragment loads are conflict-free.
#include "backend/cuda/prefill_attention.h"

#include <cuda_fp16.h>

#include <string>

#include "backend/cuda/common.cuh"

namespace kiln::cuda {
namespace prefill_detail {

using detail::kFullMask;
using detail::kWarpSize;

constexpr int kQueryRows = 64;  // query tokens per block
constexpr int kKeys = 64;       // keys per tile
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kPad = 8;

template <int D>
constexpr size_t shared_bytes() {
  return size_t(kQueryRows + 2 * kKeys) * (D + kPad) * sizeof(__half);
}

__device__ __forceinline__ void mma_f16(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}
__device__ __forceinline__ uint32_t pack_halves(__half lo, __half hi) {
  return uint32_t(__half_as_ushort(lo)) | (uint32_t(__half_as_ushort(hi)) << 16);
}
__device__ __forceinline__ uint32_t word_at(const __half* p) { return *reinterpret_cast<const uint32_t*>(p); }

// Four consecutive elements of a row of `T` as f16 into shared memory.
__device__ __forceinline__ void store4(__half* dst, float4 v) {
  *reinterpret_cast<uint2*>(dst) = make_uint2(pack_half2(v.x, v.y), pack_half2(v.z, v.w));
}
__device__ __forceinline__ float4 load4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ float4 load4(const __half* p) {
  const uint2 w = *reinterpret_cast<const uint2*>(p);
  const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&w.x));
  const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&w.y));
  return make_float4(a.x, a.y, b.x, b.y);
}

template <int D, typename KV>
__global__ void __launch_bounds__(kThreads) prefill_attention_kernel(PrefillAttentionArgs a) {
  extern __shared__ __align__(16) __half smem[];
  constexpr int kRow = D + kPad;
  __half* q_s = smem;
  __half* k_s = q_s + kQueryRows * kRow;
  __half* v_s = k_s + kKeys * kRow;

  const int q0 = blockIdx.x * kQueryRows, head = blockIdx.y;
  const int kv_head = head / (a.n_head / a.n_head_kv);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int g = lane / 4, t = lane % 4;
  const int32_t* table = a.block_tables + int64_t(a.seq_rows[0]) * a.block_table_stride;
  const KV* k_cache = static_cast<const KV*>(a.k_cache);
  const KV* v_cache = static_cast<const KV*>(a.v_cache);

  for (int i = threadIdx.x; i < kQueryRows * D / 4; i += kThreads) {
    const int r = i / (D / 4), c = (i % (D / 4)) * 4;
    const float4 v = q0 + r < a.n_tokens ? load4(a.q + int64_t(q0 + r) * a.q_stride + int64_t(head) * D + c)
                                         : make_float4(0.f, 0.f, 0.f, 0.f);
    store4(q_s + r * kRow + c, v);
  }

  const int last_token = min(q0 + kQueryRows, a.n_tokens) - 1;
  const int key_end = a.first_position + last_token + 1;  // keys [.., key_end) are needed
  int key_begin = a.sliding_window > 0 ? max(0, a.first_position + q0 - a.sliding_window + 1) : 0;
  key_begin = key_begin / kKeys * kKeys;
  // This thread's two query rows (g and g + 8 of the warp's 16) and their positions.
  const int row0 = warp * 16 + g;
  const int pos[2] = {a.first_position + q0 + row0, a.first_position + q0 + row0 + 8};

  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  float o[D / 8][4];
#pragma unroll
  for (int nb = 0; nb < D / 8; ++nb) o[nb][0] = o[nb][1] = o[nb][2] = o[nb][3] = 0.0f;

  for (int kb = key_begin; kb < key_end; kb += kKeys) {
    __syncthreads();  // the previous tiles are consumed (and Q is stored, the first time)
    for (int i = threadIdx.x; i < kKeys * D / 4; i += kThreads) {
      const int r = i / (D / 4), c = (i % (D / 4)) * 4;
      const int key = kb + r;
      float4 kv = make_float4(0.f, 0.f, 0.f, 0.f), vv = kv;
      if (key < key_end) {
        const int64_t slot = int64_t(table[key / a.block_size]) * a.block_size + key % a.block_size;
        kv = load4(k_cache + slot * a.k_slot_stride + int64_t(kv_head) * D + c);
        vv = load4(v_cache + slot * a.v_slot_stride + int64_t(kv_head) * D + c);
      }
      store4(k_s + r * kRow + c, kv);
      store4(v_s + r * kRow + c, vv);
    }
    __syncthreads();

    // S = Q Kᵀ for the warp's 16 rows and the tile's 64 keys.
    float s[kKeys / 8][4];
#pragma unroll
    for (int nb = 0; nb < kKeys / 8; ++nb) s[nb][0] = s[nb][1] = s[nb][2] = s[nb][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D; kk += 16) {
      const __half* qa = q_s + row0 * kRow + kk + 2 * t;
      const uint32_t af[4] = {word_at(qa), word_at(qa + 8 * kRow), word_at(qa + 8), word_at(qa + 8 * kRow + 8)};
#pragma unroll
      for (int nb = 0; nb < kKeys / 8; ++nb) {
        const __half* kp = k_s + (nb * 8 + g) * kRow + kk + 2 * t;
        const uint32_t bf[2] = {word_at(kp), word_at(kp + 8)};
        mma_f16(s[nb], af, bf);
      }
    }

    // Scale, cap, mask; the running maximum and sum of each row (quads share rows).
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nb = 0; nb < kKeys / 8; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e / 2, key = kb + nb * 8 + 2 * t + (e % 2);
        float v = s[nb][e] * a.scale;
        if (a.softcap > 0.0f) v = a.softcap * tanhf(v / a.softcap);
        const bool visible = key <= pos[r] && (a.sliding_window <= 0 || key > pos[r] - a.sliding_window);
        s[nb][e] = visible ? v : -INFINITY;
        tile_max[r] = fmaxf(tile_max[r], s[nb][e]);
      }
    float rescale[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(kFullMask, tile_max[r], 1));
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(kFullMask, tile_max[r], 2));
      const float m_new = fmaxf(m[r], tile_max[r]);
      const float base = m_new == -INFINITY ? 0.0f : m_new;  // a row with nothing visible yet
      rescale[r] = m[r] == -INFINITY ? 0.0f : __expf(m[r] - base);
      m[r] = m_new;
      l[r] *= rescale[r];
#pragma unroll
      for (int nb = 0; nb < kKeys / 8; ++nb)
#pragma unroll
        for (int e = 2 * r; e < 2 * r + 2; ++e) {
          s[nb][e] = s[nb][e] == -INFINITY ? 0.0f : __expf(s[nb][e] - base);
          l[r] += s[nb][e];
        }
    }
#pragma unroll
    for (int nb = 0; nb < D / 8; ++nb) {
      o[nb][0] *= rescale[0], o[nb][1] *= rescale[0];
      o[nb][2] *= rescale[1], o[nb][3] *= rescale[1];
    }

    // O += P V: P's A fragments are the score accumulators of two neighbouring key pieces.
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      const uint32_t pf[4] = {pack_half2(s[2 * kk][0], s[2 * kk][1]), pack_half2(s[2 * kk][2], s[2 * kk][3]),
                              pack_half2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              pack_half2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
      const __half* vp = v_s + (kk * 16 + 2 * t) * kRow + g;
#pragma unroll
      for (int nb = 0; nb < D / 8; ++nb) {
        const __half* col = vp + nb * 8;
        const uint32_t bf[2] = {pack_halves(col[0], col[kRow]), pack_halves(col[8 * kRow], col[9 * kRow])};
        mma_f16(o[nb], pf, bf);
      }
    }
  }

  // Each row's sum over its quad, the sink, then the normalized output.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = l[r];
    sum += __shfl_xor_sync(kFullMask, sum, 1);
    sum += __shfl_xor_sync(kFullMask, sum, 2);
    float factor = 1.0f;
    if (a.sinks) {
      const float sink = a.sinks[head];
      const float m_final = fmaxf(m[r], sink);
      factor = m[r] == -INFINITY ? 0.0f : __expf(m[r] - m_final);
      sum = sum * factor + __expf(sink - m_final);
    }
    const float inv = sum > 0.0f ? factor / sum : 0.0f;
    const int token = q0 + row0 + 8 * r;
    if (token >= a.n_tokens) continue;
    float* out = a.out + int64_t(token) * a.out_stride + int64_t(head) * D + 2 * t;
#pragma unroll
    for (int nb = 0; nb < D / 8; ++nb)
      *reinterpret_cast<float2*>(out + nb * 8) = make_float2(o[nb][2 * r] * inv, o[nb][2 * r + 1] * inv);
  }
}

template <int D, typename KV>
Status launch(const PrefillAttentionArgs& a, cudaStream_t stream) {
  auto kernel = prefill_attention_kernel<D, KV>;
  constexpr size_t smem = shared_bytes<D>();
  static bool configured = false;
  if (!configured) {
    if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
        e != cudaSuccess)
      return Status::from_cuda(e, "cudaFuncSetAttribute (prefill_attention_kernel)");
    configured = true;
  }
  const dim3 grid(unsigned((a.n_tokens + kQueryRows - 1) / kQueryRows), unsigned(a.n_head));
  kernel<<<grid, kThreads, smem, stream>>>(a);
  return launch_status("prefill_attention_kernel");
}

}  // namespace prefill_detail

bool prefill_attention_supports(int head_dim, GgmlType cache_type) {
  return (head_dim == 64 || head_dim == 128) && (cache_type == GgmlType::F32 || cache_type == GgmlType::F16);
}

Status prefill_attention(const PrefillAttentionArgs& a, cudaStream_t stream) {
  if (!a.q || !a.k_cache || !a.v_cache || !a.block_tables || !a.seq_rows || !a.out)
    return Status::invalid("prefill_attention: q, caches, block tables, seq_rows and out must be set");
  if (!prefill_attention_supports(a.head_dim, a.cache_type))
    return Status::invalid("prefill_attention: head size " + std::to_string(a.head_dim) +
                           " or cache type not supported (64 or 128; f32 or f16)");
  if (a.n_tokens <= 0 || a.n_head <= 0 || a.n_head_kv <= 0 || a.n_head % a.n_head_kv != 0 || a.block_size <= 0 ||
      a.first_position < 0 || a.n_head > 65535)
    return Status::invalid("prefill_attention: bad shape (tokens " + std::to_string(a.n_tokens) + ", heads " +
                           std::to_string(a.n_head) + "/" + std::to_string(a.n_head_kv) + ")");
  if (a.q_stride % 4 != 0 || a.k_slot_stride % 4 != 0 || a.v_slot_stride % 4 != 0 || a.out_stride % 2 != 0 ||
      reinterpret_cast<uintptr_t>(a.q) % 16 != 0 || reinterpret_cast<uintptr_t>(a.out) % 8 != 0)
    return Status::invalid("prefill_attention: rows must be 16-byte aligned");
  const bool f16 = a.cache_type == GgmlType::F16;
  if (a.head_dim == 64)
    return f16 ? prefill_detail::launch<64, __half>(a, stream) : prefill_detail::launch<64, float>(a, stream);
  return f16 ? prefill_detail::launch<128, __half>(a, stream) : prefill_detail::launch<128, float>(a, stream);
}

}  // namespace kiln::cuda
