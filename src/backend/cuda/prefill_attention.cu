// Prefill attention (see prefill_attention.h): the argument checks, the choice of version,
// and kernel v6 (v8, the default, is in prefill_attention_v8.cu).
//
// v6 layout: 4 warps per block, warp w owns query rows 16w..16w+15 of the block's 64. The
// fragments follow mma.m16n8k16 (row.col, f16 in, f32 accumulate): lane = 4 * g + t holds
// rows g and g + 8, columns 2t, 2t + 1 (and + 8) of each 16 x 16 / 16 x 8 piece. The score
// accumulators of two neighbouring 8-key pieces are, once rounded to f16, exactly the
// A fragment of P for the 16 keys they cover — so P never leaves registers.
//
// Shared memory holds Q (once) and two stages of K and V tiles, as f16 rows padded by 8
// elements: rows then start 4 banks apart, and the 8-row ldmatrix loads are conflict-free.
// v6: the next tile's K and V are copied (cp.async, f16 cache) while the current one is
// multiplied; Q stays in registers; K and V fragments come from ldmatrix (V transposed).
// v6b: heavy and light query blocks paired on a multiprocessor (see block_order), masks only
// on the tiles that cross the diagonal or a window edge, exp2 with log2(e) folded into the
// scale, cache slots by shift and mask when the block size is a power of two.
#include <string>

#include "backend/cuda/env_switch.h"
#include "backend/cuda/prefill_attention_common.cuh"

