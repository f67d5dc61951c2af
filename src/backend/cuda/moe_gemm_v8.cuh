#pragma once
// Tile engine v8 of the grouped MoE GEMMs (moe_gemm.cu), for q4_K and q6_K weights; every
// other type (and q4_K data that is not 16-byte aligned) runs v7 (moe_gemm_tile.cuh).
//
// Why: Nsight Compute on v7 (Qwen3-30B-A3B shapes, q4_K) showed the SMs issue-bound, not
// waiting on memory: 71-77% of issue slots busy, DRAM at 4-12% of its bandwidth, and ~23-29
// instructions issued per decoded weight (T = 64 uniform / T = 512 concentrated), of which
// the bf16 decode itself needs ~3.5. The rest was per-step overhead: a weight header, scales
// and a misalignment funnel re-derived per 8 weights, the activations loaded into registers,
// converted and stored to shared memory every 32 columns behind a block-wide barrier.
// docs/perf-notes-moe.md, round 9, has the figures.
//
// v8, per block of kV8Rows = 256 weight rows and up to 64 tokens (16 warps of 16 rows x all
// tokens, v6's mma.sync fragment mapping):
//   - one pipeline stage is a chunk of 256 columns: one super-block of each row's raw bytes
//     and the tile's 64 activation rows as bf16, both copied with cp.async, three stages for
//     q4_K and two for q6_K (shared memory), one block-wide barrier per chunk (8 MMA steps)
//     instead of one per step;
//   - the activations are bf16 before the GEMM (h already is; x is rounded once per token by
//     a small launch), so no thread converts or stores them inside the K loop;
//   - a lane works out its rows' scales once per chunk (q4_K: the 4 lanes of a quad each take
//     two of the 8 sub-blocks and pass them round with shuffles), and reads each quant word
//     once for the steps that share it (q4_K: low and high nibbles; q6_K: the 2-bit highs of 4
//     steps, the low nibbles of 2);
//   - per weight: a byte permute to a float (2^23 trick), one subtract and one FMA or
//     multiply, half a bf16 pack. The values are exactly v7's: for q4_K dl * q is exact in f32
//     (an 11-bit d times a 6-bit scale times a 4-bit quant), so fmaf(dl, q, -ml) rounds once
//     where d*q - m rounds once too; q6_K multiplies as before.
#include "backend/cuda/expert_tiles.h"
#include "backend/cuda/moe_gemm_tile.cuh"

namespace kiln::cuda::detail {

constexpr int kV8Rows = 256;          // weight rows per block (gate/up: 128 of gate + the same 128 of up)
constexpr int kV8Threads = 512;       // 16 warps of 16 rows
constexpr int kV8Chunk = 256;         // columns per pipeline stage: one super-block per row
constexpr int kV8Steps = kV8Chunk / kTileK;
constexpr int kV8LdC = kV8Rows + 4;   // f32 results c[token * kV8LdC + row]
// The activations of one chunk: [step][token][32 columns] bf16, 64-byte rows (v7's
// conflict-free pitch for the 16-byte fragment loads).
constexpr int kV8BBytes = kV8Steps * kTileTokens * kTileK * 2;

// The weight types v8 decodes, with the pitch of a row's staged super-block.
template <typename W>
struct V8Weights {
  static constexpr bool kTaken = false;
};
template <>
struct V8Weights<Format<GgmlType::Q4_K>> {
  static constexpr bool kTaken = true;
  static constexpr int kPitch = 144;  // rows must be 16-byte aligned (checked at launch)
};
template <>
struct V8Weights<Format<GgmlType::Q6_K>> {
  static constexpr bool kTaken = true;
  static constexpr int kPitch = 240;  // 210 bytes behind up to 15 bytes of misalignment, whole pieces
};

// Dynamic shared memory: kStages stages of [raw rows][activations]; the f32 results alias
// them at the end. Two stages fit q6_K (184 KB), three only q4_K (204 KB).
template <typename W, int kStages>
struct V8Layout {
  static constexpr int kRawBytes = kV8Rows * V8Weights<W>::kPitch;
  static constexpr int kStageBytes = kRawBytes + kV8BBytes;
  static constexpr int kCBytes = kTileTokens * kV8LdC * 4;
  static constexpr int kTotal = kStages * kStageBytes > kCBytes ? kStages * kStageBytes : kCBytes;
};

// 4 quant bytes as the floats (byte - kOffset) through the 2^23 trick (moe_staged_decode.cuh).
template <int kOffset>
__device__ __forceinline__ void bytes_as_floats(uint32_t bytes, float* v) {
#pragma unroll
  for (int i = 0; i < 4; ++i) v[i] = byte_as_float<kOffset>(bytes, i);
}

// ---- q4_K: one lane's two rows over one chunk --------------------------------------------
// Lane (g, t) decodes columns 8t .. 8t+7 of each 32-column step (sub-block s = step) of rows
// g and g + 8 of its warp. Sub-block s's quants are the low (s even) or high (s odd) nibbles
// of bytes 16 + 32 (s / 2) + 8t .. +7 of the block.
struct Q4kLane {
  float dl[2][2], ml[2][2];  // [row][i]: sub-block 2t + i of this lane's rows
  uint2 q[2];                // quant bytes of the current pair of steps

