// MoE for a few tokens: indexed expert matvecs (see moe.h).
//
// Quantized weights, int8 activations (four launches):
//   1. x -> int8 blocks of 32 (one launch for all tokens);
//   2. gate/up: a warp owns output row r of pair p and walks gate row r and up row r of
//      expert ids[p] together (they share the activation loads), then applies the GLU;
//   3. h -> int8 blocks of 32 (or, with MoeFfnArgs::h_tickets, inside launch 2: the last
//      block to write a group of 32 values quantizes it);
//   4. down: a warp owns output row(s) r of token t and walks row r of each of its k
//      experts in slot order, each slot's partial sums scaled by its routing weight: the
//      sum over slots happens in registers, in a fixed order (deterministic, no atomics).
//      Where a row's slices (of 32 columns) are not a multiple of 32, the k rows are walked
//      as one flattened sequence of slices so that no lane idles (moe_flat_segments.cuh).
// Weight rows go through shared memory as in matvec.cu (aligned 16-byte asynchronous
// copies, a few chunks ahead; GGUF blocks are only byte-aligned), here with the chunks of
// all of a warp's segments (pair rows) in one pipeline, so short rows (768 columns) still
// keep several copies in flight. q4_K gate / up rows, whose fields keep 16-byte alignment,
// are read straight from global memory instead (the direct kernel: fewer instructions).
// Experts in the row-tile layout (expert_tiles.h, ExpertMatrix::row_tiles) take the kernels of
// moe_tiled_decode.cu for launches 2 and 4 instead.
//
// The four launches are chained (launch.cuh): each quantize kernel waits for the kernel
// before it and only then lets the next one start, so the matvec after it may read the expert
// ids (written by the routing, two kernels back) and issue its first weight copies before its
// own wait; the activations it reads only after. Where gate / up quantizes h itself, down
// follows it directly and the ids are still two kernels back (routing, x -> int8, gate / up).
//
// Plain weights, and every type in exact mode: the same two launches with f32 activations,
// the weights decoded to f32 by the block formats' exact decode8 straight from global
// memory (slower; the exact mode is for checking, plain weights are for tests).
#include <string>
#include <type_traits>

#include "backend/cuda/env_switch.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/matvec.h"
#include "backend/cuda/matvec_grouped.h"
#include "backend/cuda/moe.h"
#include "backend/cuda/moe_flat_segments.cuh"
#include "backend/cuda/moe_kernels.cuh"
#include "backend/cuda/moe_tiled_decode.cuh"
#include "backend/cuda/occupancy.h"

