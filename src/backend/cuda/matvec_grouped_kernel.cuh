#pragma once
// Decode matvec for q4_0 and q8_0 weights read in groups of 8 blocks, and q4_K / q6_K weights
// read a super-block (256 weights, 144 / 210 bytes) at a time (see matvec.h for the contract;
// matvec_q8 takes this path when matvec_grouped_fits says so).
//
// Why groups: q4_0 (18 bytes) and q8_0 (34 bytes) blocks are only 2-byte aligned, so a lane
// that reads one block at a time needs many narrow loads and shifts (v1-v3 of the q8 kernel
// spent ~5 instructions per weight). Eight consecutive blocks are 144 / 272 bytes, a multiple
// of 16: a lane that owns 8 blocks reads them with 9 / 17 aligned 16-byte shared-memory loads
// (lanes 144 / 272 bytes apart: an odd number of 16-byte units, so no bank conflicts), and
// every field's place inside the group is a compile-time constant after unrolling.
//
// Work split: a block of kWarps warps stays resident (grid sized to the resident capacity)
// and its warps take "tasks" in turn: a task is one row (rows with more than 16 groups; 32
// lanes, one group each per chunk) or two rows (16 lanes per row). Each warp copies its next
// chunk of weights into shared memory with 16-byte asynchronous copies while it computes the
// current one (2 stages). The quantized x is copied once per block into shared memory, laid
// out with 16 bytes of padding per group so that the lanes' reads are conflict-free too.
//
// The kernel is shared by matvec_grouped.cu (parts of one weight type) and matvec_mixed.cu
// (parts of two types in one launch: a Q4_K_M layer's q4_K q/k with its q6_K v).
#include <climits>
#include <string>
#include <type_traits>

#include "backend/cuda/cluster_multicast.cuh"
#include "backend/cuda/common.cuh"
#include "backend/cuda/decode_layout.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/matvec_grouped.h"
#include "backend/cuda/matvec_segments.cuh"
#include "backend/cuda/pair_epilogue.cuh"
#include "backend/cuda/router_sums.cuh"

namespace kiln::cuda::detail {

constexpr int kGroupBlocks = 8;                      // blocks of 32 per group
constexpr int kGroupElems = 32 * kGroupBlocks;       // 256 weights
constexpr int kGroupedWarps = 8;
constexpr int kGroupedThreads = kGroupedWarps * kWarpSize;
constexpr int kGroupedStages = 2;  // copy stages per warp (1 where every warp has a single item, below)
constexpr int kXGroupBytes = kGroupElems + 16;       // int8 x of one group + padding
constexpr int kDsGroupBytes = kGroupBlocks * 8 + 16; // (d, d * sum) of its 8 blocks + padding

// The 32-bit word at byte `b` of the group held in registers (b even; 2-byte offsets take a
// funnel shift). Only compile-time b after unrolling, so g stays in registers.
template <int N>
__device__ __forceinline__ uint32_t word_at(const uint32_t (&g)[N], int b) {
  if (b % 4 == 0) return g[b / 4];
  return __funnelshift_r(g[b / 4], g[b / 4 + 1], 8 * (b % 4));
}
template <int N>
__device__ __forceinline__ uint32_t half_at(const uint32_t (&g)[N], int b) {
  return (g[b / 4] >> (8 * (b % 4))) & 0xffffu;
}

// Block j of a group in registers, dotted with the 8 words of int8 x of that block.
struct GroupQ4_0 {
  // Rounded explicitly (dot and sum over blocks): formats of the interleaved layout.
  static constexpr bool kExactSum = true;
  static constexpr int kBlockBytes = 18;
  static constexpr int kGroupBytes = kBlockBytes * kGroupBlocks;
  // The last block j that reads 16-byte word k (blocks of kBlockBytes in a row).
  static constexpr int last_block_reading(int k) {
    return (16 * k + 15) / kBlockBytes < kGroupBlocks - 1 ? (16 * k + 15) / kBlockBytes : kGroupBlocks - 1;
  }
  template <int N>
  __device__ static float dot(const uint32_t (&g)[N], int j, const int* x, float2 ds) {
    const int base = kBlockBytes * j;
    int sum = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t q = word_at(g, base + 2 + 4 * k);  // elements 4k.. (low) and 16+4k.. (high)
      sum = dot4(int(q & 0x0F0F0F0Fu), x[k], sum);
      sum = dot4(int((q >> 4) & 0x0F0F0F0Fu), x[k + 4], sum);
    }
    // Explicit roundings (no contraction left to the compiler), here and where blocks are
    // summed: the copy-stage and interleaved paths give the same bits whatever their schedules.
    return __fmul_rn(half_to_float(half_at(g, base)), __fsub_rn(__fmul_rn(ds.x, float(sum)), 8.0f * ds.y));
  }
};

struct GroupQ8_0 {
  // Rounded explicitly (dot and sum over blocks): formats of the interleaved layout.
  static constexpr bool kExactSum = true;
  static constexpr int kBlockBytes = 34;
  static constexpr int kGroupBytes = kBlockBytes * kGroupBlocks;
  // The last block j that reads 16-byte word k (blocks of kBlockBytes in a row).
  static constexpr int last_block_reading(int k) {
    return (16 * k + 15) / kBlockBytes < kGroupBlocks - 1 ? (16 * k + 15) / kBlockBytes : kGroupBlocks - 1;
  }
  template <int N>
  __device__ static float dot(const uint32_t (&g)[N], int j, const int* x, float2 ds) {
    const int base = kBlockBytes * j;
    int sum = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) sum = dot4(int(word_at(g, base + 2 + 4 * k)), x[k], sum);
    return __fmul_rn(__fmul_rn(half_to_float(half_at(g, base)), ds.x), float(sum));  // as GroupQ4_0
  }
};

// A q4_K super-block: d, dmin (f16), 12 bytes of packed 6-bit sub-block scales and mins,
// then 128 bytes of nibbles: bytes 32p..32p+31 hold sub-block 2p in their low nibbles and
// sub-block 2p+1 in their high ones. Sub-block j is d*scale_j*q - dmin*min_j.
struct GroupQ4_K {
  // Rounded explicitly (dot and sum over blocks): formats of the interleaved layout.
  static constexpr bool kExactSum = true;
  static constexpr int kGroupBytes = 144;
  template <int N>
  __device__ static int byte_at(const uint32_t (&g)[N], int b) {
    return int((g[b / 4] >> (8 * (b % 4))) & 0xffu);
  }
  // Word 0 (d, dmin, the 12 bytes of scales) is read by every block of the group: the dot
  // takes it from `head`, a copy made at the group's start (accumulate_group_words), so that
  // the interleaved kernel can reload word 0 of the next item before this item's blocks
  // instead of after the last one.
  static constexpr int kHeadWords = 4, kHeadFirst = 0;  // g[0..3]
  template <int N>
  __device__ static float dot(const uint32_t (&g)[N], const uint32_t (&head)[kHeadWords], int j, const int* x,
                              float2 ds) {
    const int base = 16 + 32 * (j / 2), shift = 4 * (j % 2);
    int sum = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) sum = dot4(int((g[base / 4 + k] >> shift) & 0x0F0F0F0Fu), x[k], sum);
    int scale, min;
    if (j < 4) {
      scale = byte_at(head, 4 + j) & 63;
      min = byte_at(head, 8 + j) & 63;
    } else {
      scale = (byte_at(head, 8 + j) & 0xF) | ((byte_at(head, j) >> 6) << 4);
      min = (byte_at(head, 8 + j) >> 4) | ((byte_at(head, 4 + j) >> 6) << 4);
    }
    const float d = half_to_float(head[0]), dmin = half_to_float(head[0] >> 16);
    return __fsub_rn(__fmul_rn(__fmul_rn(__fmul_rn(d, float(scale)), ds.x), float(sum)),  // as GroupQ4_0
                     __fmul_rn(__fmul_rn(dmin, float(min)), ds.y));
  }
  // The last block j that reads 16-byte word k: word 0 (d, dmin, the scales) none, its copy
  // serves all eight; words 1 + 2p and 2 + 2p hold the nibbles of blocks 2p and 2p + 1.
  static constexpr int last_block_reading(int k) { return k == 0 ? -1 : 2 * ((k - 1) / 2) + 1; }
};

