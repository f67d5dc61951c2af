#pragma once
// The tile engine of the grouped MoE GEMMs (moe_gemm.cu): one block's product of kTileRows
// weight rows (raw blocks of any MoE weight type, decoded in shared memory) with up to
// kTileTokens activation rows, bf16 WMMA with f32 accumulators. Two versions:
//   v4 (gemm_tile): decode / barrier / MMA / barrier per 32-column step, 4 x 2 warps of
//      32 x 32 over all 64 token columns;
//   v5 (gemm_tile_v5): double-buffered A and B tiles, one barrier per step, 8 warps of
//      16 rows x the token columns the tile actually has.
#include <mma.h>

#include "backend/cuda/moe_kernels.cuh"
#include "backend/cuda/moe_staged_decode.cuh"

namespace kiln::cuda::detail {

constexpr int kTileTokens = 64;   // tokens (sorted pairs) per tile
constexpr int kTileK = 32;        // K step
constexpr int kLdK = kTileK + 8;  // bf16 per shared row (pads off bank conflicts; a multiple of 8)
constexpr int kGemmThreads = 256; // 8 warps: 4 along the rows x 2 along the tokens, 32 x 32 each
constexpr int kTileRows = 128;    // weight rows per block (gate/up: 64 of gate + the same 64 of up)
// Registers capped for 3 blocks (24 warps) per SM: at ~100 registers gate/up ran 2 blocks per
// SM, and each K step's decode and its two block-wide barriers left the SM mostly waiting.
constexpr int kGemmBlocksPerSm = 3;
constexpr int kLdC = kTileRows + 4;

using Bf16 = __nv_bfloat16;

__device__ __forceinline__ uint4 pack_bf16x8(const float* v) {
  uint4 u;
  uint32_t* w = reinterpret_cast<uint32_t*>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __nv_bfloat162 pair = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
    w[i] = *reinterpret_cast<const uint32_t*>(&pair);
  }
  return u;
}

// ---- the tile engine ---------------------------------------------------------------------
// Raw weight bytes travel in chunks of kK columns (one K-quant super-block, or 4 blocks of
// 32) per row, copied with 16-byte asynchronous copies one chunk ahead; each chunk is then
// decoded 32 columns at a time from shared memory into the bf16 A tile.

// Blocks of 32 travel in chunks of 128 columns (4 blocks): with 256, q8_0's two stages of
// 128 rows took 74 KB and held the launch to 2 blocks per SM.
template <typename W>
struct RawChunk {
  static constexpr int kK = IsPlain<W>::value ? (W::kBytes == 4 ? 64 : 128) : W::kElems == 32 ? 128 : 256;
  static constexpr int kBytes = IsPlain<W>::value ? kK * W::kBytes : kK / W::kElems * W::kBytes;
  // The chunk's bytes behind up to 15 bytes of misalignment, in whole 16-byte pieces.
  static constexpr int kPitch = (kBytes + 15 + 15) / 16 * 16;
  static constexpr int kPieces = kPitch / 16;
};

// Dynamic shared memory: [2 raw stages][A tile][B tile]; the f32 results alias the stages.
template <typename W>
struct GemmLayout {
  static constexpr int kStageBytes = kTileRows * RawChunk<W>::kPitch;
  static constexpr int kCBytes = kTileTokens * kLdC * 4;
  static constexpr int kRawBytes = 2 * kStageBytes > kCBytes ? 2 * kStageBytes : kCBytes;
  static constexpr int kABytes = kTileRows * kLdK * 2;
  static constexpr int kBBytes = kTileTokens * kLdK * 2;
  static constexpr int kTotal = kRawBytes + kABytes + kBBytes;
};

using AccFrag = nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float>;