  __device__ __forceinline__ void prepare(const uint8_t* block0, const uint8_t* block1, int t) {
    const uint8_t* blocks[2] = {block0, block1};
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      // d, dmin (f16) then 12 bytes: scales 0-3 / high bits of 4-7 (p0), mins 0-3 / high bits
      // of 4-7 (p1), low nibbles of scales and mins 4-7 (p2).
      const uint4 head = *reinterpret_cast<const uint4*>(blocks[r]);
      const float d = half_to_float(head.x), dmin = half_to_float(head.x >> 16);
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int j = 2 * t + i;
        int sc, m;
        if (j < 4) {
          sc = (head.y >> (8 * j)) & 63;
          m = (head.z >> (8 * j)) & 63;
        } else {
          const int s = 8 * (j - 4);
          sc = ((head.w >> s) & 0xF) | (((head.y >> s) >> 6 & 3) << 4);
          m = ((head.w >> s) >> 4 & 0xF) | (((head.z >> s) >> 6 & 3) << 4);
        }
        dl[r][i] = d * float(sc);
        ml[r][i] = dmin * float(m);
      }
    }
  }

  // The 8 values of step s for row r (0 or 1); q holds the quants of step pair s / 2.
  template <int kStep>
  __device__ __forceinline__ void values(int r, float scale, float min, float* v) const {
    const int shift = 4 * (kStep % 2);
    const uint32_t n0 = (q[r].x >> shift) & 0x0F0F0F0Fu, n1 = (q[r].y >> shift) & 0x0F0F0F0Fu;
    bytes_as_floats<0>(n0, v);
    bytes_as_floats<0>(n1, v + 4);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = fmaf(scale, v[i], -min);
  }
};

// ---- q6_K: one lane's two rows over one chunk --------------------------------------------
// Element e = 32 s + 8 t + i of a super-block: half = s / 4, k = s % 4; low nibble from byte
// 64 half + 32 (k & 1) + 8t + i (shifted by 4 (k / 2)), high 2 bits from byte 128 + 32 half +
// 8t + i (shifted by 2k), scale byte 192 + 2s + t / 2, d (f16) at 208.
struct Q6kLane {
  const uint8_t* base[2];
  int head[2];
  float d[2];
  uint32_t scales[2][4];
  uint32_t ql[2][2][2];  // [row][k & 1][word]
  uint32_t qh[2][2];     // [row][word]

