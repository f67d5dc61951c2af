// The int8 grouped matvec of gate and up over f32 x with the glu in its epilogue
// (PairEpilogueKind::Glu through matvec_f32_parts): besides both products it writes
// h = act(gate) * up and h's int8 copy, which the down product reads, so that no glu kernel
// runs between the two products.
//
// Why blocks own whole int8 blocks of h: the int8 copy's scale needs the largest |h| of 32
// consecutive values. A thread block takes the 32 pairs (gate row i, up row i) of one int8
// block: 8 warps x 4 tasks, a task being gate's row on lanes 0-15 and up's on lanes 16-31
// (both rows' 16 groups copied into one stage, in flight together). Each row's lane sums
// take the pair kernel's order (matvec_grouped_kernel.cuh, 16 lanes a row), so gate and up
// are the bits the plain launch gives. Lane 0 of a task leaves both in shared memory; after
// one block barrier one warp writes the 32 gates, ups and activations (glu_pair) and
// quantizes the activations as the glu kernel does (quantize_block_spread: the same amax,
// rounding and d * sum whatever the lanes), so the copy is the glu kernel's byte for byte.
//
// Grid: persistent, one block per resident slot at most, each looping over h-blocks b,
// b + grid, ... (Llama-3-8B: 448 h-blocks over 264 resident blocks for q4_0; see glu_rounds
// for where one block fits a multiprocessor). A second wave
// of fresh blocks would pay the prologue (the wait, x normalized and quantized into shared
// memory) again on the critical path; a looping block has its next h-block's first rows
// in flight across the barrier. The shared values are double-buffered by h-block, so one
// barrier per h-block suffices: the writer of round k reads buffer k % 2 before it reaches
// round k + 1's barrier, and nothing writes that buffer again before that barrier.
#include <algorithm>

#include "backend/cuda/env_switch.h"
#include "backend/cuda/matvec_grouped_kernel.cuh"
#include "backend/cuda/occupancy.h"