// A q6_K super-block: 128 bytes of low nibbles (ql), 64 bytes of high 2-bit pairs (qh), 16
// int8 scales (one per 16 weights), the f16 d. In half h (128 weights) the 32 weights of
// block 4h+k take their low nibbles from ql bytes 64h + 32(k%2) .. +31 (low nibble for k < 2,
// high for k >= 2) and their top two bits from qh bytes 128 + 32h .. +31 at bit 2k; weight i
// of that block is d * scale[8h + 2k + i/16] * (level - 32).
//
// Why not aligned 16-byte loads as the other formats: 210 bytes is 13 x 16 + 2, so only every
// 8th super-block (8 x 210 = 105 x 16) starts on a 16-byte boundary. A group of 8 super-blocks
// per lane would need 8x the staging memory. Instead a chunk of 16 or 32 consecutive
// super-blocks (3360 / 6720 bytes, a multiple of 16 that starts on one, since chunks start at
// multiples of 16 super-blocks) is staged with the same 16-byte asynchronous copies, and each
// lane reads its 210 bytes from shared memory with 53 4-byte loads from the 4-byte boundary
// at or before it (lanes are 52.5 words apart: at most 2 lanes share a bank), then shifts the
// words by 0 or 16 bits so that every field sits at a compile-time place, as in the other
// formats. (14 16-byte loads from the 16-byte boundary before the group would be free of
// conflicts, but leave the group at a run-time offset of 0-14 bytes: about three selects and
// shifts per word to undo, against one funnel shift here.)
// A row's chunks stay 16-byte multiples only when its super-blocks are a multiple of 8
// (cols % 2048 == 0): matvec_grouped_fits checks it.
//
// In the interleaved layout (decode_layout.h) a group's first 208 bytes are 13 16-byte words
// and d sits apart: a lane loads the words into g[0..51] and d into g[52] ("word" 13 of
// load_word), the places Fmt::load gives them from a stage.
struct GroupQ6_K {
  // Rounded explicitly (dot and sum over blocks): a format of the interleaved layout.
  static constexpr bool kExactSum = true;
  static constexpr int kGroupBytes = 210;
  static constexpr int kWords = 53;  // 52.5 words; the last one's upper half is not read
  static constexpr int kLoadWords = kQ6KLayoutWords + 1;  // the 13 words, then d
  // The scales (g[48..51]) and d (g[52]) are read by every block: the dot takes them from a
  // copy made at the group's start (accumulate_group_words), as GroupQ4_K does its word 0.
  static constexpr int kHeadWords = 5, kHeadFirst = 48;
  // The last block j that reads load word k. Block 4h + m reads ql words 4h + 2(m % 2) and the
  // next (blocks 4h + m and 4h + m + 2 share them, at the low and the high nibbles) and qh
  // words 8 + 2h and the next; the scales (word 12) and d (13) are read from the copy.
  static constexpr int last_block_reading(int k) {
    if (k < 8) return 4 * (k / 4) + (k % 4) / 2 + 2;
    if (k < 12) return k < 10 ? 3 : 7;
    return -1;
  }
  __device__ static void load(const uint8_t* group, uint32_t (&g)[kWords]) {
    const int misalign = int(reinterpret_cast<uintptr_t>(group) % 4);  // 0 or 2: groups start on even bytes
    const uint32_t* w = reinterpret_cast<const uint32_t*>(group - misalign);
    uint32_t words[kWords];
#pragma unroll
    for (int k = 0; k < kWords; ++k) words[k] = w[k];
#pragma unroll
    for (int k = 0; k < kWords; ++k) g[k] = __funnelshift_r(words[k], words[k + 1 < kWords ? k + 1 : k], 8 * misalign);
  }
  template <int N>
  __device__ static float dot(const uint32_t (&g)[N], const uint32_t (&head)[kHeadWords], int j, const int* x,
                              float2 ds) {
    const int h = j / 4, k = j % 4;
    const int ql = 16 * h + 8 * (k % 2), qh = 32 + 8 * h;  // word indices of the block's bytes
    // Weights 0-15 and 16-31 have their own scales. The levels (0..63) are dotted as they
    // are and the offset 32 taken off with the sum of x: one dot4 per word, where subtracting
    // 32 from each byte of a word costs three instructions.
    int sum[2] = {0, 0}, x_sum[2] = {0, 0};
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const uint32_t low = (g[ql + i] >> (4 * (k / 2))) & 0x0F0F0F0Fu, high = (g[qh + i] >> (2 * k)) & 0x03030303u;
      const uint32_t level = low | (high << 4);
      sum[i / 4] = dot4(int(level), x[i], sum[i / 4]);
      x_sum[i / 4] = dot4(0x01010101, x[i], x_sum[i / 4]);
    }
    const int s = 8 * h + 2 * k;  // byte of the first scale, from byte 192 (head[0])
    const int scale0 = int(int8_t(head[s / 4] >> (8 * (s % 4)))), scale1 = int(int8_t(head[s / 4] >> (8 * (s % 4 + 1))));
    const int total = scale0 * (sum[0] - 32 * x_sum[0]) + scale1 * (sum[1] - 32 * x_sum[1]);
    return __fmul_rn(__fmul_rn(half_to_float(head[4] & 0xffffu), ds.x), float(total));
  }
};

template <typename Fmt>
constexpr int group_bytes() { return Fmt::kGroupBytes; }

// The words a format's dot reads from a copy (Fmt::kHeadWords), 1 (unused) where none.
template <typename Fmt>
constexpr int head_words() {
  if constexpr (requires { Fmt::kHeadWords; })
    return Fmt::kHeadWords;
  else
    return 1;
}

// The loads of a group in the interleaved layout: its 16-byte words (q6_K: and its d).
template <typename Fmt>
constexpr int layout_loads() {
  if constexpr (requires { Fmt::kLoadWords; })
    return Fmt::kLoadWords;
  else
    return Fmt::kGroupBytes / 16;
}

// Registers a lane's group occupies, and its load from the stage (`group`: the lane's bytes).
// Groups of a multiple of 16 bytes sit 16-byte aligned: plain 16-byte loads.
template <typename Fmt>
constexpr int group_words() { return (Fmt::kGroupBytes + 3) / 4; }

