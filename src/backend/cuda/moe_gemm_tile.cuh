#pragma once
// The tile engine of the grouped MoE GEMMs (moe_gemm.cu): one block's product of kTileRows
// weight rows (raw blocks of any MoE weight type, decoded in shared memory) with up to
// kTileTokens activation rows, bf16 WMMA with f32 accumulators. Two versions:
//   v4 (gemm_tile): decode / barrier / MMA / barrier per 32-column step, 4 x 2 warps of
//      32 x 32 over all 64 token columns;
//   v6 (gemm_tile_v6): each warp decodes its own A fragments into registers (no A tile in
//      shared memory), mma.sync over the 8-token n-tiles the tile actually has, a
//      double-buffered B tile and one barrier per step; v7: v6 with unpadded B rows.
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

// Bytes [offset, offset + bytes) of each of kRows weight rows (a null row is skipped) into
// `stage`, rows kPitch bytes apart: each row's bytes behind its misalignment (up to 15
// bytes: GGUF blocks are only byte-aligned), in 16-byte asynchronous copies shared out over
// the kThreads threads of the block. Commits nothing.
template <int kRows, int kThreads, int kPitch>
__device__ __forceinline__ void copy_row_chunks(uint8_t* stage, const uint8_t* const* rows, int64_t offset, int bytes) {
  constexpr int kPieces = kPitch / 16;
  for (int i = threadIdx.x; i < kRows * kPieces; i += kThreads) {
    const int r = i / kPieces, piece = i % kPieces;
    if (!rows[r]) continue;
    const uintptr_t addr = reinterpret_cast<uintptr_t>(rows[r] + offset);
    if (piece * 16 >= int(addr & 15) + bytes) continue;
    cp_async_16(stage + r * kPitch + 16 * piece, reinterpret_cast<const uint8_t*>((addr & ~uintptr_t(15)) + 16 * piece));
  }
}

// Chunk c of every tile row into `stage` (v4, v6 / v7); always commits a group, also past
// the last chunk (nothing to copy then). A row's chunk c starts at rows[r] + c * kBytes.
template <typename W>
__device__ __forceinline__ void issue_raw_chunk(uint8_t* stage, const uint8_t* const* rows, int64_t K, int64_t c) {
  using C = RawChunk<W>;
  if (c * C::kK < K) {
    const int64_t cols = min64(C::kK, K - c * C::kK);
    const int bytes = IsPlain<W>::value ? int(cols) * W::kBytes : int(cols / W::kElems) * W::kBytes;
    copy_row_chunks<kTileRows, kGemmThreads, C::kPitch>(stage, rows, c * C::kBytes, bytes);
  }
  cp_async_commit();
}

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

  auto issue = [&](int64_t c) { issue_raw_chunk<W>(raw + int(c % 2) * L::kStageBytes, rows, K, c); };

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
          const int head = int(reinterpret_cast<uintptr_t>(rows[r] + c * C::kBytes) & 15);
          decode8_staged<W>(stage + r * C::kPitch, head, s * kTileK + a_col, v);
        }
        *reinterpret_cast<uint4*>(a_tile + r * kLdK + a_col) = pack_bf16x8(v);
      }
      act.store(b_tile, kLdK);
      if ((sub + 1) * kTileK < K) act.load(sub + 1);
      __syncthreads();
      mma_step(reinterpret_cast<const Bf16*>(a_tile), reinterpret_cast<const Bf16*>(b_tile), acc);
      __syncthreads();
    }
  }
  cp_async_wait<0>();
}