  // d_at: where each row's d sits in its pitch (head + 208 for rows staged from blocks).
  __device__ __forceinline__ void prepare(const uint8_t* base0, int head0, const uint8_t* base1, int head1,
                                          const int (&d_at)[2]) {
    base[0] = base0, base[1] = base1, head[0] = head0, head[1] = head1;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      uint32_t h[1];
      load_words<1>(base[r], d_at[r], h);
      d[r] = half_to_float(h[0]);
      load_words<1>(base[r], head[r] + 192, scales[r]);
    }
  }

  template <int kStep>
  __device__ __forceinline__ void load(int t) {
    constexpr int half = kStep / 4, k = kStep % 4;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if constexpr (k < 2) load_words<1>(base[r], head[r] + 64 * half + 32 * k + 8 * t, ql[r][k]);
      if constexpr (k == 0) load_words<1>(base[r], head[r] + 128 + 32 * half + 8 * t, qh[r]);
    }
  }

  template <int kStep>
  __device__ __forceinline__ void values(int r, int t, float* v) const {
    constexpr int k = kStep % 4;
    // Scale byte 2s + t/2: word s / 2, byte 2 (s % 2) + t / 2.
    const float dl = d[r] * float(int8_t(scales[r][kStep / 2] >> (8 * (2 * (kStep % 2) + (t >> 1)))));
#pragma unroll
    for (int w = 0; w < 2; ++w) {
      const uint32_t level = ((ql[r][k & 1][w] >> (4 * (k >> 1))) & 0x0F0F0F0Fu) | (((qh[r][w] >> (2 * k)) & 0x03030303u) << 4);
      bytes_as_floats<32>(level, v + 4 * w);
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = dl * v[i];
  }
};

// The products of one step from rows r0 (v0) and r1 (v1); b_step holds the step's token rows
// unpadded (kTileK apart).
__device__ __forceinline__ void v8_products(float (&acc)[kNTiles][4], const float* v0, const float* v1,
                                            const uint16_t* b_step, int n_tiles, int g, int t) {
  uint32_t a_lo[4], a_hi[4];
  pack_a_step(v0, v1, a_lo, a_hi);
  mma_step_tokens(acc, a_lo, a_hi, b_step, kTileK, n_tiles, g, t);
}

// One step of a q4_K chunk: step pair kStep / 2's quants are loaded at even steps; sub-block
// kStep's scales live with lane kStep / 2 of this lane's quad, as its entry kStep % 2.
template <int kStep>
__device__ __forceinline__ void v8_q4k_step(Q4kLane& w, float (&acc)[kNTiles][4], const uint8_t* block0,
                                            const uint8_t* block1, const uint16_t* b, int n_tiles, int lane) {
  const int g = lane / 4, t = lane % 4;
  if constexpr (kStep % 2 == 0) {
    w.q[0] = *reinterpret_cast<const uint2*>(block0 + 16 + 32 * (kStep / 2) + 8 * t);
    w.q[1] = *reinterpret_cast<const uint2*>(block1 + 16 + 32 * (kStep / 2) + 8 * t);
  }
  const int from = (lane & ~3) | (kStep / 2);
  const float dl0 = __shfl_sync(0xffffffffu, w.dl[0][kStep % 2], from);
  const float ml0 = __shfl_sync(0xffffffffu, w.ml[0][kStep % 2], from);
  const float dl1 = __shfl_sync(0xffffffffu, w.dl[1][kStep % 2], from);
  const float ml1 = __shfl_sync(0xffffffffu, w.ml[1][kStep % 2], from);
  float v0[8], v1[8];
  w.values<kStep>(0, dl0, ml0, v0);
  w.values<kStep>(1, dl1, ml1, v1);
  v8_products(acc, v0, v1, b + kStep * (kTileTokens * kTileK), n_tiles, g, t);
}

__device__ __forceinline__ void v8_chunk(Format<GgmlType::Q4_K>, float (&acc)[kNTiles][4], const uint8_t* raw,
                                         const uint16_t* b, int r0, int n_tiles, int lane) {
  constexpr int kPitch = V8Weights<Format<GgmlType::Q4_K>>::kPitch;
  const uint8_t* block0 = raw + r0 * kPitch;
  const uint8_t* block1 = block0 + 8 * kPitch;
  Q4kLane w;
  w.prepare(block0, block1, lane % 4);
  v8_q4k_step<0>(w, acc, block0, block1, b, n_tiles, lane);
  v8_q4k_step<1>(w, acc, block0, block1, b, n_tiles, lane);
  v8_q4k_step<2>(w, acc, block0, block1, b, n_tiles, lane);
  v8_q4k_step<3>(w, acc, block0, block1, b, n_tiles, lane);
  v8_q4k_step<4>(w, acc, block0, block1, b, n_tiles, lane);
  v8_q4k_step<5>(w, acc, block0, block1, b, n_tiles, lane);
  v8_q4k_step<6>(w, acc, block0, block1, b, n_tiles, lane);
  v8_q4k_step<7>(w, acc, block0, block1, b, n_tiles, lane);
}