template <typename Fmt>
__device__ __forceinline__ void load_group(const uint8_t* group, uint32_t (&g)[group_words<Fmt>()]) {
  if constexpr (Fmt::kGroupBytes % 16 == 0) {
    const uint4* src = reinterpret_cast<const uint4*>(group);
#pragma unroll
    for (int u = 0; u < Fmt::kGroupBytes / 16; ++u) {
      const uint4 v = src[u];
      g[4 * u] = v.x, g[4 * u + 1] = v.y, g[4 * u + 2] = v.z, g[4 * u + 3] = v.w;
    }
  } else {
    Fmt::load(group, g);
  }
}

// A launch reads parts of one format, Fmt, or of two: FmtB for the parts SecondFormat names.
// Its stages hold the larger of the two formats' groups.
template <typename Fmt, typename FmtB = Fmt>
constexpr int stage_group_bytes() {
  return group_bytes<Fmt>() > group_bytes<FmtB>() ? group_bytes<Fmt>() : group_bytes<FmtB>();
}

template <typename Fmt, typename FmtB = Fmt>
size_t grouped_smem_bytes(int64_t cols, int stages = kGroupedStages) {
  const int64_t groups = cols / kGroupElems;
  return size_t(groups) * (kXGroupBytes + kDsGroupBytes) +
         size_t(kGroupedWarps) * stages * kWarpSize * stage_group_bytes<Fmt, FmtB>();
}

// The parts of a two-format launch that are in the second format (bit i: part i), and their
// row stride (the first format's is the kernel's w_row_bytes). Unused by one-format launches.
struct SecondFormat {
  int64_t w_row_bytes = 0;
  unsigned parts = 0;
  __device__ __forceinline__ bool has(int part) const { return (parts >> part) & 1u; }
};

// A group in the interleaved layout (decode_layout.h): where word k of this lane's group sits
// (words k at first + k * step; a q6_K group's d at d), or null where the lane has none.
struct WordAddress {
  const uint4* first = nullptr;
  int64_t step = 0;
  const unsigned short* d = nullptr;
};
template <typename Fmt>
__device__ __forceinline__ WordAddress interleaved_group(const uint8_t* w, int64_t row, int group, int groups) {
  if constexpr (std::is_same_v<Fmt, GroupQ6_K>) {
    const int64_t first = interleaved_q6_k_word(row, group, 0, groups);
    const int64_t step = interleaved_q6_k_word(row, group, 1, groups) - first;
    return {reinterpret_cast<const uint4*>(w) + first, step,
            reinterpret_cast<const unsigned short*>(w + interleaved_q6_k_d_byte(row, group, groups))};
  } else {
    constexpr int kWords = Fmt::kGroupBytes / 16;
    const int64_t first = interleaved_word(row, group, 0, groups, kWords);
    const int64_t step = interleaved_word(row, group, 1, groups, kWords) - first;  // from word k to k + 1
    return {reinterpret_cast<const uint4*>(w) + first, step};
  }
}
// Trace builds: phase stamp 2 of a grouped kernel (x staged, and in the interleaved layout the
// lane's first weights in, g holding them).
template <bool kInterleaved, int N>
__device__ __forceinline__ void stamp_x_staged(const uint32_t (&g)[N]) {
  if constexpr (kInterleaved)
    trace_stamp(2, g[0]);
  else
    trace_stamp(2);
}
// kShared: `a` is a lane's copy of the words in shared memory (a.step apart; never q6_K, whose d
// sits apart), not the layout in global memory.
template <typename Fmt, bool kShared = false>
__device__ __forceinline__ void load_word(uint32_t (&g)[group_words<Fmt>()], const WordAddress& a, int k) {
  if constexpr (std::is_same_v<Fmt, GroupQ6_K>) {
    static_assert(!kShared);
    if (k == kQ6KLayoutWords) {  // d, to where Fmt::load puts it
      g[GroupQ6_K::kWords - 1] = __ldcs(a.d);
      return;
    }
  }
  uint4 v;
  if constexpr (kShared)
    v = a.first[k * a.step];
  else
    v = __ldcs(a.first + k * a.step);  // read once a step
  g[4 * k] = v.x, g[4 * k + 1] = v.y, g[4 * k + 2] = v.z, g[4 * k + 3] = v.w;
}
template <typename Fmt, bool kShared = false>
__device__ __forceinline__ void load_words(uint32_t (&g)[group_words<Fmt>()], const WordAddress& a) {
  if (!a.first) return;
#pragma unroll
  for (int k = 0; k < layout_loads<Fmt>(); ++k) load_word<Fmt, kShared>(g, a, k);
}
// One lane's group in registers dotted with the group's int8 x and scales in shared memory,
// added to acc. With kReload, each word of g is then reloaded from `next` (the next item's
// group in the interleaved layout; null: none) right after the last block that reads it: the
// next item's loads are in flight while this item's blocks are dotted, in the registers the
// group already takes.
template <typename Fmt, bool kReload = false>
__device__ __forceinline__ void accumulate_group_words(uint32_t (&g)[group_words<Fmt>()], const int4* xg,
                                                       const float4* dg, float& acc, const WordAddress& next = {}) {
  // Formats with words that every block reads (GroupQ4_K's d, dmin and scales; GroupQ6_K's
  // scales and d) dot from a copy of them, and those words of the next item are reloaded at
  // once (last_block_reading < 0).
  constexpr bool kHead = requires { Fmt::kHeadWords; };
  uint32_t head[head_words<Fmt>()];
  if constexpr (kHead) {
#pragma unroll
    for (int k = 0; k < Fmt::kHeadWords; ++k) head[k] = g[Fmt::kHeadFirst + k];
    if constexpr (kReload) {
#pragma unroll
      for (int k = 0; k < layout_loads<Fmt>(); ++k)
        if (Fmt::last_block_reading(k) < 0 && next.first) load_word<Fmt>(g, next, k);
    }
  }
#pragma unroll
  for (int j = 0; j < kGroupBlocks; j += 2) {
    const float4 d2 = dg[j / 2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int4 a = xg[2 * (j + h)], b = xg[2 * (j + h) + 1];
      const int x[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
      const float2 ds = h == 0 ? make_float2(d2.x, d2.y) : make_float2(d2.z, d2.w);
      float dot;
      if constexpr (kHead)
        dot = Fmt::dot(g, head, j + h, x, ds);
      else
        dot = Fmt::dot(g, j + h, x, ds);
      if constexpr (Fmt::kExactSum)
        acc = __fadd_rn(acc, dot);  // the interleaved and copy-stage paths give the same bits
      else
        acc += dot;
      if constexpr (kReload) {
#pragma unroll
        for (int k = 0; k < layout_loads<Fmt>(); ++k)
          if (Fmt::last_block_reading(k) == j + h && next.first) load_word<Fmt>(g, next, k);
      }
    }
  }
}

// One lane's group (its bytes at `group` in the stage) dotted as above.
template <typename Fmt>
__device__ __forceinline__ void accumulate_group(const uint8_t* group, const int4* xg, const float4* dg, float& acc) {
  uint32_t g[group_words<Fmt>()];
  load_group<Fmt>(group, g);
  accumulate_group_words<Fmt>(g, xg, dg, acc);
}

// Launches of one format that the layout of decode_layout.h takes (q4_0, q8_0, q4_K, q6_K): the
// only ones with the interleaved mode of the kernel below (kStages == 0: a lane loads its group
// with coalesced 16-byte loads straight into registers, and the blocks hold no copy stages, only
// x, in shared memory).
template <typename Fmt, typename FmtB>
constexpr bool grouped_interleavable() {
  return std::is_same_v<Fmt, FmtB> && (std::is_same_v<Fmt, GroupQ4_0> || std::is_same_v<Fmt, GroupQ8_0> ||
                                       std::is_same_v<Fmt, GroupQ4_K> || std::is_same_v<Fmt, GroupQ6_K>);
}
// Launches of one format, q4_0 or q8_0: the only ones that read the residual's old value early.
template <typename Fmt, typename FmtB>
constexpr bool grouped_q4_0_or_q8_0() {
  return std::is_same_v<Fmt, FmtB> && (std::is_same_v<Fmt, GroupQ4_0> || std::is_same_v<Fmt, GroupQ8_0>);
}
// Resident blocks its launch bound asks for: 2, at most 128 registers (124-128 with the next
// item's words loaded as the current one's are read). q4_0 at 3 blocks (80 registers) spilled
// and measured 9.7% slower than the copy stages; capped at 1 block (room for the next chained
// kernel's blocks) Llama-3-8B Q4_0 measured 25% slower, Q8_0 7.5%.
constexpr int kInterleavedMinBlocks = 2;
// Resident blocks the two-stage glu kernel's launch bound asks for (matvec_grouped_glu.cu): 2.
// Its copy stages (two a warp: ~74 KB a block for q4_0 rows, twice that for q8_0) never let more
// share a multiprocessor, and without a count ptxas aimed at more: the q4_0 / q8_0 instances
// spilled at 64 registers once quantizing took a reciprocal. Not for matvec_grouped_kernel: with
// the same bound its two-stage instances took more registers and Llama-3-8B Q4_K_M lost what the
// reciprocal gained (docs/perf-notes.md, round 22).
constexpr int kTwoStageMinBlocks = 2;
// Resident blocks the one-stage kernel's launch bound asks for: 3 (at most 80 registers), but 2
// for the instances over f32 x that spill at 80 (ptxas, bytes stored / loaded: q8_0 at 8 lanes a
// row 20 / 24, q4_K rows with q6_K rows at 8 lanes 12 / 20, q6_K at 16 lanes 32 / 56). Their
// launches (x of at most 2048 values) mostly need fewer blocks than two a multiprocessor, and
// launch_grouped takes the two-stage kernel where they do not fit. Values read back from local
// memory in the item loop are dear: the glu kernel's parameters held there cost ~25 us a
// Llama-3-8B step (docs/perf-notes.md, round 17).
template <typename Fmt, typename FmtB, int kLanesPerRow, bool kFromF32>
constexpr int one_stage_min_blocks() {
  constexpr bool kOneFormat = std::is_same_v<Fmt, FmtB>;
  constexpr bool kSpillsAt80 = kFromF32 && ((kLanesPerRow == 8 && (std::is_same_v<Fmt, GroupQ8_0> || !kOneFormat)) ||
                                            (kLanesPerRow == 16 && kOneFormat && std::is_same_v<Fmt, GroupQ6_K>));
  return kSpillsAt80 ? 2 : 3;
}

// f32 x (optionally RMS-normalized) quantized by the whole block into the padded shared
// layout the kernel reads: 8 lanes per block of 32 values, all loads issued before any
// arithmetic so that the block waits for L2 once, not once per step. kSteps float4 per
// thread cover the widest x: kMaxF32InputCols, or 4096 for rows of two per task (at most
// kMaxPairGroups groups), which keeps those kernels' registers down.
constexpr int kF32Steps = int(kMaxF32InputCols) / (kGroupedThreads * 4);
constexpr int kPairF32Steps = 16 * kGroupElems / (kGroupedThreads * 4);

// The norm weights this thread will apply, loaded before the wait for the previous kernels
// (no kernel of the step writes them): one L2 round trip less after it.
template <int kSteps>
__device__ __forceinline__ void load_norm_weights(const F32Input& in, int cols, float4 (&w)[kSteps]) {
  if (!in.norm_weight) return;
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
    const int i = (s * kGroupedThreads + int(threadIdx.x)) * 4;
    if (i < cols) w[s] = *reinterpret_cast<const float4*>(in.norm_weight + i);
  }
}