// The block's 128 x 64 product over one K step of 32 from the staged tiles (A: row-major
// (row, k); B: (token, k), i.e. column-major K x N); acc[i][j] is the warp's 16 x 16 piece
// at rows 32*wm + 16*i, tokens 32*wn + 16*j.
__device__ __forceinline__ void mma_step(const Bf16* a_tile, const Bf16* b_tile, AccFrag (&acc)[2][2]) {
  using namespace nvcuda;
  const int warp = threadIdx.x / kWarpSize, wm = warp % 4, wn = warp / 4;
#pragma unroll
  for (int kk = 0; kk < kTileK; kk += 16) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, Bf16, wmma::row_major> fa[2];
    wmma::fragment<wmma::matrix_b, 16, 16, 16, Bf16, wmma::col_major> fb[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(fa[i], a_tile + (32 * wm + 16 * i) * kLdK + kk, kLdK);
#pragma unroll
    for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(fb[j], b_tile + (32 * wn + 16 * j) * kLdK + kk, kLdK);
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
  }
}

// Results as c[token * kLdC + row].
__device__ __forceinline__ void store_acc(float* c, AccFrag (&acc)[2][2]) {
  using namespace nvcuda;
  const int warp = threadIdx.x / kWarpSize, wm = warp % 4, wn = warp / 4;
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j)
      wmma::store_matrix_sync(c + (32 * wn + 16 * j) * kLdC + 32 * wm + 16 * i, acc[i][j], kLdC, wmma::mem_col_major);
}

__device__ __forceinline__ void zero_acc(AccFrag (&acc)[2][2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) nvcuda::wmma::fill_fragment(acc[i][j], 0.0f);
}

// One block's product of kTileRows weight rows (row_of(i): its bytes, or null past the end)
// with kTileTokens activation rows over K columns, into acc. The activations come from
// `Act`: load(sub) fetches this thread's share of sub-step `sub` (32 columns) into
// registers, store() puts it into the B tile.
template <typename W, typename Act>
__device__ __forceinline__ void gemm_tile(uint8_t* smem, const uint8_t* const* rows, int64_t K, Act& act,
                                          AccFrag (&acc)[2][2]) {
  using C = RawChunk<W>;
  using L = GemmLayout<W>;
  uint8_t* raw = smem;
  uint16_t* a_tile = reinterpret_cast<uint16_t*>(smem + L::kRawBytes);
  uint16_t* b_tile = reinterpret_cast<uint16_t*>(smem + L::kRawBytes + L::kABytes);
  const int tid = threadIdx.x;
  const int64_t n_chunks = (K + C::kK - 1) / C::kK;

  auto chunk_bytes = [&](int64_t c) {
    const int64_t cols = min64(C::kK, K - c * C::kK);
    return IsPlain<W>::value ? int(cols) * W::kBytes : int(cols / W::kElems) * W::kBytes;
  };
  auto chunk_src = [&](int r, int64_t c) {  // first byte of chunk c of tile row r
    return rows[r] + c * (IsPlain<W>::value ? int64_t(C::kK) * W::kBytes : int64_t(C::kK / W::kElems) * W::kBytes);
  };
  auto issue = [&](int64_t c) {
    if (c < n_chunks) {
      const int bytes = chunk_bytes(c);
      uint8_t* stage = raw + int(c % 2) * L::kStageBytes;
      for (int i = tid; i < kTileRows * C::kPieces; i += kGemmThreads) {
        const int r = i / C::kPieces, piece = i % C::kPieces;
        if (!rows[r]) continue;
        const uintptr_t addr = reinterpret_cast<uintptr_t>(chunk_src(r, c));
        if (piece * 16 >= int(addr & 15) + bytes) continue;
        cp_async_16(stage + r * C::kPitch + 16 * piece, reinterpret_cast<const uint8_t*>((addr & ~uintptr_t(15)) + 16 * piece));
      }
    }
    cp_async_commit();
  };

  // This thread decodes rows a_row and a_row + 64, 8 columns at a_col of each sub-step.
  const int a_row = tid / 4, a_col = (tid % 4) * 8;
  issue(0);
  act.load(0);
  int64_t sub = 0;
  for (int64_t c = 0; c < n_chunks; ++c) {
    issue(c + 1);
    cp_async_wait<1>();
    __syncthreads();  // chunk c is in shared memory for every thread
    const uint8_t* stage = raw + int(c % 2) * L::kStageBytes;
    const int subs = int(min64(C::kK, K - c * C::kK) / kTileK);
    for (int s = 0; s < subs; ++s, ++sub) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = a_row + 64 * half;
        float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        if (rows[r]) {
          const int head = int(reinterpret_cast<uintptr_t>(chunk_src(r, c)) & 15);
          decode8_staged<W>(stage + r * C::kPitch, head, s * kTileK + a_col, v);
        }
        *reinterpret_cast<uint4*>(a_tile + r * kLdK + a_col) = pack_bf16x8(v);
      }
      act.store(b_tile);
      if ((sub + 1) * kTileK < K) act.load(sub + 1);
      __syncthreads();
      mma_step(reinterpret_cast<const Bf16*>(a_tile), reinterpret_cast<const Bf16*>(b_tile), acc);
      __syncthreads();
    }
  }
  cp_async_wait<0>();
}