namespace kiln::cuda {
namespace detail {

constexpr int kMoeWarps = 4;
constexpr int kMoeThreads = kMoeWarps * kWarpSize;
constexpr int kMoeStages = 4;

// ---- int8 activations --------------------------------------------------------------------

// Rows of n floats (n % 32 == 0) -> int8 blocks of 32 with (scale, scale * sum) per block,
// as matvec.h's Q8Vector: row i's values at qs + i * qs_pitch, its scales at ds + i * n / 32.
__global__ void moe_quantize_rows_kernel(const float* __restrict__ x, int64_t x_stride, int64_t n,
                                         int8_t* __restrict__ qs, int64_t qs_pitch, float2* __restrict__ ds) {
  // Waits before it lets the next kernel start: the matvec after it reads expert ids (two
  // kernels back) before its own wait.
  begin_chained_kernel();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t row = blockIdx.y;
  if (i >= n) return;  // whole warps leave together
  quantize_block32(x[row * x_stride + i], &qs[row * qs_pitch + i], &ds[row * (n / 32) + i / 32]);
}

// ---- the pipelined dot product over segments ----------------------------------------------

template <typename Fmt>
struct ChunkShape {
  static constexpr int kSlicesPerBlock = Fmt::kElems / 32;
  static constexpr int kBlocksPerChunk = kWarpSize / kSlicesPerBlock;
  static constexpr int kChunkBytes = kBlocksPerChunk * Fmt::kBytes;
  // Up to 15 bytes of misalignment ahead, the last piece's tail, the word load_words reads past.
  static constexpr int kStageBytes = (kChunkBytes + 46) / 16 * 16;
};

// A warp's dot products of kRows weight rows with int8 activations, over n_segs segments
// (each a row of n_slices * 32 columns with its own activations and factor):
//   acc[r] += sum_s factor(s) * (row(s, r) . x(s))   (per-lane partial sums)
// `stage` is this warp's [kStages][kRows][kStageBytes] shared buffer.
//
// `ready()` runs once the first chunks' copies are issued and before any activation is read:
// a chained kernel waits there for the kernel before it (the expert ids it reads for the
// weight addresses were written two kernels back; see moe_ffn_matvec).
template <typename Fmt, int kRows, int kStages = kMoeStages, bool kOneSegment = false, typename Segments,
          typename Ready>
__device__ __forceinline__ void segments_dot_q8(const Segments& segs, int n_segs, int64_t n_slices, uint8_t* stage,
                                                float (&acc)[kRows], Ready&& ready) {
  using S = ChunkShape<Fmt>;
  // kOneSegment (n_segs == 1, gate / up): chunk k is chunk k of the one segment, found with no
  // division (dividing the 64-bit chunk index was a good part of the gate / up loop's
  // instructions).
  const int lane = threadIdx.x % kWarpSize;
  const int64_t n_blocks = n_slices / S::kSlicesPerBlock;
  const int64_t per_seg = (n_slices + kWarpSize - 1) / kWarpSize;
  const int64_t total = n_segs * per_seg;
  auto stage_of = [&](int64_t k, int r) { return stage + (int(k % kStages) * kRows + r) * S::kStageBytes; };
  auto seg_of = [&](int64_t k) { return kOneSegment ? 0 : int(k / per_seg); };
  auto chunk_of = [&](int64_t k) { return kOneSegment ? k : k % per_seg; };

  auto issue = [&](int64_t k) {
    if (k < total) {
      const int seg = seg_of(k);
      const int64_t first_block = chunk_of(k) * S::kBlocksPerChunk;
      const int chunk_bytes = int(min64(S::kBlocksPerChunk, n_blocks - first_block)) * Fmt::kBytes;
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const uintptr_t addr = reinterpret_cast<uintptr_t>(segs.row(seg, r) + first_block * Fmt::kBytes);
        const uint8_t* aligned = reinterpret_cast<const uint8_t*>(addr & ~uintptr_t(15));
        const int n_pieces = (int(addr & 15) + chunk_bytes + 15) / 16;
        uint8_t* dst = stage_of(k, r);
        for (int p = lane; p < n_pieces; p += kWarpSize) cp_async_16(dst + 16 * p, aligned + 16 * p);
      }
    }
    cp_async_commit();
  };

#pragma unroll
  for (int k = 0; k < kStages - 1; ++k) issue(k);
  ready();
  for (int64_t k = 0; k < total; ++k) {
    issue(k + kStages - 1);
    const int seg = seg_of(k);
    const int64_t chunk = chunk_of(k);
    const int64_t slice = chunk * kWarpSize + lane;
    const bool active = slice < n_slices;
    int x[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    float2 ds = make_float2(0.0f, 0.0f);
    if (active) {
      const int4* xv = reinterpret_cast<const int4*>(segs.xqs(seg) + 32 * slice);
      // Written by the kernel before, read after ready()'s wait (as matvec.cu does).
      const int4 a = __ldg(xv), b = __ldg(xv + 1);
      x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
      ds = __ldg(segs.xds(seg) + slice);
    }
    cp_async_wait<kStages - 1>();  // chunk k has landed (this lane's copies)
    __syncwarp();                  // ... and every lane's
    if (active) {
      const float factor = segs.factor(seg);
      const int64_t first_block = chunk * S::kBlocksPerChunk;
      const int block_in_chunk = lane / S::kSlicesPerBlock, sub = lane % S::kSlicesPerBlock;
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const int head = int(reinterpret_cast<uintptr_t>(segs.row(seg, r) + first_block * Fmt::kBytes) & 15);
        const uint8_t* st = stage_of(k, r);
        const int off = head + block_in_chunk * Fmt::kBytes;
        float d;
        if (Fmt::kMaxAlign >= 16 && head == 0)
          d = Fmt::template dot_q8<Fmt::kMaxAlign >= 16 ? 16 : 1>(st, off, sub, x, ds);
        else if (Fmt::kMaxAlign >= 4 && (head & 3) == 0)
          d = Fmt::template dot_q8<Fmt::kMaxAlign >= 4 ? 4 : 1>(st, off, sub, x, ds);
        else
          d = Fmt::template dot_q8<1>(st, off, sub, x, ds);
        acc[r] = fmaf(factor, d, acc[r]);
      }
    }
    __syncwarp();  // the stage is refilled next iteration
  }
  cp_async_wait<0>();
}

__device__ __forceinline__ const uint8_t* expert_row(const ExpertMatrix& m, int expert, int64_t row) {
  return static_cast<const uint8_t*>(m.data) + int64_t(expert < 0 ? 0 : expert) * m.expert_bytes + row * m.row_bytes;
}

// The gate / up blocks that write one group of 32 values of h (kMoeWarps rows a block).
constexpr int kBlocksPerHGroup = 32 / kMoeWarps;

// After a gate / up block has written its values of h (pair p, block `block` of the row):
// counts the block in its group's ticket, and the group's last block quantizes the group's 32
// values into hq and sets the ticket back to zero for the next launch. Every thread of the
// block calls it; the writers of h have fenced their stores.
__device__ __forceinline__ void quantize_h_group_if_last(const MoeFfnArgs& a, const float* h, const Q8Rows& hq,
                                                         int64_t p, int64_t block) {
  __shared__ bool last;
  const int64_t group = block / kBlocksPerHGroup;
  unsigned* ticket = a.h_tickets + p * (a.n_ff / 32) + group;
  __syncthreads();  // the block's values are written and fenced
  if (threadIdx.x == 0) {
    last = atomicAdd(ticket, 1u) == kBlocksPerHGroup - 1;
    if (last) __threadfence();  // the other blocks' values, counted before, are read after
  }
  __syncthreads();
  if (!last || threadIdx.x >= kWarpSize) return;
  const int64_t i = group * 32 + threadIdx.x;
  const float v = __ldcg(h + p * a.n_ff + i);  // from L2: other multiprocessors wrote it
  quantize_block32(v, const_cast<int8_t*>(hq.qs) + p * hq.pitch + i,
                   const_cast<float2*>(hq.ds) + p * hq.ds_pitch + group);
  if (threadIdx.x == 0) *ticket = 0u;
}

// ---- gate / up + GLU ---------------------------------------------------------------------

// After a warp's dot products of gate row r and up row r of pair p (per-lane sums in acc): h[p][r]
// from the GLU (NaN for an expert id out of range), and with h_tickets its group's int8 copy.
__device__ __forceinline__ void finish_gate_up(const MoeFfnArgs& a, float* h, const Q8Rows& hq, int p, int64_t r,
                                               int e, const float (&acc)[2]) {
  const float g = warp_sum(acc[0]), u = warp_sum(acc[1]);
  if (threadIdx.x % kWarpSize == 0) {
    h[p * a.n_ff + r] = e < 0 ? moe_nan()
                              : glu_of(a.act, g + bias_at(a.gate, e, r), u + bias_at(a.up, e, r), a.alpha, a.limit);
    if (a.h_tickets) __threadfence();  // visible to the group's last block before this block's ticket
  }
  if (a.h_tickets) quantize_h_group_if_last(a, h, hq, p, blockIdx.x);
}

struct GateUpSegments {
  const uint8_t* gate_row;
  const uint8_t* up_row;
  const int8_t* qs;
  const float2* ds;
  __device__ const uint8_t* row(int, int r) const { return r == 0 ? gate_row : up_row; }
  __device__ const int8_t* xqs(int) const { return qs; }
  __device__ const float2* xds(int) const { return ds; }
  __device__ float factor(int) const { return 1.0f; }
};

// The one-wave gate / up launch (MoeFfnArgs::gate_up_launch): blocks a multiprocessor it aims
// at (12: at most 40 registers a thread; 10 for q3_K and q5_K, whose dots would spill at 40),
// and the copy stages that let that many fit its shared memory (228 KB, 1 KB of it reserved a
// block): 3 for q4_K (rows of 2048 columns are 2 chunks, both then in flight before the wait,
// as with 4 stages), 2 for q6_K and q8_0.
template <typename Fmt>
constexpr int gate_up_one_wave_blocks() {
  return std::is_same_v<Fmt, Format<GgmlType::Q3_K>> || std::is_same_v<Fmt, Format<GgmlType::Q5_K>> ? 10 : 12;
}
template <typename Fmt>
constexpr int gate_up_one_wave_stages() {
  constexpr int kBudget = int(shared_bytes_for_blocks(gate_up_one_wave_blocks<Fmt>()));  // bytes of stages a block
  constexpr int kFit = kBudget / (kMoeWarps * 2 * ChunkShape<Fmt>::kStageBytes);
  return kFit >= 3 ? 3 : 2;
}

// Grid (ceil(n_ff / kMoeWarps), pairs); warp w of block x owns row x * kMoeWarps + w.
// kOneWave: the registers and copy stages of gate_up_one_wave_blocks / _stages, so that
// Qwen3-30B-A3B's 1,536 blocks (8 slots x 768 rows / 4) are resident at once; else 4 stages
// and the registers the compiler takes (q4_K: 48, 10 blocks a multiprocessor: 1,320 blocks,
// then 216 in a second wave). With a.h_tickets (n_ff % 32 == 0: no warp leaves early) h's
// int8 copy goes to hq too.
template <typename Fmt, bool kOneWave>
__global__ void __launch_bounds__(kMoeThreads, kOneWave ? gate_up_one_wave_blocks<Fmt>() : 0)
    moe_gate_up_q8_kernel(MoeFfnArgs a, Q8Rows xq, float* h, Q8Rows hq) {
  using S = ChunkShape<Fmt>;
  constexpr int kStages = kOneWave ? gate_up_one_wave_stages<Fmt>() : kMoeStages;
  __shared__ __align__(16) uint8_t stage[kMoeWarps][kStages * 2 * S::kStageBytes];
  const int warp = threadIdx.x / kWarpSize;
  const int64_t r = int64_t(blockIdx.x) * kMoeWarps + warp;
  const int p = blockIdx.y, t = p / int(a.n_used), j = p - t * int(a.n_used);  // pairs < 65536
  if (r >= a.n_ff) return;  // no block-wide barriers below
  // The ids come from two kernels back (read before the wait, with the first weights'
  // requests), or from the kernel before where that one made x's int8 copy (MoeFfnArgs::x_q8).
  const bool ids_now = a.x_q8 == nullptr;
  if (!ids_now) begin_chained_kernel();
  const int e = expert_of(a, t, j);
  GateUpSegments segs{expert_row(a.gate, e, r), expert_row(a.up, e, r), xq.qs + t * xq.pitch, xq.ds + t * xq.ds_pitch};
  float acc[2] = {0.0f, 0.0f};
  segments_dot_q8<Fmt, 2, kStages, true>(segs, 1, a.n_embd / 32, stage[warp], acc, [ids_now] {
    if (ids_now) begin_chained_kernel();
  });
  finish_gate_up(a, h, hq, p, r, e, acc);
}

// The direct gate / up launch (MoeFfnArgs::gate_up_launch): the one-wave kernel's grid and
// registers, but each lane reads its slices' block fields straight from global memory into
// registers (q4_K, whose fields keep 16-byte alignment, in rows that start at a multiple of 16
// bytes; q5_K's dot would spill at the one wave's registers). No shared-memory staging, so none
// of its copy issue, waits and bookkeeping: those were most of the staged kernel's
// instructions. Lane l takes slices l, l + 32, ... with the same dot and the same sum as the
// staged kernel: the same bits.
template <typename Fmt>
__global__ void __launch_bounds__(kMoeThreads, gate_up_one_wave_blocks<Fmt>())
    moe_gate_up_direct_kernel(MoeFfnArgs a, Q8Rows xq, float* h, Q8Rows hq) {
  constexpr int kSlicesPerBlock = Fmt::kElems / 32;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int64_t r = int64_t(blockIdx.x) * kMoeWarps + warp;
  const int p = blockIdx.y, t = p / int(a.n_used), j = p - t * int(a.n_used);  // pairs < 65536
  if (r >= a.n_ff) return;  // no block-wide barriers below
  begin_chained_kernel();  // the ids and x's int8 copy, from the kernels before
  const int e = expert_of(a, t, j);
  const uint8_t* gate = expert_row(a.gate, e, r);
  const uint8_t* up = expert_row(a.up, e, r);
  const int8_t* xqs = xq.qs + t * xq.pitch;
  const float2* xds = xq.ds + t * xq.ds_pitch;
  const int n_slices = int(a.n_embd / 32);
  float acc[2] = {0.0f, 0.0f};
  for (int slice = lane; slice < n_slices; slice += kWarpSize) {
    const int4* xv = reinterpret_cast<const int4*>(xqs + 32 * slice);
    const int4 lo = __ldg(xv), hi = __ldg(xv + 1);
    const int x[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    const float2 ds = __ldg(xds + slice);
    const int off = (slice / kSlicesPerBlock) * Fmt::kBytes, sub = slice % kSlicesPerBlock;
    acc[0] = fmaf(1.0f, Fmt::template dot_q8<16>(gate, off, sub, x, ds), acc[0]);
    acc[1] = fmaf(1.0f, Fmt::template dot_q8<16>(up, off, sub, x, ds), acc[1]);
  }
  finish_gate_up(a, h, hq, p, r, e, acc);
}

// ---- down, weighted and summed over the slots ------------------------------------------------

// The int8 down kernel looks up a warp's slots once, a slot a lane, into shared memory: the
// rows' addresses (the expert ids read and the offsets worked out for every chunk were most of
// the copy issue's instructions) and the routing weights. So it takes at most a warp's lanes
// of slots; more go to the f32 down kernel (no model has more than 10).
constexpr int kMaxInt8DownSlots = kWarpSize;

template <int kRows>
struct DownSegments {
  const MoeFfnArgs* a;
  int64_t t, row0;
  Q8Rows hq;
  // Slot j's rows at rows[j * kRows + r] and its routing weight at factors[j] (shared memory).
  const uint8_t* const* rows;
  const float* factors;
  __device__ const uint8_t* lookup_row(int j, int r) const {
    return expert_row(a->down, expert_of(*a, t, j), min64(row0 + r, a->n_embd - 1));
  }
  __device__ const uint8_t* row(int j, int r) const { return rows[j * kRows + r]; }
  __device__ const int8_t* xqs(int j) const { return hq.qs + (t * a->n_used + j) * hq.pitch; }
  __device__ const float2* xds(int j) const { return hq.ds + (t * a->n_used + j) * hq.ds_pitch; }
  __device__ float factor(int j) const { return factors[j]; }
};

// The residual's old value for lane r's row r0 + r (r < kRows), read right after the wait so that
// the load overlaps the products (finish_down adds to it); 0 on other lanes or without one.
template <int kRows>
__device__ __forceinline__ float residual_old(const MoeFfnArgs& a, int64_t t, int64_t row0) {
  const int lane = threadIdx.x % kWarpSize;
  return a.residual && lane < kRows && row0 + lane < a.n_embd ? a.residual[t * a.residual_stride + row0 + lane] : 0.0f;
}

// Writes out[t][row0 + r] for the warp's rows: the slots' weighted biases added, NaN when a
// slot's id is out of range; adds the same to the residual when there is one (its old value
// `old`, from residual_old).
template <int kRows>
__device__ __forceinline__ void finish_down(const MoeFfnArgs& a, int64_t t, int64_t row0, float (&acc)[kRows],
                                            float old) {
  const int lane = threadIdx.x % kWarpSize;
#pragma unroll
  for (int r = 0; r < kRows; ++r) acc[r] = warp_sum(acc[r]);
  if (lane >= kRows || row0 + lane >= a.n_embd) return;
  float sum = acc[0];
#pragma unroll
  for (int r = 1; r < kRows; ++r)
    if (lane == r) sum = acc[r];
  store_down_row(a, t, row0 + lane, sum, old);
}

// Grid (ceil(n_embd / (kMoeWarps * kRows)), tokens). kFlat: the slots' rows walked as one
// flattened sequence of slices (moe_flat_segments.cuh), else each in chunks of its own.
template <typename Fmt, int kRows, bool kFlat>
__global__ void __launch_bounds__(kMoeThreads) moe_down_q8_kernel(MoeFfnArgs a, Q8Rows hq) {
  constexpr int kStageBytes = kFlat ? FlatChunkShape<Fmt>::kStageBytes : ChunkShape<Fmt>::kStageBytes;
  __shared__ __align__(16) uint8_t stage[kMoeWarps][kMoeStages * kRows * kStageBytes];
  const int warp = threadIdx.x / kWarpSize;
  const int64_t row0 = (int64_t(blockIdx.x) * kMoeWarps + warp) * kRows;
  const int64_t t = blockIdx.y;
  __shared__ const uint8_t* slot_rows[kMoeWarps][kMaxInt8DownSlots * kRows];
  __shared__ float slot_factors[kMoeWarps][kMaxInt8DownSlots];
  const int lane = threadIdx.x % kWarpSize;
  if (row0 >= a.n_embd) return;
  DownSegments<kRows> segs{&a, t, row0, hq, slot_rows[warp], slot_factors[warp]};
  // The ids, from two kernels back, are read before the wait (see moe_ffn_matvec); the
  // routing weights in ready(), after it, as every activation.
  if (lane < a.n_used)
#pragma unroll
    for (int r = 0; r < kRows; ++r) slot_rows[warp][lane * kRows + r] = segs.lookup_row(lane, r);
  __syncwarp();
  float acc[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) acc[r] = 0.0f;
  float old = 0.0f;
  auto ready = [&] {
    begin_chained_kernel();
    old = residual_old<kRows>(a, t, row0);
    if (lane < a.n_used) slot_factors[warp][lane] = a.weights[t * a.weights_stride + lane];
    __syncwarp();
  };
  if constexpr (kFlat)
    segments_dot_q8_flat<Fmt, kRows, kMoeStages>(segs, int(a.n_used), int(a.n_ff / Fmt::kElems), stage[warp], acc,
                                                  ready);
  else
    segments_dot_q8<Fmt, kRows>(segs, int(a.n_used), a.n_ff / 32, stage[warp], acc, ready);
  finish_down<kRows>(a, t, row0, acc, old);
}

// ---- f32 activations (plain weights; exact mode) ------------------------------------------

// This lane's partial sum of row . x over `cols` columns (x in f32).
template <typename W>
__device__ __forceinline__ float row_dot_f32(const uint8_t* row, const float* x, int64_t cols) {
  const int lane = threadIdx.x % kWarpSize;
  float acc = 0.0f;
  if constexpr (IsPlain<W>::value) {
    for (int64_t i = lane; i < cols; i += kWarpSize) acc = fmaf(W::load1(row, i), x[i], acc);
  } else {
    for (int64_t k0 = 8 * int64_t(lane); k0 < cols; k0 += 8 * kWarpSize) {
      float v[8];
      load8_weights<W>(row, k0, v);
#pragma unroll
      for (int i = 0; i < 8; ++i) acc = fmaf(v[i], x[k0 + i], acc);
    }
  }
  return acc;
}

template <typename W>
__global__ void __launch_bounds__(kMoeThreads) moe_gate_up_f32_kernel(MoeFfnArgs a, float* h) {
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int64_t r = int64_t(blockIdx.x) * kMoeWarps + warp;
  const int64_t p = blockIdx.y, t = p / a.n_used, j = p % a.n_used;
  if (r >= a.n_ff) return;
  const int e = expert_of(a, t, j);
  const float* x = a.x + t * a.x_stride;
  const float g = warp_sum(row_dot_f32<W>(expert_row(a.gate, e, r), x, a.n_embd));
  const float u = warp_sum(row_dot_f32<W>(expert_row(a.up, e, r), x, a.n_embd));
  if (lane == 0)
    h[p * a.n_ff + r] = e < 0 ? moe_nan()
                              : glu_of(a.act, g + bias_at(a.gate, e, r), u + bias_at(a.up, e, r), a.alpha, a.limit);
}

template <typename W>
__global__ void __launch_bounds__(kMoeThreads) moe_down_f32_kernel(MoeFfnArgs a, const float* h) {
  const int warp = threadIdx.x / kWarpSize;
  const int64_t row = int64_t(blockIdx.x) * kMoeWarps + warp;
  const int64_t t = blockIdx.y;
  if (row >= a.n_embd) return;
  float acc[1] = {0.0f};
  const float old = residual_old<1>(a, t, row);  // an ordinary launch: everything before has finished
  for (int64_t j = 0; j < a.n_used; ++j) {
    const int e = expert_of(a, t, j);
    const float d = row_dot_f32<W>(expert_row(a.down, e, row), h + (t * a.n_used + j) * a.n_ff, a.n_ff);
    acc[0] = fmaf(a.weights[t * a.weights_stride + j], d, acc[0]);
  }
  finish_down<1>(a, t, row, acc, old);
}

// ---- host side -------------------------------------------------------------------------------

constexpr size_t kAlignBytes = 256;
size_t align_up(size_t v) { return (v + kAlignBytes - 1) / kAlignBytes * kAlignBytes; }
int64_t q8_pitch(int64_t n) { return (n + 15) / 16 * 16; }

// The scratch regions, in order: x int8 (+ scales), h f32, h int8 (+ scales).
struct MatvecScratch {
  size_t xq = 0, xd = 0, h = 0, hq = 0, hd = 0, total = 0;
};

MatvecScratch plan_scratch(const MoeFfnArgs& a, bool q8_gate_up, bool q8_down) {
  MatvecScratch s;
  const int64_t P = a.n_tokens * a.n_used;
  size_t at = 0;
  auto take = [&](size_t bytes) {
    const size_t start = at;
    at += align_up(bytes);
    return start;
  };
  if (q8_gate_up) {
    s.xq = take(size_t(a.n_tokens * q8_pitch(a.n_embd)));
    s.xd = take(size_t(a.n_tokens * (a.n_embd / 32)) * sizeof(float2));
  }
  s.h = take(size_t(P * a.n_ff) * sizeof(float));
  if (q8_down) {
    s.hq = take(size_t(P * q8_pitch(a.n_ff)));
    s.hd = take(size_t(P * (a.n_ff / 32)) * sizeof(float2));
  }
  s.total = at;
  return s;
}

Status chained_status(cudaError_t e, const char* kernel) {
  return e != cudaSuccess ? Status::from_cuda(e, kernel) : launch_status(kernel);
}

Status quantize_rows(const float* x, int64_t stride, int64_t n, int64_t rows, int8_t* qs, float2* ds,
                     cudaStream_t stream) {
  constexpr int kThreads = 256;
  const dim3 grid(unsigned((n + kThreads - 1) / kThreads), unsigned(rows));
  if (cudaError_t e = launch_chained(moe_quantize_rows_kernel, grid, dim3(kThreads), 0, stream, x, stride, n, qs,
                                     q8_pitch(n), ds);
      e != cudaSuccess)
    return Status::from_cuda(e, "moe_quantize_rows_kernel");
  return launch_status("moe_quantize_rows_kernel");
}

// Whether the gate / up launch takes its one-wave kernel (MoeFfnArgs::gate_up_launch; by
// default yes, unless the environment says KILN_CUDA_MOE_GATE_UP_ONE_WAVE=0, read once).
bool gate_up_one_wave(const MoeFfnArgs& a) {
  static const bool refused = env_is("KILN_CUDA_MOE_GATE_UP_ONE_WAVE", "0");
  return a.gate_up_launch == MoeGateUpLaunch::OneWave || (a.gate_up_launch == MoeGateUpLaunch::Default && !refused);
}

// Whether down runs with int8 activations: quantized weights, not exact, and at most
// kMaxInt8DownSlots slots (the f32 down kernel takes any number) unless the weights are in the
// row-tile layout (its kernel takes any number too).
bool int8_down(const MoeFfnArgs& a, bool exact) {
  return !exact && !is_plain_type(a.down.type) && (a.down.row_tiles || a.n_used <= kMaxInt8DownSlots);
}

// Whether the gate / up launch takes its direct kernel where the weights are q4_K
// (MoeFfnArgs::gate_up_launch; by default yes, unless the environment says
// KILN_CUDA_MOE_GATE_UP_DIRECT=0, read once): gate and up must start every row at a multiple of
// 16 bytes.
bool gate_up_direct(const MoeFfnArgs& a) {
  static const bool refused = env_is("KILN_CUDA_MOE_GATE_UP_DIRECT", "0");
  const bool wanted =
      a.gate_up_launch == MoeGateUpLaunch::Direct || (a.gate_up_launch == MoeGateUpLaunch::Default && !refused);
  auto rows_aligned = [](const ExpertMatrix& m) {
    return aligned16(m.data) && m.row_bytes % 16 == 0 && m.expert_bytes % 16 == 0;
  };
  return wanted && rows_aligned(a.gate) && rows_aligned(a.up);
}

// Whether the down launch caps its blocks a multiprocessor (spread_padding). Down follows
// gate / up directly where gate / up quantizes h (MoeFfnArgs::h_tickets), so its blocks are
// placed while gate / up still runs, on the multiprocessors gate / up leaves first: at one
// token Qwen3-30B-A3B's 512 down blocks (up to 10 of them fit a multiprocessor for q6_K, 12
// for q4_K) can pile onto some while others hold none. Capped at ceil(blocks /
// multiprocessors) where the kernel would otherwise fit at least twice that many (q4_K,
// q6_K: -41 us a step against h quantized apart); left as it is below that (q8_0's 6 a
// multiprocessor: capping at 4 cost 200 us a step).
// KILN_CUDA_MOE_DOWN_SPREAD=0: never cap; 1: always (read once).
enum class DownSpread { Auto, Never, Always };
DownSpread down_spread() {
  static const DownSpread mode = env_is("KILN_CUDA_MOE_DOWN_SPREAD", "0")   ? DownSpread::Never
                                 : env_is("KILN_CUDA_MOE_DOWN_SPREAD", "1") ? DownSpread::Always
                                                                            : DownSpread::Auto;
  return mode;
}

// Two rows a warp fit the flattened kernel's static shared memory (48 KB a block)? Not for
// the 32-element formats, whose per-block slots more than double the stage.
template <typename Fmt>
constexpr bool kFlatTwoRowsFit = kMoeWarps * kMoeStages * 2 * FlatChunkShape<Fmt>::kStageBytes <= 48 * 1024;

// Whether the down product walks its slots' rows flattened (MoeFfnArgs::down_walk).
bool flat_down_walk(const MoeFfnArgs& a, int64_t block_elems) {
  static const bool allowed = !env_is("KILN_CUDA_MOE_FLAT_SEGMENTS", "0");
  const int64_t n_slices = a.n_ff / 32;
  if (a.down_walk == MoeDownWalk::PerSegment || !moe_flat_walk_fits(a.n_used, a.n_ff / block_elems)) return false;
  if (a.down_walk == MoeDownWalk::Flat) return true;
  const int64_t per_segment_chunks = a.n_used * ((n_slices + kWarpSize - 1) / kWarpSize);
  const int64_t flat_chunks = (a.n_used * n_slices + kWarpSize - 1) / kWarpSize;
  return allowed && n_slices % kWarpSize != 0 && flat_chunks < per_segment_chunks;
}

// The down kernel with either walk, two rows a warp where asked and where its stage fits;
// `after_gate_up`: it follows the gate / up launch directly (see down_spread).
template <typename Fmt, bool kFlat>
Status launch_down(const MoeFfnArgs& a, const Q8Rows& hq, bool two_rows, bool after_gate_up, cudaStream_t stream) {
  constexpr bool kTwoRowsFit = !kFlat || kFlatTwoRowsFit<Fmt>;
  const int rows_per_warp = kTwoRowsFit && two_rows ? 2 : 1;
  const int rows_per_block = kMoeWarps * rows_per_warp;
  const dim3 grid(unsigned((a.n_embd + rows_per_block - 1) / rows_per_block), unsigned(a.n_tokens));
  const auto kernel = rows_per_warp == 2 ? moe_down_q8_kernel<Fmt, kTwoRowsFit ? 2 : 1, kFlat>
                                         : moe_down_q8_kernel<Fmt, 1, kFlat>;
  const int blocks = int(grid.x * grid.y), sms = multiprocessor_count();
  const DownSpread spread = down_spread();
  const int want = sms > 0 ? (blocks + sms - 1) / sms : 0;
  const bool cap = want > 0 && (spread == DownSpread::Always || (spread == DownSpread::Auto && after_gate_up));
  const int at_least = spread == DownSpread::Always ? 0 : 2 * want;
  const size_t padding = cap ? spread_padding(reinterpret_cast<const void*>(kernel), kMoeThreads, want, at_least) : 0;
  const cudaError_t e = launch_chained(kernel, grid, dim3(kMoeThreads), padding, stream, a, hq);
  return chained_status(e, kFlat ? "moe_down_q8_kernel (flattened)" : "moe_down_q8_kernel");
}

}  // namespace detail

bool moe_supports(GgmlType gate_up, GgmlType down) {
  auto known = [](GgmlType t) { return detail::visit_moe_format(t, [](auto) {}); };
  return known(gate_up) && known(down);
}

int64_t moe_h_ticket_count(const MoeFfnArgs& a) { return a.n_tokens * a.n_used * (a.n_ff / 32); }

size_t moe_matvec_scratch_bytes(const MoeFfnArgs& a, bool exact) {
  const bool q8_gate_up = !exact && !detail::is_plain_type(a.gate.type);
  const bool q8_down = detail::int8_down(a, exact);
  return detail::plan_scratch(a, q8_gate_up, q8_down).total;
}

Status moe_ffn_matvec(const MoeFfnArgs& a, bool exact, void* scratch, size_t scratch_bytes, cudaStream_t stream) {
  using namespace detail;
  if (!moe_supports(a.gate.type, a.down.type) || a.gate.type != a.up.type)
    return Status::invalid("moe_ffn: expert types gate " + std::string(type_name(a.gate.type)) + ", up " +
                           std::string(type_name(a.up.type)) + ", down " + std::string(type_name(a.down.type)) +
                           " are not supported (gate and up must share a type; types: f32 f16 bf16 " +
                           kQuantFormatNames + ")");
  if (a.n_tokens <= 0 || a.n_used <= 0 || a.n_tokens * a.n_used > 65535 || a.n_embd <= 0 || a.n_ff <= 0)
    return Status::invalid("moe_ffn: " + std::to_string(a.n_tokens) + " tokens x " + std::to_string(a.n_used) +
                           " slots is outside 1..65535 pairs for the indexed matvecs");
  if (a.gate.row_tiles != a.up.row_tiles)
    return Status::invalid("moe_ffn: gate and up experts must both be in the row-tile layout or neither");
  if ((a.gate.row_tiles || a.down.row_tiles) && exact)
    return Status::invalid("moe_ffn: experts in the row-tile layout have no exact path (an exact backend keeps "
                           "the block layout)");
  const bool q8_gate_up = !exact && !is_plain_type(a.gate.type);
  const bool q8_down = int8_down(a, exact);
  if (a.x_q8 && !q8_rows_fit(a.x_q8, a.x_q8_row_bytes, a.n_embd))
    return Status::invalid("moe_ffn: x's int8 copy needs 16-byte aligned rows of " + std::to_string(a.n_embd) +
                           " values (a multiple of 32) and their scales, got rows of " +
                           std::to_string(a.x_q8_row_bytes) + " bytes");
  if (a.front.sums && (exact || !detail::folded_front_fits(a)))
    return Status::invalid("moe_ffn: the folded front takes one token, experts in the row-tile layout, a width of "
                           "whole groups of 256 up to 4096, at most " + std::to_string(kRouterSumsMaxExperts) +
                           " experts, no router or selection bias, aligned x and norm weights, and the route's ids "
                           "and weights those of the FFN");
  const MatvecScratch s = plan_scratch(a, q8_gate_up, q8_down);
  if (!scratch || scratch_bytes < s.total || reinterpret_cast<uintptr_t>(scratch) % kAlignBytes != 0)
    return Status::invalid("moe_ffn: needs " + std::to_string(s.total) + " bytes of 256-byte aligned scratch, got " +
                           std::to_string(scratch_bytes));
  auto* base = static_cast<uint8_t*>(scratch);
  float* h = reinterpret_cast<float*>(base + s.h);
  const int64_t P = a.n_tokens * a.n_used;
  Status status;
  // h's int8 copy made by the gate / up kernel (MoeFfnArgs::h_tickets; the tiled kernel's
  // blocks of 32 rows make theirs without), or by a launch of its own.
  const bool h_in_gate_up = q8_gate_up && q8_down && (a.gate.row_tiles || (a.h_tickets && a.n_ff % 32 == 0));
  const Q8Rows hq = q8_down ? Q8Rows{reinterpret_cast<int8_t*>(base + s.hq), q8_pitch(a.n_ff),
                                     reinterpret_cast<float2*>(base + s.hd), a.n_ff / 32}
                            : Q8Rows{};

  // gate / up + GLU -> h
  const dim3 gate_up_grid(unsigned((a.n_ff + kMoeWarps - 1) / kMoeWarps), unsigned(P));
  if (q8_gate_up) {
    Q8Rows xq{reinterpret_cast<int8_t*>(base + s.xq), q8_pitch(a.n_embd), reinterpret_cast<float2*>(base + s.xd),
              a.n_embd / 32};
    if (a.x_q8)
      xq = Q8Rows{reinterpret_cast<const int8_t*>(a.x_q8), a.x_q8_row_bytes,
                  reinterpret_cast<const float2*>(a.x_q8 + (a.n_embd + 15) / 16 * 16), a.x_q8_row_bytes / 8};
    else if (a.front.sums)
      ;  // the folded front's gate / up quantizes x itself
    else if (Status st = quantize_rows(a.x, a.x_stride, a.n_embd, a.n_tokens, const_cast<int8_t*>(xq.qs),
                                       const_cast<float2*>(xq.ds), stream);
             !st.ok())
      return st;
    if (a.gate.row_tiles) {
      status = launch_tiled_gate_up(a, xq, h, h_in_gate_up ? hq : Q8Rows{}, stream);
    } else {
      visit_quant_format(a.gate.type, [&](auto fmt) {
        using Fmt = decltype(fmt);
        auto kernel = gate_up_one_wave(a) ? moe_gate_up_q8_kernel<Fmt, true> : moe_gate_up_q8_kernel<Fmt, false>;
        if constexpr (std::is_same_v<Fmt, Format<GgmlType::Q4_K>>)
          if (gate_up_direct(a)) kernel = moe_gate_up_direct_kernel<Fmt>;
        MoeFfnArgs ga = a;
        if (!h_in_gate_up) ga.h_tickets = nullptr;
        status = chained_status(launch_chained(kernel, gate_up_grid, dim3(kMoeThreads), 0, stream, ga, xq, h, hq),
                                "moe_gate_up_q8_kernel");
      });
    }
  } else {
    visit_moe_format(a.gate.type, [&](auto fmt) {
      moe_gate_up_f32_kernel<decltype(fmt)><<<gate_up_grid, kMoeThreads, 0, stream>>>(a, h);
      status = launch_status("moe_gate_up_f32_kernel");
    });
  }
  if (!status.ok()) return status;

  // down, weighted and summed over the slots -> out
  if (q8_down) {
    if (!h_in_gate_up)
      if (Status st = quantize_rows(h, a.n_ff, a.n_ff, P, const_cast<int8_t*>(hq.qs), const_cast<float2*>(hq.ds),
                                    stream);
          !st.ok())
        return st;
    if (a.down.row_tiles) return launch_tiled_down(a, hq, stream);
    // One row per warp gives more warps (more copies in flight) while the grid is small.
    const bool two_rows = a.n_tokens * a.n_embd >= 16384;
    visit_quant_format(a.down.type, [&](auto fmt) {
      using Fmt = decltype(fmt);
      status = flat_down_walk(a, Fmt::kElems) ? launch_down<Fmt, true>(a, hq, two_rows, h_in_gate_up, stream)
                                              : launch_down<Fmt, false>(a, hq, two_rows, h_in_gate_up, stream);
    });
  } else {
    const dim3 grid(unsigned((a.n_embd + kMoeWarps - 1) / kMoeWarps), unsigned(a.n_tokens));
    visit_moe_format(a.down.type, [&](auto fmt) {
      moe_down_f32_kernel<decltype(fmt)><<<grid, kMoeThreads, 0, stream>>>(a, h);
      status = launch_status("moe_down_f32_kernel");
    });
  }
  return status;
}

bool moe_folded_front_fits(const MoeFfnArgs& a) { return detail::folded_front_fits(a); }

}  // namespace kiln::cuda