// Returns the norm's 1 / rms (1 without norm weights).
template <int kSteps>
__device__ inline float quantize_input_to_shared(const F32Input& in, int cols, uint8_t* x_s, uint8_t* ds_s,
                                                 const float4 (&norm_w)[kSteps]) {
  __shared__ float partial[kGroupedWarps];
  const int tid = threadIdx.x;
  float4 v[kSteps];
  float sum_sq = 0.0f;
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
    const int i = (s * kGroupedThreads + tid) * 4;
    if (i < cols) {
      v[s] = *reinterpret_cast<const float4*>(in.x + i);
      sum_sq = fmaf(v[s].x, v[s].x, sum_sq);
      sum_sq = fmaf(v[s].y, v[s].y, sum_sq);
      sum_sq = fmaf(v[s].z, v[s].z, sum_sq);
      sum_sq = fmaf(v[s].w, v[s].w, sum_sq);
    }
  }
  float inv = 1.0f;
  if (in.norm_weight) {
    inv = rsqrtf(block_sum<kGroupedWarps>(sum_sq, partial) / float(cols) + in.eps);  // rmsnorm()'s formula
  }
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
    const int i = (s * kGroupedThreads + tid) * 4;
    if (i >= cols) break;  // cols % 256 == 0: whole warps leave together
    float four[4] = {v[s].x, v[s].y, v[s].z, v[s].w};
    if (in.norm_weight) {
      const float wk[4] = {norm_w[s].x, norm_w[s].y, norm_w[s].z, norm_w[s].w};
#pragma unroll
      for (int k = 0; k < 4; ++k) four[k] = __fmul_rn(__fmul_rn(four[k], inv), wk[k]);
      // Every block computed the whole vector; block s % grid writes step s.
      if (in.normed && s % int(gridDim.x) == int(blockIdx.x))
        *reinterpret_cast<float4*>(in.normed + i) = make_float4(four[0], four[1], four[2], four[3]);
    }
    const int group = i / kGroupElems, at = i % kGroupElems;
    quantize_block_spread<8, 4>(four, reinterpret_cast<int8_t*>(x_s + group * kXGroupBytes + at),
                                reinterpret_cast<float2*>(ds_s + group * kDsGroupBytes) + at / 32);
  }
  return inv;
}

// quantize_q8's int8 x (groups of 256 values, then their 8 (d, d * sum) pairs each) into the
// padded shared layout, by bulk copies multicast to every block of the cluster: block r asks
// for pieces r, r + C, ... (a group's values or its pairs), every block receives them all.
// Every thread of the block calls it (after the wait; multicast_prepare before).
__device__ __forceinline__ void stage_q8_multicast(uint8_t* x_s, uint8_t* ds_s, const int8_t* xqs,
                                                   const float2* xds, int groups, uint64_t* bar) {
  constexpr uint32_t kDsBytes = kGroupBlocks * sizeof(float2);
  if (threadIdx.x == 0) multicast_expect(bar, uint32_t(groups) * (kGroupElems + kDsBytes));
  const int blocks = int(cluster_blocks());
  for (int p = int(threadIdx.x) * blocks + int(cluster_rank()); p < 2 * groups; p += kGroupedThreads * blocks) {
    if (p < groups)
      multicast_copy(x_s + p * kXGroupBytes, xqs + int64_t(p) * kGroupElems, kGroupElems, bar);
    else
      multicast_copy(ds_s + (p - groups) * kDsGroupBytes, xds + int64_t(p - groups) * kGroupBlocks, kDsBytes, bar);
  }
  multicast_wait(bar);
}

