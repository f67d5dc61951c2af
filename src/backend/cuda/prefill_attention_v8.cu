// Prefill attention v8 (see prefill_attention.h for the contract, prefill_attention.cu for
// v6, whose fragment layout and tile copies this kernel keeps).
//
// v6 gave each 16-row warp whole 64-key tiles, and the heaviest query block of a causal
// prompt ran its 8 tiles with one warp per scheduler: latency-bound. Here 8 warps share
// the block's 64 query rows: the keys come in chunks of 32, and warp group h of G takes
// chunks h, h + G, h + 2G... Each group copies its own chunks into its own S stages and
// synchronizes only its own 4 warps (a named barrier), once per chunk, so the groups drift
// apart and one's softmax overlaps another's products. The groups meet twice: after Q is in
// shared memory, and for the merge of their softmax states, which groups 1.. leave in their
// own (then idle) stages. To keep two blocks per multiprocessor (<= 128 registers a thread)
// the Q fragments are read from shared memory at each chunk rather than kept in registers.
// The next chunk's cache slots are read from the block table an iteration ahead.
// Built with G = 2, S = 2. Measured and slower at the Llama-3-8B prompt shapes (see
// docs/perf-notes.md, round 8): G = 4 (one 16-warp block per multiprocessor) and S = 3.
// Also: the soft-cap and mask branches sit outside the element loops, and the kernel is
// launched chained (programmatic dependent launch): its blocks are scheduled while the
// previous kernel drains and wait for it before reading anything.
#include "backend/cuda/launch.cuh"
#include "backend/cuda/prefill_attention_common.cuh"