// One step of a q6_K chunk.
template <int kStep>
__device__ __forceinline__ void v8_q6k_step(Q6kLane& w, float (&acc)[kNTiles][4], const uint16_t* b, int n_tiles,
                                            int g, int t) {
  w.load<kStep>(t);
  float v0[8], v1[8];
  w.values<kStep>(0, t, v0);
  w.values<kStep>(1, t, v1);
  v8_products(acc, v0, v1, b + kStep * (kTileTokens * kTileK), n_tiles, g, t);
}

// head0 / head1: where rows r0 / r0 + 8 start in their pitch; d_at: where their d's sit.
__device__ __forceinline__ void v8_chunk(Format<GgmlType::Q6_K>, float (&acc)[kNTiles][4], const uint8_t* raw,
                                         const uint16_t* b, int r0, int head0, int head1, const int (&d_at)[2],
                                         int n_tiles, int lane) {
  constexpr int kPitch = V8Weights<Format<GgmlType::Q6_K>>::kPitch;
  const int g = lane / 4, t = lane % 4;
  Q6kLane w;
  w.prepare(raw + r0 * kPitch, head0, raw + (r0 + 8) * kPitch, head1, d_at);
  v8_q6k_step<0>(w, acc, b, n_tiles, g, t);
  v8_q6k_step<1>(w, acc, b, n_tiles, g, t);
  v8_q6k_step<2>(w, acc, b, n_tiles, g, t);
  v8_q6k_step<3>(w, acc, b, n_tiles, g, t);
  v8_q6k_step<4>(w, acc, b, n_tiles, g, t);
  v8_q6k_step<5>(w, acc, b, n_tiles, g, t);
  v8_q6k_step<6>(w, acc, b, n_tiles, g, t);
  v8_q6k_step<7>(w, acc, b, n_tiles, g, t);
}

// Chunk c (super-block c of every row) of rows in the row-tile layout (expert_tiles.h) into the
// stage as copy_row_chunks lays rows out from blocks, each row at the start of its pitch:
// rows[r] is the start of row r's tile, whose slot it is r % 8 (the block's rows start at a
// multiple of 8). A q6_K row's d stays among its tile's 8: that word goes to bytes 208-223 of
// the row's pitch, the row's d at 208 + 2 (r % 8). Thread i copies word i / kV8Rows of row
// i % kV8Rows: the threads of a warp read a tile's 8 rows' word from 128 bytes in a run.
template <typename W>
__device__ __forceinline__ void copy_tiled_chunk(uint8_t* stage, const uint8_t* const* rows, int64_t c) {
  constexpr bool kQ6 = std::is_same_v<W, Format<GgmlType::Q6_K>>;
  constexpr int kWords = expert_tile_group_words(kQ6 ? GgmlType::Q6_K : GgmlType::Q4_K);
  constexpr int kPieces = kWords + (kQ6 ? 1 : 0);
  constexpr int kPitch = V8Weights<W>::kPitch;
  static_assert(kPieces * 16 <= kPitch);
  for (int i = threadIdx.x; i < kV8Rows * kPieces; i += kV8Threads) {
    const int r = i % kV8Rows, k = i / kV8Rows;
    if (!rows[r]) continue;
    const uint8_t* group = rows[r] + expert_tile_group_start(c, W::kBytes);
    const int at = k < kWords ? expert_tile_word_in_group(k, r % kExpertTileRows) : expert_tile_q6_k_d_in_group(0);
    cp_async_16(stage + r * kPitch + 16 * k, group + at);
  }
}