// kLanesPerRow: 32 (one row per task), 16 (two rows per task) or 8 (four). kStages: 2, or 1 for launches
// where every warp has at most one item (launch_grouped picks it, see kOneStageMaxCols: then
// a warp's whole share of the weights is in flight before the wait, and the smaller stages
// and at most 80 registers -- the launch bound's minimum of 3 blocks; 0 sets none -- let 3
// blocks share a multiprocessor instead of 2). kFromF32: x arrives as f32
// (`in`) and is quantized here; otherwise as quantize_q8's int8 copy (xqs, xds). FmtB != Fmt:
// the parts `second` names are in FmtB. Each row of a task (the two rows may differ in
// format) has kLanesPerRow groups of the larger format's size in the stage, and its lanes
// read their groups at multiples of their own format's size from there (16-byte aligned for
// q4_K whatever the other format). Rows of one part take one branch; a warp diverges only on
// a task that straddles two parts of different formats. kMulticastX: interleaved over int8 x,
// launched in clusters of two or more, x arriving by multicast (stage_q8_multicast); a
// template argument, so that the other instances carry none of its code (behind a runtime
// test, Llama-3-8B Q4_0 ran 10 us a step slower with the multicast off than before it, and
// Q4_K_M 11 us slower: docs/perf-notes.md, round 29). kRouterSums: the RouterSums epilogue
// (router_sums.cuh), likewise built only into the instances that take it (int8 x, 16 lanes).
template <typename Fmt, typename FmtB, int kLanesPerRow, bool kFromF32, int kStages = kGroupedStages,
          bool kMulticastX = false, bool kRouterSums = false>