// ---- v6: weights decoded straight into MMA fragments ------------------------------------
// v4 is bound by shared memory: per 32-column step each block decodes its 128 x 32 weights
// from the raw stage, stores them as a bf16 A tile, and its warps read that tile back as WMMA
// fragments (A twice, B four times over), between two block-wide barriers. v6 has each warp
// decode exactly the A elements its own products need into registers, and multiply with
// mma.sync m16n8k16 (bf16 in, f32 accumulators):
//   - warp w owns weight rows 16w .. 16w+15 and all token columns, in n-tiles of 8 tokens;
//     n-tiles wholly past the tile's token count are skipped (the same for every warp);
//   - K inside a step is permuted: lane (g, t) (g = lane / 4, t = lane % 4) supplies the
//     fragment positions k = 2t, 2t+1, 2t+8, 2t+9 of the first 16-column product from
//     physical columns 8t .. 8t+3 and those of the second from 8t+4 .. 8t+7, in A and in B
//     alike, so a dot product sums the same terms: one decode8 per row gives a lane's A
//     registers for both products, and one 16-byte load per n-tile its B registers;
//   - the B (activation) tile is double-buffered: one barrier per step.
// Measured (docs/perf-notes-moe.md, round 8): v6 is faster than v4 on tiles of up to ~32
// tokens and slower on full ones: its B rows keep v4's padded pitch (kLdK, 80 bytes), made for
// WMMA's loads, and for the 16-byte loads here the two rows a quarter-warp reads then share
// banks (2 wavefronts where 1 would do). v7 is v6 with unpadded 64-byte rows (kLdB = kTileK),
// conflict-free for those loads and for the activation stores: faster than v4 on uniform and
// on concentrated routing in the kernel bench.
template <typename W, int kLdB>
struct GemmLayoutV6 {
  static constexpr int kStageBytes = kTileRows * RawChunk<W>::kPitch;
  static constexpr int kCBytes = kTileTokens * kLdC * 4;
  static constexpr int kRawBytes = 2 * kStageBytes > kCBytes ? 2 * kStageBytes : kCBytes;
  static constexpr int kBBytes = kTileTokens * kLdB * 2;  // one buffer
  static constexpr int kTotal = kRawBytes + 2 * kBBytes;
};

constexpr int kNTiles = kTileTokens / 8;

// d += a * b for one 16 x 8 x 16 piece (bf16 operands, f32 accumulators).
__device__ __forceinline__ void mma_bf16_16x8x16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The A registers of one 32-column step's two 16-column products, from a lane's 8 decoded
// values of rows g (v0) and g + 8 (v1) of its warp's 16 (the K permutation of gemm_tile_v6).
__device__ __forceinline__ void pack_a_step(const float* v0, const float* v1, uint32_t (&lo)[4], uint32_t (&hi)[4]) {
  lo[0] = pack_bf16x2(v0[0], v0[1]), lo[1] = pack_bf16x2(v1[0], v1[1]);
  lo[2] = pack_bf16x2(v0[2], v0[3]), lo[3] = pack_bf16x2(v1[2], v1[3]);
  hi[0] = pack_bf16x2(v0[4], v0[5]), hi[1] = pack_bf16x2(v1[4], v1[5]);
  hi[2] = pack_bf16x2(v0[6], v0[7]), hi[3] = pack_bf16x2(v1[6], v1[7]);
}

// acc[j] += the step's products with the first n_tiles 8-token n-tiles; b holds the step's
// token rows (32 bf16 each, in the same permutation) b_pitch elements apart.
__device__ __forceinline__ void mma_step_tokens(float (&acc)[kNTiles][4], const uint32_t (&lo)[4],
                                                const uint32_t (&hi)[4], const uint16_t* b, int b_pitch,
                                                int n_tiles, int g, int t) {
#pragma unroll
  for (int j = 0; j < kNTiles; ++j) {
    if (j >= n_tiles) break;  // the same for the whole block
    const uint4 bj = *reinterpret_cast<const uint4*>(b + (8 * j + g) * b_pitch + 8 * t);
    mma_bf16_16x8x16(acc[j], lo, bj.x, bj.y);
    mma_bf16_16x8x16(acc[j], hi, bj.z, bj.w);
  }
}