namespace kiln::cuda::detail {

constexpr int kGluBlockValues = 32;                                   // one int8 block of h
constexpr int kGluTasksPerWarp = kGluBlockValues / kGroupedWarps;     // 4
constexpr int kGluLanesPerRow = kWarpSize / 2;                        // 16: two rows a task

// The launch's view of gate (part 0) and up (part 1).
struct GluProducts {
  const uint8_t* w[2];
  const float* add[2];
  float* y[2];
  int64_t w_row_bytes;
  int rows;    // of each part, a multiple of 32
  int groups;  // of each row, at most 16
};

// Items ahead (the interleaved kernel's kAhead): a lane copies the group of item i + kAhead + 1
// into shared memory (a slot a warp per item, where the copy stages would be) as it finishes
// item i, and loads item i + 1 from its slot once item i's dot is done; so kAhead items a lane
// are on their way while a dot runs, against one (the next item, reloaded into the registers
// being read) without. Groups of 144 bytes only (q4_0, q4_K): two slots of a block's lanes are
// 74 KB, which still lets two blocks share a multiprocessor (q8_0's would take 139 KB; q6_K's d
// sits apart from its words).
constexpr int kGluItemsAhead = 2;  // the launch's kAhead where it takes items ahead
template <typename Fmt>
constexpr bool takes_items_ahead() {
  return std::is_same_v<Fmt, GroupQ4_0> || std::is_same_v<Fmt, GroupQ4_K>;
}
// A block's shared memory for one slot: every lane's group.
template <typename Fmt>
constexpr size_t slot_bytes() {
  return size_t(kGroupedWarps) * kWarpSize * layout_loads<Fmt>() * 16;
}
// Lane `lane`'s words of item i in slot i % kAhead of warp `warp`'s (from `slots` on), 16-byte
// words kWarpSize apart so that a warp's copies and loads of one word are contiguous.
template <typename Fmt, int kAhead>
__device__ __forceinline__ uint4* ahead_slot(uint8_t* slots, int warp, int lane, int i) {
  return reinterpret_cast<uint4*>(slots) + (size_t(warp) * kAhead + size_t(i % kAhead)) * layout_loads<Fmt>() * kWarpSize +
         lane;
}
// This lane's group in the layout (`from`; nothing where null) into its slot, by asynchronous
// copies (the caller commits).
template <typename Fmt>
__device__ __forceinline__ void copy_to_slot(const WordAddress& from, uint4* slot) {
  if (!from.first) return;
#pragma unroll
  for (int k = 0; k < layout_loads<Fmt>(); ++k) cp_async_16(slot + k * kWarpSize, from.first + k * from.step);
}

// kStages == 0: p.w are in the interleaved layout (decode_layout.h), each lane's group loaded
// straight into registers, no copy stages; kAhead > 0: with items ahead (above).
template <typename Fmt, int kStages, int kAhead = 0>
__global__ void __launch_bounds__(kGroupedThreads,
                                  kStages == 1 ? 3 : (kStages == 0 ? kInterleavedMinBlocks : kTwoStageMinBlocks))
    matvec_glu_kernel(GluProducts p, F32Input in, PairEpilogue ep) {
  constexpr int kG = group_bytes<Fmt>();
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ float gate_s[2][kGluBlockValues], up_s[2][kGluBlockValues];
  uint8_t* x_s = smem;                                     // [groups][kXGroupBytes]
  uint8_t* ds_s = x_s + size_t(p.groups) * kXGroupBytes;   // [groups][kDsGroupBytes]
  uint8_t* stages = ds_s + size_t(p.groups) * kDsGroupBytes;

  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int slot = lane / kGluLanesPerRow, li = lane % kGluLanesPerRow;  // slot 0 gate, 1 up
  uint8_t* my_stages = stages + size_t(warp) * kStages * kWarpSize * kG;
  const int h_blocks = p.rows / kGluBlockValues;
  const int my_blocks = int(blockIdx.x) < h_blocks ? (h_blocks - 1 - int(blockIdx.x)) / int(gridDim.x) + 1 : 0;
  const int items = my_blocks * kGluTasksPerWarp;  // the same for every warp of the block
  // Item i: round i / 4 (h-block blockIdx.x + round * grid), value (i % 4) * 8 + warp of it,
  // so that the 8 warps read 8 consecutive rows of each part at a time.
  auto h_block_of = [&](int i) { return int(blockIdx.x) + (i / kGluTasksPerWarp) * int(gridDim.x); };
  auto value_of = [&](int i) { return (i % kGluTasksPerWarp) * kGroupedWarps + warp; };

  // Copies item i's two rows into stage i % kStages; always commits a group.
  const int n_pieces = p.groups * kG / 16;  // per row: whole, see matvec_grouped_fits
  auto issue = [&](int i) {
    if (i < items) {
      const int64_t row = int64_t(h_block_of(i)) * kGluBlockValues + value_of(i);
      uint8_t* dst = my_stages + size_t(i & (kStages - 1)) * kWarpSize * kG;
#pragma unroll
      for (int s = 0; s < 2; ++s) {
        const uint8_t* src = p.w[s] + row * p.w_row_bytes;
        for (int q = lane; q < n_pieces; q += kWarpSize)
          cp_async_16(dst + s * kGluLanesPerRow * kG + 16 * q, src + 16 * q);
      }
    }
    cp_async_commit();
  };

  static_assert(kAhead == 0 || (kStages == 0 && takes_items_ahead<Fmt>()));

  // Interleaved mode: item i's group of this lane (its row of gate or up) into g. The lane's
  // matrix is picked by a select, not p.w[slot]: indexing the parameter by a value known only
  // at run time puts the whole struct in local memory, read back for every item.
  constexpr bool kInterleaved = kStages == 0;
  uint32_t g[kInterleaved ? group_words<Fmt>() : 1];
  const uint8_t* const my_w = slot == 0 ? p.w[0] : p.w[1];
  auto item_address = [&](int i) {
    WordAddress a;
    if constexpr (kInterleaved) {
      if (i >= items || li >= p.groups) return a;
      const int64_t row = int64_t(h_block_of(i)) * kGluBlockValues + value_of(i);
      a = interleaved_group<Fmt>(my_w, row, li, p.groups);
    }
    return a;
  };

  // As matvec_grouped_kernel over f32 x: this warp's first rows and the norm weights before
  // the wait, then x normalized and quantized into shared memory by the whole block.
  if constexpr (kInterleaved)
    load_words<Fmt>(g, item_address(0));
  else
    issue(0);
  float4 norm_w[kPairF32Steps];
  load_norm_weights<kPairF32Steps>(in, p.groups * kGroupElems, norm_w);
  wait_for_previous_kernels();
  allow_next_kernel();
  trace_stamp(0);  // trace builds (block_trace.cuh)
  // Items 1..kAhead into their slots, one commit group each (as every later copy), on their way
  // while x is prepared. (No lambdas for these: merely defined, they made the one-stage
  // instances spill.)
  if constexpr (kAhead > 0) {
    for (int i = 1; i <= kAhead; ++i) {
      copy_to_slot<Fmt>(item_address(i), ahead_slot<Fmt, kAhead>(stages, warp, lane, i));
      cp_async_commit();
    }
  }
  quantize_input_to_shared(in, p.groups * kGroupElems, x_s, ds_s, norm_w);
  if constexpr (!kInterleaved) cp_async_wait<0>();
  __syncthreads();
  stamp_x_staged<kInterleaved>(g);

  for (int i = 0; i < items; ++i) {
    float acc = 0.0f;
    if constexpr (kInterleaved && kAhead > 0) {
      // This item from g; then item i + 1 from its slot once its group has landed (items up to
      // i + kAhead were copied, one group each, so at most kAhead - 1 may still be pending), and
      // the slot takes item i + 1 + kAhead. Waiting only after the dot keeps kAhead items on
      // their way while it runs. A lane reads only its own words: no barrier.
      if (li < p.groups) {
        const int4* xg = reinterpret_cast<const int4*>(x_s + li * kXGroupBytes);
        const float4* dg = reinterpret_cast<const float4*>(ds_s + li * kDsGroupBytes);
        accumulate_group_words<Fmt>(g, xg, dg, acc);
      }
      cp_async_wait<kAhead - 1>();
      if (item_address(i + 1).first) {
        WordAddress copy;
        copy.first = ahead_slot<Fmt, kAhead>(stages, warp, lane, i + 1), copy.step = kWarpSize;
        load_words<Fmt, true>(g, copy);
      }
      copy_to_slot<Fmt>(item_address(i + 1 + kAhead), ahead_slot<Fmt, kAhead>(stages, warp, lane, i + 1 + kAhead));
      cp_async_commit();
    } else if constexpr (kInterleaved) {
      const WordAddress next = item_address(i + 1);  // its words replace this item's as they are read
      if (li < p.groups) {
        const int4* xg = reinterpret_cast<const int4*>(x_s + li * kXGroupBytes);
        const float4* dg = reinterpret_cast<const float4*>(ds_s + li * kDsGroupBytes);
        accumulate_group_words<Fmt, true>(g, xg, dg, acc, next);
      }
    } else {
      if constexpr (kStages > 1) issue(i + 1);
      cp_async_wait<kStages - 1>();  // item i has landed (this lane's copies) ...
      __syncwarp();                  // ... and every lane's
      if (li < p.groups) {
        const uint8_t* stage = my_stages + size_t(i & (kStages - 1)) * kWarpSize * kG + slot * kGluLanesPerRow * kG;
        const int4* xg = reinterpret_cast<const int4*>(x_s + li * kXGroupBytes);
        const float4* dg = reinterpret_cast<const float4*>(ds_s + li * kDsGroupBytes);
        accumulate_group<Fmt>(stage + li * kG, xg, dg, acc);
      }
      __syncwarp();  // the stage is refilled by the next issue
      if constexpr (kStages == 1) issue(i + 1);
    }
    float v = acc;  // the pair kernel's butterfly over a row's 16 lanes
#pragma unroll
    for (int off = kGluLanesPerRow / 2; off > 0; off >>= 1) v += __shfl_xor_sync(kFullMask, v, off);
    const int h_block = h_block_of(i), value = value_of(i), buf = (i / kGluTasksPerWarp) & 1;
    const int row = h_block * kGluBlockValues + value;
    const float* add = slot == 0 ? p.add[0] : p.add[1];
    if (add) v += add[row];
    const float up = __shfl_xor_sync(kFullMask, v, kGluLanesPerRow);
    if (lane == 0) gate_s[buf][value] = v, up_s[buf][value] = up;
    if (i % kGluTasksPerWarp == kGluTasksPerWarp - 1) {
      __syncthreads();  // the h-block's 32 pairs are in shared memory
      if (warp == (i / kGluTasksPerWarp) % kGroupedWarps) {  // the writer takes turns
        const int at = h_block * kGluBlockValues + lane;
        const float h = glu_pair(ep, at, gate_s[buf][lane], up_s[buf][lane], p.y[0], p.y[1]);
        if (ep.glu.q8) {
          uint8_t* q8 = ep.glu.q8 + ep.token * ep.glu.q8_row_bytes;  // quantize_q8's layout, as glu()
          const float one[1] = {h};
          quantize_block_spread<kWarpSize, 1>(one, reinterpret_cast<int8_t*>(q8) + at,
                                              reinterpret_cast<float2*>(q8 + (p.rows + 15) / 16 * 16) + h_block);
        }
      }
    }
  }
  cp_async_wait<0>();
  trace_stamp(3);  // thread 0's items done
}

// h-blocks each block loops over. Where one block fits a multiprocessor (q8_0: 145 KB of
// shared memory), every resident slot would leave the last round mostly idle (Llama-3-8B: 448
// h-blocks over 132 blocks, 52 of them taking a fourth), so the grid is ceil(h-blocks / rounds)
// and every block takes the same number: Q8_0 step 2.537 -> 2.519 ms. Two or more per
// multiprocessor keep every slot (q4_0: 264 blocks, 184 taking two; 224 blocks of two each
// measured 0.3% slower, q4_K 0.3% faster). KILN_CUDA_GLU_ROUNDS=r sets r (0: the default),
// for the interleaved launch too.
int glu_forced_rounds() {
  static const int forced = std::max(0, env_int("KILN_CUDA_GLU_ROUNDS", 0));
  return forced;
}
int glu_rounds(int h_blocks, int blocks_per_sm, int sms) {
  if (glu_forced_rounds() > 0) return glu_forced_rounds();
  if (blocks_per_sm > 1) return 1;
  return (h_blocks + sms - 1) / sms;
}

// Whether the interleaved launch takes items ahead: KILN_CUDA_GLU_AHEAD=0 never, 2 for q4_0 and
// q4_K, else (the default) for q4_K only. Measured (docs/perf-notes.md, round 24): Llama-3-8B
// Q4_K_M 1.8215 -> 1.7812 ms a step, Q4_0 1.6142 -> 1.6800 (slower: not by default).
template <typename Fmt>
bool glu_items_ahead_wanted() {
  static const int mode = env_int("KILN_CUDA_GLU_AHEAD", 1);
  return mode == 2 || (mode != 0 && std::is_same_v<Fmt, GroupQ4_K>);
}

template <typename Fmt, int kStages>
Status launch_glu_stages(const GluProducts& p, const F32Input& in, const PairEpilogue& ep, cudaStream_t stream) {
  constexpr auto kernel = matvec_glu_kernel<Fmt, kStages>;
  const size_t smem = grouped_smem_bytes<Fmt>(int64_t(p.groups) * kGroupElems, kStages);
  int blocks_per_sm = 0, sms = 0;
  if (Status s = grouped_occupancy<kernel>(smem, blocks_per_sm, sms); !s.ok()) return s;
  const int h_blocks = p.rows / kGluBlockValues, rounds = glu_rounds(h_blocks, blocks_per_sm, sms);
  const int grid = min((h_blocks + rounds - 1) / rounds, blocks_per_sm * sms);
  launch_chained(kernel, grid, kGroupedThreads, smem, stream, p, in, ep);
  return launch_status(kStages == 1 ? "matvec_glu_kernel (one stage)" : "matvec_glu_kernel");
}

// The interleaved mode, where gate and up are both in the layout. q4_0 / q4_K: the h-blocks
// spread evenly over the fewest rounds that cover them (Llama-3-8B: 224 blocks of two). q8_0:
// every resident block, dealt the h-blocks in turn (264 blocks: 184 take two, 80 one), so that
// no multiprocessor runs a single block. Measured in one call (docs/perf-notes.md, round 15):
// Q8_0 2.417 -> 2.399 ms a step with every block, Q4_0 1.664 -> 1.674 (slower).
template <typename Fmt, int kAhead>
Status launch_glu_interleaved(const GluProducts& p, const F32Input& in, const PairEpilogue& ep, cudaStream_t stream) {
  constexpr auto kernel = matvec_glu_kernel<Fmt, 0, kAhead>;
  const size_t smem = grouped_smem_bytes<Fmt>(int64_t(p.groups) * kGroupElems, 0) + kAhead * slot_bytes<Fmt>();
  int blocks_per_sm = 0, sms = 0;
  if (Status s = grouped_occupancy<kernel>(smem, blocks_per_sm, sms); !s.ok()) return s;
  const int h_blocks = p.rows / kGluBlockValues, resident = blocks_per_sm * sms;
  const int even_rounds = std::is_same_v<Fmt, GroupQ8_0> ? 1 : (h_blocks + resident - 1) / resident;
  const int rounds = glu_forced_rounds() > 0 ? glu_forced_rounds() : even_rounds;
  launch_chained(kernel, min((h_blocks + rounds - 1) / rounds, resident), kGroupedThreads, smem, stream, p, in, ep);
  return launch_status("matvec_glu_kernel (interleaved)");
}

template <typename Fmt>
Status launch_glu(const GluProducts& p, const F32Input& in, const PairEpilogue& ep, cudaStream_t stream) {
  const size_t span = size_t(p.rows) * size_t(p.w_row_bytes);
  if constexpr (grouped_interleavable<Fmt, Fmt>()) {
    const size_t tile = size_t(interleave_tile_rows(p.groups)) * size_t(p.w_row_bytes);
    if (interleaved_tiles(p.w[0], span, tile) && interleaved_tiles(p.w[1], span, tile) &&
        p.w_row_bytes == p.groups * Fmt::kGroupBytes) {
      // Items ahead, where two blocks still fit a multiprocessor with their slots.
      const size_t base = grouped_smem_bytes<Fmt>(int64_t(p.groups) * kGroupElems, 0);
      if constexpr (takes_items_ahead<Fmt>())
        if (glu_items_ahead_wanted<Fmt>() &&
            base + kGluItemsAhead * slot_bytes<Fmt>() <= shared_bytes_for_blocks(kInterleavedMinBlocks))
          return launch_glu_interleaved<Fmt, kGluItemsAhead>(p, in, ep, stream);
      return launch_glu_interleaved<Fmt, 0>(p, in, ep, stream);
    }
  }
  if (is_interleaved(p.w[0], span) || is_interleaved(p.w[1], span))
    return Status::invalid("matvec (glu): gate / up are in the interleaved layout, and this launch cannot read them "
                           "so");
  if (ep.glu.stages == 1) return launch_glu_stages<Fmt, 1>(p, in, ep, stream);
  return launch_glu_stages<Fmt, 2>(p, in, ep, stream);
}

Status matvec_glu_f32_parts(GgmlType type, int64_t cols, int64_t w_row_bytes, std::span<const MatvecPart> parts,
                            const F32Input& in, const PairEpilogue& ep, cudaStream_t stream) {
  GluProducts p{};
  for (int s = 0; s < 2; ++s) {
    p.w[s] = static_cast<const uint8_t*>(parts[size_t(s)].w);
    p.add[s] = parts[size_t(s)].add;
    p.y[s] = parts[size_t(s)].y;
  }
  p.w_row_bytes = w_row_bytes, p.rows = int(parts[0].rows), p.groups = int(cols / kGroupElems);
  if (type == GgmlType::Q4_0) return launch_glu<GroupQ4_0>(p, in, ep, stream);
  if (type == GgmlType::Q4_K) return launch_glu<GroupQ4_K>(p, in, ep, stream);
  if (type == GgmlType::Q6_K) return launch_glu<GroupQ6_K>(p, in, ep, stream);
  return launch_glu<GroupQ8_0>(p, in, ep, stream);
}

}  // namespace kiln::cuda::detail