__global__ void __launch_bounds__(kGroupedThreads,
                                  kStages == 1 ? one_stage_min_blocks<Fmt, FmtB, kLanesPerRow, kFromF32>()
                                               : (kStages == 0 ? kInterleavedMinBlocks : 0))
    matvec_grouped_kernel(GroupedSegments seg, int64_t w_row_bytes, SecondFormat second, int rows, int groups,
                          const int8_t* __restrict__ xqs, const float2* __restrict__ xds, F32Input in,
                          PairEpilogue ep) {
  constexpr bool kTwoFormats = !std::is_same_v<Fmt, FmtB>;
  constexpr int kG = stage_group_bytes<Fmt, FmtB>();  // stage bytes per lane
  constexpr int kSlots = kWarpSize / kLanesPerRow;  // rows per task
  extern __shared__ __align__(16) uint8_t smem[];
  uint8_t* x_s = smem;                                   // [groups][kXGroupBytes]
  uint8_t* ds_s = x_s + size_t(groups) * kXGroupBytes;   // [groups][kDsGroupBytes]
  uint8_t* stages = ds_s + size_t(groups) * kDsGroupBytes;

  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int slot = lane / kLanesPerRow, li = lane % kLanesPerRow;
  uint8_t* my_stages = stages + size_t(warp) * kStages * kWarpSize * kG;

  const int chunks = (groups + kLanesPerRow - 1) / kLanesPerRow;  // per row
  const int tasks = (rows + kSlots - 1) / kSlots;
  const int warps_total = gridDim.x * kGroupedWarps;
  const int first_task = blockIdx.x * kGroupedWarps + warp;
  const int my_tasks = first_task < tasks ? (tasks - first_task + warps_total - 1) / warps_total : 0;
  const int items = my_tasks * chunks;
  // The rows of task t. Two formats: walked from the last task back, so that where there
  // are more tasks than warps the warps taking a second task take the first part's rows and
  // the later parts (a Q4_K_M layer's k and its heavier q6_K v) go to warps with one task.
  auto first_row_of = [&](int t) { return (kTwoFormats ? tasks - 1 - t : t) * kSlots; };

  // Copies item i (task, chunk) into stage i % 2; always commits a group.
  auto issue = [&](int i) {
    if (i < items) {
      const int task = first_task + (i / chunks) * warps_total, chunk = i % chunks;
      const int first_group = chunk * kLanesPerRow;
      const int chunk_groups = min(kLanesPerRow, groups - first_group);
      uint8_t* dst_stage = my_stages + size_t(i & (kStages - 1)) * kWarpSize * kG;
#pragma unroll
      for (int s = 0; s < kSlots; ++s) {
        const int row = first_row_of(task) + s;
        if (row >= rows) break;
        int part, local;
        seg.locate(row, part, local);
        const bool b = kTwoFormats && second.has(part);
        const int row_g = b ? group_bytes<FmtB>() : group_bytes<Fmt>();
        const int64_t row_bytes = b ? second.w_row_bytes : w_row_bytes;
        const int n_pieces = chunk_groups * row_g / 16;  // whole: see matvec_grouped_fits
        const uint8_t* src =
            GroupedSegments::pick(seg.w, part) + int64_t(local) * row_bytes + int64_t(first_group) * row_g;
        uint8_t* dst = dst_stage + s * kLanesPerRow * kG;
        for (int p = lane; p < n_pieces; p += kWarpSize) cp_async_16(dst + 16 * p, src + 16 * p);
      }
    }
    cp_async_commit();
  };

  // Interleaved mode: item i's group of this lane from the layout into g (nothing where the
  // lane has none). The parts start at whole tiles of the layout (launch_grouped checks).
  constexpr bool kInterleaved = kStages == 0;
  static_assert(!kInterleaved || grouped_interleavable<Fmt, FmtB>());
  uint32_t g[kInterleaved ? group_words<Fmt>() : 1];
  auto item_address = [&](int i) {
    WordAddress a;
    if constexpr (kInterleaved) {
      if (i >= items) return a;
      const int task = first_task + (i / chunks) * warps_total, chunk = i % chunks;
      const int group = chunk * kLanesPerRow + li, row = first_row_of(task) + slot;
      if (group >= groups || row >= rows) return a;
      int part, local;
      seg.locate(row, part, local);
      a = interleaved_group<Fmt>(GroupedSegments::pick(seg.w, part), local, group, groups);
    }
    return a;
  };

  // This warp's first chunk of weights and its norm weights (no kernel of the step writes
  // them), then x, which the kernels before produce, into shared memory, padded per group
  // (all threads).
  if constexpr (kInterleaved)
    load_words<Fmt>(g, item_address(0));
  else
    issue(0);
  constexpr int kSteps = kLanesPerRow <= 16 ? kPairF32Steps : kF32Steps;  // <= 16 groups: see dispatch_grouped
  float4 norm_w[kFromF32 ? kSteps : 1];
  if constexpr (kFromF32) load_norm_weights<kSteps>(in, groups * kGroupElems, norm_w);
  static_assert(!kMulticastX || (kInterleaved && !kFromF32), "multicast: interleaved over int8 x only");
  __shared__ uint64_t x_landed;
  if constexpr (kMulticastX) multicast_prepare(&x_landed);
  wait_for_previous_kernels();
  allow_next_kernel();
  trace_stamp(0);  // trace builds (block_trace.cuh)
  if constexpr (kRouterSums) zero_previous_router_sums(ep.router);
  if constexpr (kFromF32) {
    quantize_input_to_shared(in, groups * kGroupElems, x_s, ds_s, norm_w);
    cp_async_wait<0>();
  } else if constexpr (kMulticastX) {
    stage_q8_multicast(x_s, ds_s, xqs, xds, groups, &x_landed);
  } else {
    for (int p = threadIdx.x; p < groups * (kGroupElems / 16); p += kGroupedThreads)
      cp_async_16(x_s + (p / 16) * kXGroupBytes + (p % 16) * 16, xqs + 16 * p);
    for (int p = threadIdx.x; p < groups * (kGroupBlocks / 2); p += kGroupedThreads)
      cp_async_16(ds_s + (p / 4) * kDsGroupBytes + (p % 4) * 16, xds + 2 * p);
    cp_async_commit();
    cp_async_wait<0>();
  }
  __syncthreads();
  if constexpr (kMulticastX) multicast_arrived();
  stamp_x_staged<kInterleaved>(g);

  float acc = 0.0f;
  // The old values of the task's row in its part's add and accumulate vectors (a residual
  // stream), read by the row's storing lane at the task's first chunk, so that the loads overlap
  // the products instead of adding a round trip to L2 at the task's (and the kernel's) end.
  // Only for q4_0 / q8_0: measured faster there (Llama-3-8B Q4_0 -6 us a step, Q8_0 -4), but
  // +8 us for Q4_K_M, whose q4_K / q6_K instances pay more registers for it.
  constexpr bool kOldEarly = grouped_q4_0_or_q8_0<Fmt, FmtB>();
  float add_old = 0.0f, accumulate_old = 0.0f;
  static_assert(!kRouterSums || (!kFromF32 && !kTwoFormats), "router sums: one format over int8 x");
  RouterRows<kRouterSums ? kSlots : 1> router_rows;
  float router_acc[kRouterSumsPerLane] = {};
  for (int i = 0; i < items; ++i) {
    if constexpr (kStages > 1) issue(i + 1);
    const int task = first_task + (i / chunks) * warps_total, chunk = i % chunks;
    const int group = chunk * kLanesPerRow + li;
    const int row = first_row_of(task) + slot;
    if constexpr (kRouterSums)
      if (chunk == 0) load_router_rows<kSlots>(ep.router, first_row_of(task), rows, router_rows);  // one part
    if (kOldEarly && chunk == 0 && li == 0 && row < rows) {
      int part, local;
      seg.locate(row, part, local);
      if (const float* add = GroupedSegments::pick(seg.add, part)) add_old = add[local];
      const float* target = GroupedSegments::pick(seg.acc, part);
      if (target && target != GroupedSegments::pick(seg.y, part)) accumulate_old = target[local];
    }
    if constexpr (kInterleaved) {
      const WordAddress next = item_address(i + 1);  // its words replace this item's as they are read
      if (group < groups && row < rows) {
        const int4* xg = reinterpret_cast<const int4*>(x_s + group * kXGroupBytes);
        const float4* dg = reinterpret_cast<const float4*>(ds_s + group * kDsGroupBytes);
        accumulate_group_words<Fmt, true>(g, xg, dg, acc, next);
      } else {
        load_words<Fmt>(g, next);
      }
    } else {
      cp_async_wait<kStages - 1>();  // item i has landed (this lane's copies) ...
      __syncwarp();                  // ... and every lane's
      if (group < groups && row < rows) {
        const uint8_t* stage =  // this row's groups
            my_stages + size_t(i & (kStages - 1)) * kWarpSize * kG + slot * kLanesPerRow * kG;
        const int4* xg = reinterpret_cast<const int4*>(x_s + group * kXGroupBytes);
        const float4* dg = reinterpret_cast<const float4*>(ds_s + group * kDsGroupBytes);
        if (kTwoFormats && second.has(seg.part_of(row)))
          accumulate_group<FmtB>(stage + li * group_bytes<FmtB>(), xg, dg, acc);
        else
          accumulate_group<Fmt>(stage + li * group_bytes<Fmt>(), xg, dg, acc);
      }
      __syncwarp();  // the stage is refilled by the next issue
      if constexpr (kStages == 1) issue(i + 1);  // one stage: only once it is free (not taken by launch_grouped)
    }
    if (chunk == chunks - 1) {
      float v = acc;
#pragma unroll
      for (int off = kLanesPerRow / 2; off > 0; off >>= 1) v += __shfl_xor_sync(kFullMask, v, off);
      int part = 0, local = 0;
      if (row < rows) {
        seg.locate(row, part, local);
        if (const float* add = GroupedSegments::pick(seg.add, part))
          v += kOldEarly ? add_old : add[local];  // add_old: used by the storing lane (li == 0) only
      }
      bool plain_store = li == 0 && row < rows;
      if constexpr (kLanesPerRow == 16) {
        if (ep.kind == PairEpilogueKind::RopeStore) {  // every row has its pair (host-checked)
          const float partner = __shfl_xor_sync(kFullMask, v, 16);
          if (li == 0) rope_store_pair(ep, part, local, slot, v, partner, GroupedSegments::pick(seg.y, part));
          plain_store = false;
        }
      }
      float residual_now = 0.0f;  // the storing lane's: the row's new value in the accumulate vector
      if (plain_store) {
        float* y = GroupedSegments::pick(seg.y, part);
        y[local] = v;
        if (float* target = GroupedSegments::pick(seg.acc, part)) {
          residual_now = target == y || !kOldEarly ? target[local] + v : accumulate_old + v;
          target[local] = residual_now;
        }
      }
      if constexpr (kRouterSums) add_router_rows<kSlots, kLanesPerRow>(router_rows, residual_now, router_acc);
      acc = 0.0f;
    }
  }
  cp_async_wait<0>();
  if constexpr (kRouterSums) add_block_router_sums<kGroupedWarps>(ep.router, router_acc);
  trace_stamp(3);  // thread 0's items done
  if constexpr (kMulticastX) multicast_finish();
}

// The grouped kernels' dynamic shared memory limit (their attribute; wider rows go elsewhere).
inline constexpr size_t kGroupedMaxSmem = 200 * 1024;

// Resident blocks of one kernel per multiprocessor for `smem` bytes (the largest size seen so
// far: smaller sizes fit at least as many), with its shared-memory limit raised once (state
// per kernel: the template argument is the kernel itself).
template <auto kernel>
Status grouped_occupancy(size_t smem, int& blocks_per_sm, int& sms) {
  static int attribute_set = 0, blocks = 0;
  static size_t occupancy_smem = 0;
  if (!attribute_set) {
    if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kGroupedMaxSmem));
        e != cudaSuccess)
      return Status::from_cuda(e, "cudaFuncSetAttribute (matvec_grouped_kernel)");
    attribute_set = 1;
  }
  if (smem > occupancy_smem) {
    if (cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kGroupedThreads, smem);
        e != cudaSuccess)
      return Status::from_cuda(e, "cudaOccupancyMaxActiveBlocksPerMultiprocessor (matvec_grouped_kernel)");
    occupancy_smem = smem;
  }
  blocks_per_sm = max(1, blocks), sms = max(1, multiprocessor_count());
  return Status();
}