// As gemm_tile, for the first n_tokens activation rows; ends with the block's products in
// shared memory as c[token * kLdC + row] (returned), every thread past a barrier.
template <typename W, int kLdB, typename Act>
__device__ __forceinline__ float* gemm_tile_v6(uint8_t* smem, const uint8_t* const* rows, int64_t K, int n_tokens,
                                               Act& act) {
  using C = RawChunk<W>;
  using L = GemmLayoutV6<W, kLdB>;
  uint8_t* raw = smem;
  uint16_t* b_tiles = reinterpret_cast<uint16_t*>(smem + L::kRawBytes);
  const int tid = threadIdx.x, lane = tid % kWarpSize, warp = tid / kWarpSize;
  const int g = lane / 4, t = lane % 4;
  const int64_t n_chunks = (K + C::kK - 1) / C::kK;
  const int n_tiles = (n_tokens + 7) / 8;

  auto issue = [&](int64_t c) { issue_raw_chunk<W>(raw + int(c % 2) * L::kStageBytes, rows, K, c); };

  // This lane's two weight rows: g and g + 8 of the warp's 16.
  const int r0 = 16 * warp + g, r1 = r0 + 8;
  const uint8_t* row0 = rows[r0];
  const uint8_t* row1 = rows[r1];
  float acc[kNTiles][4];
#pragma unroll
  for (int j = 0; j < kNTiles; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
  issue(0);
  act.load(0);
  int64_t sub = 0;
  for (int64_t c = 0; c < n_chunks; ++c) {
    // Stage (c + 1) % 2 was last read by the decode of chunk c - 1, which every thread
    // finished before the last step barrier.
    issue(c + 1);
    cp_async_wait<1>();
    __syncthreads();  // chunk c is in shared memory for every thread
    const uint8_t* stage = raw + int(c % 2) * L::kStageBytes;
    const int head0 = row0 ? int(reinterpret_cast<uintptr_t>(row0 + c * C::kBytes) & 15) : 0;
    const int head1 = row1 ? int(reinterpret_cast<uintptr_t>(row1 + c * C::kBytes) & 15) : 0;
    const int subs = int(min64(C::kK, K - c * C::kK) / kTileK);
    for (int s = 0; s < subs; ++s, ++sub) {
      // B buffer sub % 2 was last read by the products of step sub - 2, which every thread
      // finished before the barrier of step sub - 1.
      uint16_t* b_tile = b_tiles + int(sub % 2) * (kTileTokens * kLdB);
      act.store(b_tile, kLdB);
      if ((sub + 1) * kTileK < K) act.load(sub + 1);
      float v0[8] = {0, 0, 0, 0, 0, 0, 0, 0}, v1[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      if (row0) decode8_staged<W>(stage + r0 * C::kPitch, head0, s * kTileK + 8 * t, v0);
      if (row1) decode8_staged<W>(stage + r1 * C::kPitch, head1, s * kTileK + 8 * t, v1);
      uint32_t a_lo[4], a_hi[4];  // the A registers of the two 16-column products
      pack_a_step(v0, v1, a_lo, a_hi);
      __syncthreads();  // step sub's B tile is complete
      mma_step_tokens(acc, a_lo, a_hi, b_tile, kLdB, n_tiles, g, t);
    }
  }
  cp_async_wait<0>();
  // The results alias the raw stages only, whose last reader (the last decode) every thread
  // finished before the last step barrier.
  float* out = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int j = 0; j < kNTiles; ++j) {
    if (j >= n_tiles) break;
    const int n = 8 * j + 2 * t;
    out[n * kLdC + r0] = acc[j][0];
    out[(n + 1) * kLdC + r0] = acc[j][1];
    out[n * kLdC + r1] = acc[j][2];
    out[(n + 1) * kLdC + r1] = acc[j][3];
  }
  __syncthreads();
  return out;
}

}  // namespace kiln::cuda::detail