namespace kiln::cuda::prefill_detail {
namespace v8 {

using detail::kFullMask;
using detail::kWarpSize;

constexpr int kQueryRows = 64;  // query tokens per block
constexpr int kChunk = 32;      // keys per chunk; a group's warp w covers rows 16 (w % 4).. of it
constexpr int kGroupThreads = 4 * kWarpSize;

// S stages per group: chunks i + 1 .. i + S - 1 are in flight while chunk i is multiplied.
template <int D, int G, int S>
constexpr size_t shared_bytes() {
  return size_t(kQueryRows + G * 2 * S * kChunk) * (D + kPad) * sizeof(__half);
}

// How one thread of a group copies the group's half of a K / V tile: kPieces 16-byte pieces
// per row, so each thread always takes the same column, and rows first_row + kRowStep * j
// for j < kPerThread.
template <int D, typename KV>
struct TileCopy {
  static constexpr int kWidth = 16 / int(sizeof(KV));  // elements per piece
  static constexpr int kPieces = D / kWidth;
  static constexpr int kRowStep = kGroupThreads / kPieces;
  static constexpr int kPerThread = kChunk / kRowStep;
  static_assert(kGroupThreads % kPieces == 0 && kChunk % kRowStep == 0, "whole rows per pass");
};

// The named barrier of warp group `group` (id 0 is __syncthreads'). Immediate ids, so that
// the compiler reserves G + 1 barriers rather than all 16.
__device__ __forceinline__ void group_barrier(int group) {
  switch (group) {
    case 0: asm volatile("bar.sync 1, %0;\n" ::"n"(kGroupThreads) : "memory"); break;
    case 1: asm volatile("bar.sync 2, %0;\n" ::"n"(kGroupThreads) : "memory"); break;
    case 2: asm volatile("bar.sync 3, %0;\n" ::"n"(kGroupThreads) : "memory"); break;
    default: asm volatile("bar.sync 4, %0;\n" ::"n"(kGroupThreads) : "memory"); break;
  }
}

// Query block of the launch's linear block id when one block fills a multiprocessor: the
// heaviest (most key chunks, the last of a causal prompt) first, so that the light ones
// fill in behind them.
__device__ __forceinline__ int heaviest_first(int* head) {
  const int n_blocks = gridDim.x, n_heads = gridDim.y;
  const int linear = blockIdx.x + blockIdx.y * n_blocks;
  *head = linear % n_heads;
  return n_blocks - 1 - linear / n_heads;
}

// The cache slots of this thread's rows of the half tile at key kb (-1: past key_end, zero-filled).
template <int D, typename KV>
__device__ __forceinline__ void fetch_slots(const PrefillAttentionArgs& a, const int32_t* table, int block_shift,
                                            int kb, int key_end, int (&slots)[TileCopy<D, KV>::kPerThread]) {
  using C = TileCopy<D, KV>;
  const int first_row = (threadIdx.x % kGroupThreads) / C::kPieces;
#pragma unroll
  for (int j = 0; j < C::kPerThread; ++j) {
    const int key = kb + first_row + j * C::kRowStep;
    slots[j] = key < key_end ? int(slot_of(a, table, block_shift, key)) : -1;
  }
}

// One K and one V half tile into a group's stage from the slots fetch_slots gave. An f16 cache is copied
// asynchronously (the caller commits and waits); an f32 cache through registers, two rows
// of loads in flight before they are converted (registers are short here).
template <int D, typename KV>
__device__ __forceinline__ void copy_tile(const PrefillAttentionArgs& a, int kv_head,
                                          const int (&slots)[TileCopy<D, KV>::kPerThread], __half* k_dst,
                                          __half* v_dst) {
  using C = TileCopy<D, KV>;
  constexpr int kRow = D + kPad;
  const int first_row = (threadIdx.x % kGroupThreads) / C::kPieces, c = (threadIdx.x % C::kPieces) * C::kWidth;
  const KV* k_cache = static_cast<const KV*>(a.k_cache) + int64_t(kv_head) * D + c;
  const KV* v_cache = static_cast<const KV*>(a.v_cache) + int64_t(kv_head) * D + c;
  if constexpr (sizeof(KV) == 2) {
#pragma unroll
    for (int j = 0; j < C::kPerThread; ++j) {
      const int at = (first_row + j * C::kRowStep) * kRow + c;
      const bool valid = slots[j] >= 0;
      const int64_t slot = valid ? slots[j] : 0;
      cp_async_16_or_zero(k_dst + at, k_cache + slot * a.k_slot_stride, valid);
      cp_async_16_or_zero(v_dst + at, v_cache + slot * a.v_slot_stride, valid);
    }
  } else {
    constexpr int kBatch = 2;
    static_assert(C::kPerThread % kBatch == 0, "whole batches of rows");
#pragma unroll
    for (int j0 = 0; j0 < C::kPerThread; j0 += kBatch) {
      float4 kv[kBatch], vv[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int64_t slot = slots[j0 + j];
        const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
        kv[j] = slot >= 0 ? load4(k_cache + slot * a.k_slot_stride) : zero;
        vv[j] = slot >= 0 ? load4(v_cache + slot * a.v_slot_stride) : zero;
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int at = (first_row + (j0 + j) * C::kRowStep) * kRow + c;
        store4(k_dst + at, kv[j]);
        store4(v_dst + at, vv[j]);
      }
    }
  }
}

// G warp groups of 4 warps: two blocks of 256 threads (G = 2) or one of 512 (G = 4) per
// multiprocessor, 128 registers a thread either way.
template <int D, typename KV, int G, int S>
__global__ void __launch_bounds__(G * kGroupThreads, 4 / G) prefill_attention_kernel(PrefillAttentionArgs a) {
  constexpr int kStages = S;
  constexpr int kThreads = G * kGroupThreads;
  extern __shared__ __align__(16) __half smem[];
  constexpr int kRow = D + kPad;
  constexpr int kChunkTile = kChunk * kRow;
  constexpr int kGroupRegion = 2 * kStages * kChunkTile;  // a group's K stages, then its V stages
  __half* q_s = smem;

  detail::wait_for_previous_kernels();  // q and the cache come from the kernels before
  int head = 0;
  const int q0 = (G == 2 ? block_order(&head) : heaviest_first(&head)) * kQueryRows;
  const int block_shift = (a.block_size & (a.block_size - 1)) == 0 ? __ffs(a.block_size) - 1 : -1;
  const int kv_head = head / (a.n_head / a.n_head_kv);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int row_warp = warp % 4, group = warp / 4;
  const int g = lane / 4, t = lane % 4;
  __half* k_s = q_s + kQueryRows * kRow + group * kGroupRegion;  // this group's kStages chunks
  __half* v_s = k_s + kStages * kChunkTile;
  const int32_t* table = a.block_tables + int64_t(a.seq_rows[0]) * a.block_table_stride;

  const int last_token = min(q0 + kQueryRows, a.n_tokens) - 1;
  const int key_end = a.first_position + last_token + 1;  // keys [.., key_end) are needed
  int key_begin = a.sliding_window > 0 ? max(0, a.first_position + q0 - a.sliding_window + 1) : 0;
  key_begin = key_begin / kChunk * kChunk;
  const int n_chunks = (key_end - key_begin + kChunk - 1) / kChunk;
  const int my_chunks = (n_chunks - group + G - 1) / G;  // chunks group, group + G, ... (maybe none)
  constexpr int kStride = G * kChunk;                    // keys from one of the group's chunks to the next
  const int my_begin = key_begin + group * kChunk;       // the group's first key

  // The first S - 1 chunks' copies run while Q is converted; the next chunk's slots are read
  // meanwhile. Every step commits a group of copies, empty past the group's last chunk, so
  // that the waits below count the same everywhere.
  int slots[TileCopy<D, KV>::kPerThread];
  fetch_slots<D, KV>(a, table, block_shift, my_begin, key_end, slots);  // past key_end: no reads
#pragma unroll
  for (int c = 0; c < kStages - 1; ++c) {
    if (c < my_chunks) copy_tile<D, KV>(a, kv_head, slots, k_s + c * kChunkTile, v_s + c * kChunkTile);
    detail::cp_async_commit();
    fetch_slots<D, KV>(a, table, block_shift, my_begin + (c + 1) * kStride, key_end, slots);
  }

  stage_queries<D, kQueryRows, kThreads>(a, head, q0, q_s);
  __syncthreads();  // Q, written by every group, is read by ldmatrix at every chunk
  // A fragment of the warp's rows for dims kk*16..: matrices rows 0-7 / 8-15 x columns +0 / +8.
  const __half* q_frag = q_s + (row_warp * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * kRow + (lane / 16) * 8;

  // This thread's two query rows (g and g + 8 of the warp's 16) and their positions.
  const int row0 = row_warp * 16 + g;
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

  for (int tile = 0; tile < my_chunks; ++tile) {
    const int kh = my_begin + tile * kStride;  // the chunk's first key
    // One barrier per chunk: after it, this chunk is in shared memory for the group, and
    // every warp of the group is done with the previous chunk's stage, which then takes the
    // group's chunk tile + S - 1 (its slots read an iteration ago); the slots of the one
    // after are read now.
    detail::cp_async_wait<kStages - 2>();
    group_barrier(group);
    if (tile + kStages - 1 < my_chunks) {
      const int next = (tile + kStages - 1) % kStages;
      copy_tile<D, KV>(a, kv_head, slots, k_s + next * kChunkTile, v_s + next * kChunkTile);
      if (tile + kStages < my_chunks)
        fetch_slots<D, KV>(a, table, block_shift, kh + kStages * kStride, key_end, slots);
    }
    detail::cp_async_commit();
    const __half* k_cur = k_s + (tile % kStages) * kChunkTile;
    const __half* v_cur = v_s + (tile % kStages) * kChunkTile;

    // S = Q Kᵀ for the warp's 16 rows and its 32 keys. K rows are Kᵀ's columns, so plain
    // ldmatrix gives B fragments: matrices of keys nb*8.. x dims kk*16 + 0/8/16/24.
    float s[kChunk / 8][4];
#pragma unroll
    for (int nb = 0; nb < kChunk / 8; ++nb) s[nb][0] = s[nb][1] = s[nb][2] = s[nb][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk += 2) {
      uint32_t qa[4], qb[4];
      ldmatrix_x4(qa, q_frag + kk * 16);
      ldmatrix_x4(qb, q_frag + (kk + 1) * 16);
#pragma unroll
      for (int nb = 0; nb < kChunk / 8; ++nb) {
        uint32_t kf[4];
        ldmatrix_x4(kf, k_cur + (nb * 8 + lane % 8) * kRow + kk * 16 + (lane / 8) * 8);
        mma_f16(s[nb], qa, kf[0], kf[1]);
        mma_f16(s[nb], qb, kf[2], kf[3]);
      }
    }

    // Scale (to log2 units), cap, mask; the running maximum and sum of each row (quads
    // share rows). Half tiles wholly below the diagonal and inside the window need no mask.
    const bool masked = kh + kChunk - 1 > first_row_position ||
                        (a.sliding_window > 0 && kh <= last_row_position - a.sliding_window);
    if (a.softcap > 0.0f) {
#pragma unroll
      for (int nb = 0; nb < kChunk / 8; ++nb)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nb][e] = cap_log2 * tanhf(s[nb][e] * scale_over_cap);
    } else {
#pragma unroll
      for (int nb = 0; nb < kChunk / 8; ++nb)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nb][e] *= scale_log2;
    }
    if (masked) {
#pragma unroll
      for (int nb = 0; nb < kChunk / 8; ++nb)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e / 2, key = kh + nb * 8 + 2 * t + (e % 2);
          const bool visible = key <= pos[r] && (a.sliding_window <= 0 || key > pos[r] - a.sliding_window);
          s[nb][e] = visible ? s[nb][e] : -INFINITY;
        }
    }
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nb = 0; nb < kChunk / 8; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) tile_max[e / 2] = fmaxf(tile_max[e / 2], s[nb][e]);
    online_softmax_step<kChunk, D>(s, tile_max, m, l, o);
    accumulate_pv<kChunk, D>(o, s, v_cur, lane);
  }

  // Groups 1.. hand their states to group 0 through their own stage memory (idle once all
  // the group's warps are past their last chunk; other groups may still be working in
  // theirs), in fragment order: lane-consecutive words, no bank conflicts. Group 0 then
  // merges the softmax states: each scaled to the largest maximum (a group that saw no key
  // has m = -inf and weight 0).
  constexpr int kMergeWords = 4 * (D / 8) * 4 * kWarpSize;  // o of the group's 4 warps, then m and l
  static_assert((kMergeWords + 4 * 4 * kWarpSize) * sizeof(float) <= kGroupRegion * sizeof(__half),
                "a group's state fits in its stages");
  auto merge_o = [&](int from) {
    return reinterpret_cast<float*>(q_s + kQueryRows * kRow + from * kGroupRegion) + row_warp * (D / 8) * 4 * kWarpSize;
  };
  auto merge_ml = [&](int from) {
    return reinterpret_cast<float*>(q_s + kQueryRows * kRow + from * kGroupRegion) + kMergeWords +
           row_warp * 4 * kWarpSize;
  };
  detail::cp_async_wait<0>();  // (only empty groups can be left)
  if (group > 0) {
    group_barrier(group);  // no warp of the group still reads its last stage
    float* mo = merge_o(group);
    float* ml = merge_ml(group);
#pragma unroll
    for (int nb = 0; nb < D / 8; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) mo[(nb * 4 + e) * kWarpSize + lane] = o[nb][e];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      ml[r * kWarpSize + lane] = m[r];
      ml[(2 + r) * kWarpSize + lane] = l[r];
    }
  }
  __syncthreads();
  if (group > 0) return;
  float m_all[2] = {m[0], m[1]};