namespace kiln::cuda {
namespace prefill_detail {
namespace v6 {

using detail::kFullMask;
using detail::kWarpSize;

constexpr int kQueryRows = 64;  // query tokens per block
constexpr int kKeys = 64;       // keys per tile
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kStages = 2;

template <int D>
constexpr size_t shared_bytes() {
  return size_t(kQueryRows + 2 * kStages * kKeys) * (D + kPad) * sizeof(__half);
}

template <int D, typename KV>
__device__ __forceinline__ void load_tile(const PrefillAttentionArgs& a, const int32_t* table, int block_shift,
                                          int kv_head, int kb, int key_end, __half* k_dst, __half* v_dst) {
  constexpr int kRow = D + kPad;
  constexpr int kWidth = 16 / int(sizeof(KV));  // elements per 16-byte piece
  constexpr int kPieces = D / kWidth;           // pieces per row
  constexpr int kPerThread = kKeys * kPieces / kThreads;
  constexpr int kBatch = sizeof(KV) == 2 ? kPerThread : 4;
  static_assert(kPerThread % kBatch == 0, "whole batches of pieces per thread");
  const KV* k_cache = static_cast<const KV*>(a.k_cache);
  const KV* v_cache = static_cast<const KV*>(a.v_cache);
#pragma unroll
  for (int j0 = 0; j0 < kPerThread; j0 += kBatch) {
    float4 kv[kBatch], vv[kBatch];
#pragma unroll
    for (int j = j0; j < j0 + kBatch; ++j) {
      const int i = threadIdx.x + j * kThreads;
      const int r = i / kPieces, c = (i % kPieces) * kWidth, key = kb + r;
      const bool valid = key < key_end;
      const int64_t slot = valid ? slot_of(a, table, block_shift, key) : 0;
      const KV* k_src = k_cache + (valid ? slot * a.k_slot_stride + int64_t(kv_head) * D + c : 0);
      const KV* v_src = v_cache + (valid ? slot * a.v_slot_stride + int64_t(kv_head) * D + c : 0);
      if constexpr (sizeof(KV) == 2) {
        cp_async_16_or_zero(k_dst + r * kRow + c, k_src, valid);
        cp_async_16_or_zero(v_dst + r * kRow + c, v_src, valid);
      } else {
        kv[j - j0] = valid ? load4(k_src) : make_float4(0.f, 0.f, 0.f, 0.f);
        vv[j - j0] = valid ? load4(v_src) : make_float4(0.f, 0.f, 0.f, 0.f);
      }
    }
    if constexpr (sizeof(KV) == 4) {
#pragma unroll
      for (int j = j0; j < j0 + kBatch; ++j) {
        const int i = threadIdx.x + j * kThreads;
        const int at = (i / kPieces) * kRow + (i % kPieces) * kWidth;
        store4(k_dst + at, kv[j - j0]);
        store4(v_dst + at, vv[j - j0]);
      }
    }
  }
}

template <int D, typename KV>
__global__ void __launch_bounds__(kThreads) prefill_attention_kernel(PrefillAttentionArgs a) {
  extern __shared__ __align__(16) __half smem[];
  constexpr int kRow = D + kPad;
  __half* q_s = smem;
  __half* k_s = q_s + kQueryRows * kRow;            // kStages tiles
  __half* v_s = k_s + kStages * kKeys * kRow;       // kStages tiles
  constexpr int kTile = kKeys * kRow;

  int head = 0;
  const int q0 = block_order(&head) * kQueryRows;
  const int block_shift = (a.block_size & (a.block_size - 1)) == 0 ? __ffs(a.block_size) - 1 : -1;
  const int kv_head = head / (a.n_head / a.n_head_kv);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int g = lane / 4, t = lane % 4;
  const int32_t* table = a.block_tables + int64_t(a.seq_rows[0]) * a.block_table_stride;

  const int last_token = min(q0 + kQueryRows, a.n_tokens) - 1;
  const int key_end = a.first_position + last_token + 1;  // keys [.., key_end) are needed
  int key_begin = a.sliding_window > 0 ? max(0, a.first_position + q0 - a.sliding_window + 1) : 0;
  key_begin = key_begin / kKeys * kKeys;
  const int n_tiles = (key_end - key_begin + kKeys - 1) / kKeys;

  // The first tile's copy runs while Q is converted.
  load_tile<D, KV>(a, table, block_shift, kv_head, key_begin, key_end, k_s, v_s);
  detail::cp_async_commit();

  stage_queries<D, kQueryRows, kThreads>(a, head, q0, q_s);
  __syncthreads();
  // The warp's Q rows as A fragments, for all of D (ldmatrix: matrices rows 0-7 / 8-15 x
  // columns kk / kk + 8).
  uint32_t qf[D / 16][4];
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
    ldmatrix_x4(qf[kk], q_s + (warp * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * kRow + kk * 16 + (lane / 16) * 8);

  // This thread's two query rows (g and g + 8 of the warp's 16) and their positions.
  const int row0 = warp * 16 + g;
  const int pos[2] = {a.first_position + q0 + row0, a.first_position + q0 + row0 + 8};
  const int first_row_position = a.first_position + q0;        // the block's first query
  const int last_row_position = a.first_position + last_token;  // and its last
  const float scale_log2 = a.scale * kLog2e;
  const float scale_over_cap = a.softcap > 0.0f ? a.scale / a.softcap : 0.0f;
  const float cap_log2 = a.softcap * kLog2e;

  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  float o[D / 8][4];
#pragma unroll
  for (int nb = 0; nb < D / 8; ++nb) o[nb][0] = o[nb][1] = o[nb][2] = o[nb][3] = 0.0f;

  for (int tile = 0; tile < n_tiles; ++tile) {
    const int kb = key_begin + tile * kKeys;
    const __half* k_cur = k_s + (tile % kStages) * kTile;
    const __half* v_cur = v_s + (tile % kStages) * kTile;
    // The next tile goes into the other stage, consumed in the previous iteration.
    if (tile + 1 < n_tiles) {
      load_tile<D, KV>(a, table, block_shift, kv_head, kb + kKeys, key_end, k_s + ((tile + 1) % kStages) * kTile,
                       v_s + ((tile + 1) % kStages) * kTile);
      detail::cp_async_commit();
      detail::cp_async_wait<1>();
    } else {
      detail::cp_async_wait<0>();
    }
    __syncthreads();  // this tile is in shared memory for every thread

    // S = Q Kᵀ for the warp's 16 rows and the tile's 64 keys. K rows are Kᵀ's columns, so
    // plain ldmatrix gives B fragments: matrices of keys nb*8.. x dims kk*16 + 0/8/16/24.
    float s[kKeys / 8][4];
#pragma unroll
    for (int nb = 0; nb < kKeys / 8; ++nb) s[nb][0] = s[nb][1] = s[nb][2] = s[nb][3] = 0.0f;
#pragma unroll
    for (int nb = 0; nb < kKeys / 8; ++nb)
#pragma unroll
      for (int kk = 0; kk < D / 16; kk += 2) {
        uint32_t kf[4];
        ldmatrix_x4(kf, k_cur + (nb * 8 + lane % 8) * kRow + kk * 16 + (lane / 8) * 8);
        mma_f16(s[nb], qf[kk], kf[0], kf[1]);
        mma_f16(s[nb], qf[kk + 1], kf[2], kf[3]);
      }

    // Scale (to log2 units), cap, mask; the running maximum and sum of each row (quads
    // share rows). Tiles wholly below the diagonal and inside the window need no mask.
    const bool masked = kb + kKeys - 1 > first_row_position ||
                        (a.sliding_window > 0 && kb <= last_row_position - a.sliding_window);
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nb = 0; nb < kKeys / 8; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e / 2, key = kb + nb * 8 + 2 * t + (e % 2);
        float v;
        if (a.softcap > 0.0f)
          v = cap_log2 * tanhf(s[nb][e] * scale_over_cap);
        else
          v = s[nb][e] * scale_log2;
        if (masked) {
          const bool visible = key <= pos[r] && (a.sliding_window <= 0 || key > pos[r] - a.sliding_window);
          v = visible ? v : -INFINITY;
        }
        s[nb][e] = v;
        tile_max[r] = fmaxf(tile_max[r], v);
      }
    online_softmax_step<kKeys, D>(s, tile_max, m, l, o);
    accumulate_pv<kKeys, D>(o, s, v_cur, lane);
    __syncthreads();  // every warp is done with this stage before it is refilled
  }

  store_normalized_rows<D>(a, head, q0 + row0, t, m, l, o);
}

template <int D, typename KV>
Status launch(const PrefillAttentionArgs& a, cudaStream_t stream) {
  auto kernel = prefill_attention_kernel<D, KV>;
  constexpr size_t smem = shared_bytes<D>();
  static bool configured = false;
  if (!configured) {
    if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
        e != cudaSuccess)
      return Status::from_cuda(e, "cudaFuncSetAttribute (prefill_attention_kernel v6)");
    configured = true;
  }
  const dim3 grid(unsigned((a.n_tokens + kQueryRows - 1) / kQueryRows), unsigned(a.n_head));
  kernel<<<grid, kThreads, smem, stream>>>(a);
  return launch_status("prefill_attention_kernel v6");
}

}  // namespace v6

Status launch_v6(const PrefillAttentionArgs& a, cudaStream_t stream) {
  const bool f16 = a.cache_type == GgmlType::F16;
  if (a.head_dim == 64) return f16 ? v6::launch<64, __half>(a, stream) : v6::launch<64, float>(a, stream);
  return f16 ? v6::launch<128, __half>(a, stream) : v6::launch<128, float>(a, stream);
}

// The version when the arguments name none: v8, or v6 with KILN_CUDA_PREFILL_ATTN_V=6 (for
// measurements side by side). Read once.
int default_version() {
  static const int version = env_int("KILN_CUDA_PREFILL_ATTN_V", 8) == 6 ? 6 : 8;
  return version;
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
  // 16-byte rows: f16 cache slots of 8 elements, f32 of 4 (cp.async and float4 loads).
  const int64_t slot_align = a.cache_type == GgmlType::F16 ? 8 : 4;
  if (a.q_stride % 4 != 0 || a.k_slot_stride % slot_align != 0 || a.v_slot_stride % slot_align != 0 ||
      a.out_stride % 2 != 0 || reinterpret_cast<uintptr_t>(a.q) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(a.out) % 8 != 0 || reinterpret_cast<uintptr_t>(a.k_cache) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(a.v_cache) % 16 != 0)
    return Status::invalid("prefill_attention: rows must be 16-byte aligned");
  if (reinterpret_cast<uintptr_t>(a.out_half) % 256 != 0)
    return Status::invalid("prefill_attention: the output's half copy must be 256-byte aligned");
  const int version = a.version != 0 ? a.version : prefill_detail::default_version();
  if (version == 6) return prefill_detail::launch_v6(a, stream);
  if (version == 8) return prefill_detail::launch_v8(a, stream);
  return Status::invalid("prefill_attention: no kernel version " + std::to_string(version) + " (6 or 8)");
}

}  // namespace kiln::cuda