// ---- v5: one barrier per K step, and no products for a tile's empty token columns ---------
// v4 (gemm_tile above) runs each 32-column step as decode / barrier / MMA / barrier, and its
// 4 x 2 warps multiply all 64 token columns even when the tile holds fewer tokens (with 128
// experts and 8 used of 512 tokens an expert gets ~32, so half of the products were zeros).
// v5 keeps two A and two B tiles: step s decodes into buffer s % 2 while slower warps may
// still multiply step s - 1 out of the other one, so one barrier per step is enough (plus
// one where a new raw chunk lands). Its 8 warps each own 16 weight rows and all 64 token
// columns in four 16-wide fragments, and skip the fragments that lie wholly past the tile's
// token count: every warp does the same, smaller amount of work.
template <typename W>
struct GemmLayoutV5 {
  static constexpr int kStageBytes = kTileRows * RawChunk<W>::kPitch;
  static constexpr int kCBytes = kTileTokens * kLdC * 4;
  static constexpr int kRawBytes = 2 * kStageBytes > kCBytes ? 2 * kStageBytes : kCBytes;
  static constexpr int kABytes = kTileRows * kLdK * 2;  // one buffer
  static constexpr int kBBytes = kTileTokens * kLdK * 2;
  static constexpr int kTotal = kRawBytes + 2 * kABytes + 2 * kBBytes;
};

constexpr int kTokenFrags = kTileTokens / 16;

// Warp w's rows 16w .. 16w+15 times the token fragments j with 16 j < n_tokens, one K step.
__device__ __forceinline__ void mma_step_v5(const Bf16* a_tile, const Bf16* b_tile, int n_tokens,
                                            AccFrag (&acc)[kTokenFrags]) {
  using namespace nvcuda;
  const int warp = threadIdx.x / kWarpSize;
#pragma unroll
  for (int kk = 0; kk < kTileK; kk += 16) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, Bf16, wmma::row_major> fa;
    wmma::load_matrix_sync(fa, a_tile + 16 * warp * kLdK + kk, kLdK);
#pragma unroll
    for (int j = 0; j < kTokenFrags; ++j) {
      if (16 * j >= n_tokens) break;  // the same for the whole block
      wmma::fragment<wmma::matrix_b, 16, 16, 16, Bf16, wmma::col_major> fb;
      wmma::load_matrix_sync(fb, b_tile + 16 * j * kLdK + kk, kLdK);
      wmma::mma_sync(acc[j], fa, fb, acc[j]);
    }
  }
}

// Results as c[token * kLdC + row] for the fragments that were computed.
__device__ __forceinline__ void store_acc_v5(float* c, int n_tokens, AccFrag (&acc)[kTokenFrags]) {
  const int warp = threadIdx.x / kWarpSize;
#pragma unroll
  for (int j = 0; j < kTokenFrags; ++j)
    if (16 * j < n_tokens)
      nvcuda::wmma::store_matrix_sync(c + 16 * j * kLdC + 16 * warp, acc[j], kLdC, nvcuda::wmma::mem_col_major);
}