// The block's product of its kV8Rows weight rows (rows[r]: row r's first byte, or with `tiled`
// the first byte of its tile in the row-tile layout; null past the matrix) with its first
// n_tokens activation rows (act[n]: K bf16, 16-byte aligned) over K (a multiple of 256)
// columns; ends with the results in shared memory as c[token * kV8LdC + row] (returned), every
// thread past a barrier. kStages chunks are in flight or staged at a time.
template <typename W, int kStages>
__device__ __forceinline__ float* gemm_tile_v8(uint8_t* smem, const uint8_t* const* rows, const Bf16* const* act,
                                               int64_t K, int n_tokens, bool tiled) {
  using L = V8Layout<W, kStages>;
  constexpr int kPitch = V8Weights<W>::kPitch;
  const int tid = threadIdx.x, lane = tid % kWarpSize, warp = tid / kWarpSize;
  const int64_t n_chunks = K / kV8Chunk;
  const int n_tiles = (n_tokens + 7) / 8;

  auto issue = [&](int64_t c) {
    if (c < n_chunks) {
      uint8_t* stage = smem + int(c % kStages) * L::kStageBytes;
      if (tiled)
        copy_tiled_chunk<W>(stage, rows, c);
      else
        copy_row_chunks<kV8Rows, kV8Threads, kPitch>(stage, rows, c * W::kBytes, W::kBytes);
      // Token n's 256 columns as 32 pieces of 8: piece q -> step q / 4, columns 8 (q % 4).
      uint16_t* b = reinterpret_cast<uint16_t*>(stage + L::kRawBytes);
      for (int i = tid; i < kTileTokens * 32; i += kV8Threads) {
        const int n = i / 32, q = i % 32;
        if (n >= n_tokens) break;  // n grows with i
        cp_async_16(b + ((q / 4) * kTileTokens + n) * kTileK + 8 * (q % 4), act[n] + c * kV8Chunk + 8 * q);
      }
    }
    cp_async_commit();
  };

  const int r0 = 16 * warp + lane / 4;
  const uint8_t* row0 = rows[r0];
  const uint8_t* row1 = rows[r0 + 8];
  float acc[kNTiles][4];
#pragma unroll
  for (int j = 0; j < kNTiles; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
  for (int c = 0; c < kStages - 1; ++c) issue(c);
  for (int64_t c = 0; c < n_chunks; ++c) {
    cp_async_wait<kStages - 2>();  // this thread's copies of chunk c are done
    // Chunk c is in shared memory for every thread, and every thread is done with chunk
    // c - 1, whose stage the next copies overwrite.
    __syncthreads();
    issue(c + kStages - 1);
    const uint8_t* stage = smem + int(c % kStages) * L::kStageBytes;
    const uint16_t* b = reinterpret_cast<const uint16_t*>(stage + L::kRawBytes);
    if constexpr (std::is_same_v<W, Format<GgmlType::Q4_K>>) {
      v8_chunk(W{}, acc, stage, b, r0, n_tiles, lane);
    } else {
      const int head0 = row0 && !tiled ? int(reinterpret_cast<uintptr_t>(row0 + c * W::kBytes) & 15) : 0;
      const int head1 = row1 && !tiled ? int(reinterpret_cast<uintptr_t>(row1 + c * W::kBytes) & 15) : 0;
      // Rows r0 and r0 + 8 share their slot in their tiles.
      const int tiled_d = 208 + expert_tile_q6_k_d_in_group(r0 % kExpertTileRows) - expert_tile_q6_k_d_in_group(0);
      const int d_at[2] = {tiled ? tiled_d : head0 + 208, tiled ? tiled_d : head1 + 208};
      v8_chunk(W{}, acc, stage, b, r0, head0, head1, d_at, n_tiles, lane);
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // the results alias the stages: every thread is done reading them
  float* out = reinterpret_cast<float*>(smem);
  const int t = lane % 4;
#pragma unroll
  for (int j = 0; j < kNTiles; ++j) {
    if (j >= n_tiles) break;
    const int n = 8 * j + 2 * t;
    out[n * kV8LdC + r0] = acc[j][0];
    out[(n + 1) * kV8LdC + r0] = acc[j][1];
    out[n * kV8LdC + r0 + 8] = acc[j][2];
    out[(n + 1) * kV8LdC + r0 + 8] = acc[j][3];
  }
  __syncthreads();
  return out;
}

}  // namespace kiln::cuda::detail