// Blocks a cluster of the interleaved q4_0 launches over int8 x, whose x then arrives by
// multicast copies (stage_q8_multicast): KILN_CUDA_X_MULTICAST=C (read once; 0 or 1: no
// clusters; at most 8); unset, 2 on sm_90 devices and none elsewhere (ptxas warns that
// multicast copies may run slower on later architectures, and only the H200 measured them).
// Measured on the H200 (docs/perf-notes.md, round 28), ms a Llama-3-8B step without -> with
// clusters of 2 (its o and down): Q4_0 1.6241 -> 1.5919; for the other formats, Q8_0 2.3595 ->
// 2.3951 (slower) and Q4_K_M 1.8464 -> 1.8470, so only q4_0's instances are built with it.
// Clusters of 4 were slower (Q4_0 1.8555: placed late beside the kernel before), and so were
// clusters for the two-stage launches (Qwen3-30B-A3B's o, one 200 KB block a multiprocessor:
// +30 us a step).
int x_multicast_cluster_setting();  // -1 where unset
inline int q4_0_x_multicast_cluster() {
  const int set = x_multicast_cluster_setting();
  if (set >= 0) return set;
  return compute_capability_major() == 9 ? 2 : 0;
}

// Where one-stage launches are taken: KILN_CUDA_GROUPED_ONE_STAGE=0 never, 2 for every
// launch that fits, else (1, the default) only for x of at most kOneStageMaxCols values.
// Measured (docs/perf-notes.md, round 8): Qwen3-30B-A3B's q/k/v over 2048 values gained
// (tg128 427.4 -> 436.2), Llama-3-8B's over 4096 lost (Q4_0 561.0 -> 547.7); round 12: Llama's
// q/k/v alone (rope epilogue, 3,072 tasks) lost too (Q4_0 1.686 -> 1.719 ms per step).
constexpr int64_t kOneStageMaxCols = 2048;
int grouped_one_stage_mode();

// Whether every part's weights lie in one matrix in the interleaved layout (decode_layout.h)
// and start at a whole tile of it (`slots` rows), and every part but the last has whole
// tiles: then the launch reads the layout.
inline bool interleaved_segments(const GroupedSegments& seg, int64_t total_rows, int64_t w_row_bytes, int slots) {
  int64_t first = 0;
  for (int i = 0; i < kMaxMatvecParts && first < total_rows; ++i) {
    const int64_t end = std::min<int64_t>(seg.end[i], total_rows);
    if (end < total_rows && (end - first) % slots != 0) return false;  // the next part would start inside a tile
    if (!interleaved_tiles(seg.w[i], size_t(end - first) * size_t(w_row_bytes), size_t(slots) * size_t(w_row_bytes)))
      return false;
    first = end;
  }
  return true;
}

// Weights in the interleaved layout that a launch cannot read so: refused, since the copy
// stages would read them as blocks.
inline Status refuse_interleaved(const GroupedSegments& seg, int64_t total_rows, int64_t w_row_bytes) {
  int64_t first = 0;
  for (int i = 0; i < kMaxMatvecParts && first < total_rows; ++i) {
    const int64_t end = std::min<int64_t>(seg.end[i], total_rows);
    if (is_interleaved(seg.w[i], size_t(end - first) * size_t(w_row_bytes)))
      return Status::invalid("matvec: part " + std::to_string(i) + "'s weights are in the interleaved layout, and "
                             "this launch cannot read them so (a part starting inside a tile of the layout, or of a "
                             "second format)");
    first = end;
  }
  return Status();
}

// The two-stage launch of `kernel` (launch_grouped's last case: where no other fits).
template <auto kernel, typename Fmt, typename FmtB>
Status launch_two_stage(const GroupedSegments& seg, int64_t total_rows, int64_t cols, int64_t w_row_bytes,
                        const SecondFormat& second, const Q8Vector& xq, const F32Input& in, const PairEpilogue& ep,
                        int64_t blocks_needed, cudaStream_t stream) {
  int blocks_per_sm = 0, sms = 0;
  const size_t smem = grouped_smem_bytes<Fmt, FmtB>(cols);
  if (Status s = grouped_occupancy<kernel>(smem, blocks_per_sm, sms); !s.ok()) return s;
  // Capped at the resident blocks, which loop over the tasks: a block per 8 tasks in waves
  // measured 20% slower (docs/perf-notes.md, round 12).
  const int grid = int(min64(blocks_needed, int64_t(blocks_per_sm) * sms));
  // Where twice the even share of blocks or more would fit a multiprocessor, shared memory that
  // caps them at the share (occupancy.h): else a launch of fewer blocks than multiprocessors
  // (Qwen3-30B-A3B's o: 128 blocks, 2 fit) can run on half of them. -18 us a step there
  // (docs/perf-notes.md, round 21), before the router sums (grouped_spread).
  const int share = (grid + sms - 1) / sms;
  const size_t launch_smem =
      grouped_spread(ep.kind) && blocks_per_sm >= 2 * share
          ? spread_shared_bytes(reinterpret_cast<const void*>(kernel), kGroupedThreads, smem, share, kGroupedMaxSmem)
          : smem;
  launch_chained(kernel, grid, kGroupedThreads, launch_smem, stream, seg, w_row_bytes, second, int(total_rows),
                 int(cols / kGroupElems), xq.qs, xq.ds, in, ep);
  return launch_status("matvec_grouped_kernel");
}

// `kernel` on as many blocks as the tasks need, at most its resident blocks (which loop over
// the tasks); `what` names the launch in errors.
template <auto kernel>
Status launch_resident(const char* what, size_t smem, int64_t blocks_needed, const GroupedSegments& seg,
                       int64_t total_rows, int64_t cols, int64_t w_row_bytes, const SecondFormat& second,
                       const Q8Vector& xq, const F32Input& in, const PairEpilogue& ep, cudaStream_t stream) {
  int blocks_per_sm = 0, sms = 0;
  if (Status s = grouped_occupancy<kernel>(smem, blocks_per_sm, sms); !s.ok()) return s;
  launch_chained(kernel, int(min64(blocks_needed, int64_t(blocks_per_sm) * sms)), kGroupedThreads, smem, stream, seg,
                 w_row_bytes, second, int(total_rows), int(cols / kGroupElems), xq.qs, xq.ds, in, ep);
  return launch_status(what);
}