// As gemm_tile, for the first n_tokens activation rows; ends with the block's products in
// shared memory as c[token * kLdC + row] (returned), every thread past a barrier.
template <typename W, typename Act>
__device__ __forceinline__ float* gemm_tile_v5(uint8_t* smem, const uint8_t* const* rows, int64_t K, int n_tokens,
                                               Act& act) {
  using C = RawChunk<W>;
  using L = GemmLayoutV5<W>;
  uint8_t* raw = smem;
  uint16_t* a_tiles = reinterpret_cast<uint16_t*>(smem + L::kRawBytes);
  uint16_t* b_tiles = reinterpret_cast<uint16_t*>(smem + L::kRawBytes + 2 * L::kABytes);
  const int tid = threadIdx.x;
  const int64_t n_chunks = (K + C::kK - 1) / C::kK;
  const int64_t chunk_stride = IsPlain<W>::value ? int64_t(C::kK) * W::kBytes : int64_t(C::kK / W::kElems) * W::kBytes;

  auto issue = [&](int64_t c) {
    if (c < n_chunks) {
      const int64_t cols = min64(C::kK, K - c * C::kK);
      const int bytes = IsPlain<W>::value ? int(cols) * W::kBytes : int(cols / W::kElems) * W::kBytes;
      uint8_t* stage = raw + int(c % 2) * L::kStageBytes;
      for (int i = tid; i < kTileRows * C::kPieces; i += kGemmThreads) {
        const int r = i / C::kPieces, piece = i % C::kPieces;
        if (!rows[r]) continue;
        const uintptr_t addr = reinterpret_cast<uintptr_t>(rows[r] + c * chunk_stride);
        if (piece * 16 >= int(addr & 15) + bytes) continue;
        cp_async_16(stage + r * C::kPitch + 16 * piece, reinterpret_cast<const uint8_t*>((addr & ~uintptr_t(15)) + 16 * piece));
      }
    }
    cp_async_commit();
  };

  // This thread decodes 16 columns of one row per step (the two halves share a K-quant
  // sub-block, so its scale is read once).
  const int a_row = tid / 2, a_col = (tid % 2) * 16;
  const uint8_t* my_row = rows[a_row];
  AccFrag acc[kTokenFrags];
#pragma unroll
  for (int j = 0; j < kTokenFrags; ++j) nvcuda::wmma::fill_fragment(acc[j], 0.0f);
  issue(0);
  act.load(0);
  int64_t sub = 0;
  for (int64_t c = 0; c < n_chunks; ++c) {
    // Stage (c + 1) % 2 was last read by the decode of chunk c - 1, which every thread
    // finished before the last step barrier.
    issue(c + 1);
    cp_async_wait<1>();
    __syncthreads();  // chunk c is in shared memory for every thread
    const uint8_t* stage = raw + int(c % 2) * L::kStageBytes + a_row * C::kPitch;
    const int head = my_row ? int(reinterpret_cast<uintptr_t>(my_row + c * chunk_stride) & 15) : 0;
    const int subs = int(min64(C::kK, K - c * C::kK) / kTileK);
    for (int s = 0; s < subs; ++s, ++sub) {
      // Buffer sub % 2 was last read by the products of step sub - 2, which every thread
      // finished before the barrier of step sub - 1.
      uint16_t* a_tile = a_tiles + int(sub % 2) * (kTileRows * kLdK);
      uint16_t* b_tile = b_tiles + int(sub % 2) * (kTileTokens * kLdK);
      float v[16];
#pragma unroll
      for (int i = 0; i < 16; ++i) v[i] = 0.0f;
      if (my_row) {
        decode8_staged<W>(stage, head, s * kTileK + a_col, v);
        decode8_staged<W>(stage, head, s * kTileK + a_col + 8, v + 8);
      }
      *reinterpret_cast<uint4*>(a_tile + a_row * kLdK + a_col) = pack_bf16x8(v);
      *reinterpret_cast<uint4*>(a_tile + a_row * kLdK + a_col + 8) = pack_bf16x8(v + 8);
      act.store(b_tile);
      if ((sub + 1) * kTileK < K) act.load(sub + 1);
      __syncthreads();  // step sub's A and B tiles are complete
      mma_step_v5(reinterpret_cast<const Bf16*>(a_tile), reinterpret_cast<const Bf16*>(b_tile), n_tokens, acc);
    }
  }
  cp_async_wait<0>();
  // The results alias the raw stages only, whose last reader (the last decode) every thread
  // finished before the last step barrier.
  float* c = reinterpret_cast<float*>(smem);
  store_acc_v5(c, n_tokens, acc);
  __syncthreads();
  return c;
}

}  // namespace kiln::cuda::detail