#pragma unroll
  for (int from = 1; from < G; ++from)
#pragma unroll
    for (int r = 0; r < 2; ++r) m_all[r] = fmaxf(m_all[r], merge_ml(from)[r * kWarpSize + lane]);
  float factor[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    factor[r] = m[r] == -INFINITY ? 0.0f : exp2f(m[r] - m_all[r]);
    l[r] *= factor[r];
    m[r] = m_all[r];
  }
#pragma unroll
  for (int nb = 0; nb < D / 8; ++nb)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[nb][e] *= factor[e / 2];
#pragma unroll
  for (int from = 1; from < G; ++from) {
    const float* mo = merge_o(from);
    const float* ml = merge_ml(from);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float m_other = ml[r * kWarpSize + lane];
      factor[r] = m_other == -INFINITY ? 0.0f : exp2f(m_other - m_all[r]);
      l[r] += ml[(2 + r) * kWarpSize + lane] * factor[r];
    }
#pragma unroll
    for (int nb = 0; nb < D / 8; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[nb][e] += mo[(nb * 4 + e) * kWarpSize + lane] * factor[e / 2];
  }

  store_normalized_rows<D>(a, head, q0 + row0, t, m, l, o);
}

template <int D, typename KV, int G, int S>
Status launch(const PrefillAttentionArgs& a, cudaStream_t stream) {
  auto kernel = prefill_attention_kernel<D, KV, G, S>;
  constexpr size_t smem = shared_bytes<D, G, S>();
  static_assert(smem <= 227 * 1024, "shared memory of one block");
  static bool configured = false;
  if (!configured) {
    if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
        e != cudaSuccess)
      return Status::from_cuda(e, "cudaFuncSetAttribute (prefill_attention_kernel v8)");
    configured = true;
  }
  const dim3 grid(unsigned((a.n_tokens + kQueryRows - 1) / kQueryRows), unsigned(a.n_head));
  if (cudaError_t e = launch_chained(kernel, grid, dim3(G * kGroupThreads), smem, stream, a); e != cudaSuccess)
    return Status::from_cuda(e, "prefill_attention_kernel v8");
  return launch_status("prefill_attention_kernel v8");
}

template <int G, int S>
Status launch_groups(const PrefillAttentionArgs& a, cudaStream_t stream) {
  const bool f16 = a.cache_type == GgmlType::F16;
  if (a.head_dim == 64) return f16 ? launch<64, __half, G, S>(a, stream) : launch<64, float, G, S>(a, stream);
  return f16 ? launch<128, __half, G, S>(a, stream) : launch<128, float, G, S>(a, stream);
}

}  // namespace v8

Status launch_v8(const PrefillAttentionArgs& a, cudaStream_t stream) { return v8::launch_groups<2, 2>(a, stream); }

}  // namespace kiln::cuda::prefill_detail