template <typename Fmt, typename FmtB, int kLanesPerRow, bool kFromF32>
Status launch_grouped(const GroupedSegments& seg, int64_t total_rows, int64_t cols, int64_t w_row_bytes,
                      const SecondFormat& second, const Q8Vector& xq, const F32Input& in, const PairEpilogue& ep,
                      cudaStream_t stream) {
  constexpr int kSlots = kWarpSize / kLanesPerRow;
  const int64_t tasks = (total_rows + kSlots - 1) / kSlots;
  const int64_t blocks_needed = (tasks + kGroupedWarps - 1) / kGroupedWarps;
  int blocks_per_sm = 0, sms = 0;
  // The instances built with the router sums (matvec_pairs_fit keeps the epilogue to rows of
  // 16 lanes; one format over int8 x).
  constexpr bool kRouterSumsInstance = !kFromF32 && kLanesPerRow == 16 && std::is_same_v<Fmt, FmtB>;
  const bool router_sums = ep.kind == PairEpilogueKind::RouterSums;
  if (router_sums && !kRouterSumsInstance)
    return Status::invalid("matvec: the router sums take int8 x and rows of 16 lanes");
  if constexpr (grouped_interleavable<Fmt, FmtB>()) {
    const int64_t groups = cols / kGroupElems;
    if (w_row_bytes == groups * Fmt::kGroupBytes &&
        interleaved_segments(seg, total_rows, w_row_bytes, interleave_tile_rows(groups))) {
      const size_t smem = grouped_smem_bytes<Fmt, FmtB>(cols, 0);
      if constexpr (kRouterSumsInstance)
        if (router_sums)
          return launch_resident<matvec_grouped_kernel<Fmt, FmtB, kLanesPerRow, kFromF32, 0, false, true>>(
              "matvec_grouped_kernel (interleaved, router sums)", smem, blocks_needed, seg, total_rows, cols,
              w_row_bytes, second, xq, in, ep, stream);
      if constexpr (std::is_same_v<Fmt, GroupQ4_0> && std::is_same_v<FmtB, Fmt> && !kFromF32) {
        if (const int cluster = q4_0_x_multicast_cluster(); cluster > 1) {
          constexpr auto clustered = matvec_grouped_kernel<Fmt, FmtB, kLanesPerRow, kFromF32, 0, true>;
          int clustered_per_sm = 0;
          if (Status s = grouped_occupancy<clustered>(smem, clustered_per_sm, sms); !s.ok()) return s;
          const int clustered_grid = int(min64(blocks_needed, int64_t(clustered_per_sm) * sms));
          if (clustered_grid >= cluster) {
            launch_chained_in_clusters(clustered, dim3(clustered_grid - clustered_grid % cluster), dim3(cluster),
                                       kGroupedThreads, smem, stream, seg, w_row_bytes, second, int(total_rows),
                                       int(cols / kGroupElems), xq.qs, xq.ds, in, ep);
            return launch_status("matvec_grouped_kernel (interleaved, clusters)");
          }
        }
      }
      return launch_resident<matvec_grouped_kernel<Fmt, FmtB, kLanesPerRow, kFromF32, 0>>(
          "matvec_grouped_kernel (interleaved)", smem, blocks_needed, seg, total_rows, cols, w_row_bytes, second, xq,
          in, ep, stream);
    }
  }
  // E.g. a q4_K part in the layout in a two-format launch.
  if (Status s = refuse_interleaved(seg, total_rows, w_row_bytes); !s.ok()) return s;
  // Rows of one chunk are one item a task: where every task fits a warp of the one-stage
  // kernel's resident blocks, each warp has a single item.
  if constexpr (kLanesPerRow <= 16) {
    const int mode = grouped_one_stage_mode();
    const bool wanted = (mode == 2 || (mode == 1 && cols <= kOneStageMaxCols)) && !router_sums;
    if (cols / kGroupElems <= kLanesPerRow && wanted) {
      constexpr auto one_stage = matvec_grouped_kernel<Fmt, FmtB, kLanesPerRow, kFromF32, 1>;
      const size_t smem = grouped_smem_bytes<Fmt, FmtB>(cols, 1);
      if (Status s = grouped_occupancy<one_stage>(smem, blocks_per_sm, sms); !s.ok()) return s;
      if (blocks_needed <= int64_t(blocks_per_sm) * sms) {
        launch_chained(one_stage, int(blocks_needed), kGroupedThreads, smem, stream, seg, w_row_bytes, second,
                       int(total_rows), int(cols / kGroupElems), xq.qs, xq.ds, in, ep);
        return launch_status("matvec_grouped_kernel (one stage)");
      }
    }
  }
  if constexpr (kRouterSumsInstance)
    if (router_sums)
      return launch_two_stage<matvec_grouped_kernel<Fmt, FmtB, kLanesPerRow, kFromF32, kGroupedStages, false, true>,
                              Fmt, FmtB>(seg, total_rows, cols, w_row_bytes, second, xq, in, ep, blocks_needed, stream);
  return launch_two_stage<matvec_grouped_kernel<Fmt, FmtB, kLanesPerRow, kFromF32>, Fmt, FmtB>(
      seg, total_rows, cols, w_row_bytes, second, xq, in, ep, blocks_needed, stream);
}

// What every launch entry point checks of its pair epilogue: the shapes (matvec_pairs_fit)
// and, for the rotation, the angle table it reads.
inline bool pair_epilogue_launchable(int64_t cols, std::span<const MatvecPart> parts, const PairEpilogue& ep) {
  return matvec_pairs_fit(cols, parts, ep) && (ep.kind != PairEpilogueKind::RopeStore || ep.angles);
}

// Rows of at most 16 groups take two rows per task (16 lanes each), wider ones one; the pair
// epilogues need the former (matvec_pairs_fit).
constexpr int kMaxPairGroups = 16;

// Four rows a task (8 lanes each) for rows of at most 8 groups (a hidden size of 2048), where
// 16 lanes a row would leave half of them idle. The sums keep their bits: 16 lanes over 8
// groups add zeros first, then reduce as 8 do. Not with a pair epilogue (it pairs rows across
// 16 lanes). Measured (docs/perf-notes.md, round 11): Qwen3-30B-A3B tg128 446.9 -> 460.7;
// wider rows in 8 lanes lost 4-10% (Llama-3-8B's down, 56 groups: its 1,024 tasks of four rows
// leave more than half of the 2,112 resident warps without work). KILN_CUDA_GROUPED_EIGHT_LANES=0
// keeps 16.
bool grouped_eight_lanes_enabled();
inline bool takes_eight_lanes(int64_t groups, PairEpilogueKind epilogue) {
  return groups <= 8 && epilogue == PairEpilogueKind::None && grouped_eight_lanes_enabled();
}

// Gate and up (parts 0 and 1) over f32 x with the glu in the epilogue (matvec_grouped_glu.cu;
// the caller has checked matvec_pairs_fit and matvec_parts_f32_fit).
Status matvec_glu_f32_parts(GgmlType type, int64_t cols, int64_t w_row_bytes, std::span<const MatvecPart> parts,
                            const F32Input& in, const PairEpilogue& ep, cudaStream_t stream);

template <typename Fmt, bool kFromF32, typename FmtB = Fmt>
Status dispatch_grouped(const GroupedSegments& seg, int64_t total_rows, int64_t cols, int64_t w_row_bytes,
                        const Q8Vector& xq, const F32Input& in, const PairEpilogue& ep, cudaStream_t stream,
                        const SecondFormat& second = {}) {
  if (takes_eight_lanes(cols / kGroupElems, ep.kind))
    return launch_grouped<Fmt, FmtB, 8, kFromF32>(seg, total_rows, cols, w_row_bytes, second, xq, in, ep, stream);
  if (cols / kGroupElems <= kMaxPairGroups)
    return launch_grouped<Fmt, FmtB, 16, kFromF32>(seg, total_rows, cols, w_row_bytes, second, xq, in, ep, stream);
  return launch_grouped<Fmt, FmtB, 32, kFromF32>(seg, total_rows, cols, w_row_bytes, second, xq, in, ep, stream);
}
}  // namespace kiln::cuda::detail
