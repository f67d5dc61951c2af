// The MoE decode products over q4_K / q6_K experts in the row-tile layout (expert_tiles.h).
//
// A lane owns a group of 256 weights of one row at a time (an "item") and loads its words
// straight into registers: in the layout the lanes that take the same group of neighbouring
// rows read neighbouring 16-byte words. It dots them with the group's int8 activations,
// copied once per block into shared memory (padded per group as the dense grouped products
// lay them out: conflict-free), through those products' group dots
// (matvec_grouped_kernel.cuh's GroupQ4_K / GroupQ6_K), and loads its next item's words as
// this item's blocks are read. No staging of weights, so none of its copy issue, waits and
// bookkeeping: those made the staged MoE kernels instruction-bound (docs/perf-notes.md,
// round 25). (A first version that read the activations from global memory inside the dots
// was slower than the staged kernels: round 26.)
//
//   gate / up: items = a group of gate row r, then the same group of up row r (they share x);
//     8 lanes a row, 4 rows a warp; a block of 8 warps takes 32 rows of one (token, slot) pair,
//     so it also makes the int8 copy of its 32 values of h: no counters, no other launch.
//   down: a block takes one tile (8 rows) of one token; its items are the (slot j, group g)
//     pairs, each group g of the 8 rows of slot j's expert with slot j's int8 h, its dot
//     weighted by slot j's routing weight. Lane (q, s) of warp w takes row s of items
//     4 w + q, 4 w + q + 32, ...: the 8 lanes of an item read its words from 128 bytes in a
//     run. The sums over items meet in registers, across the 4 lanes of a row, then across
//     the warps in shared memory, in a fixed order (deterministic, no atomics).
#include <string>
#include <type_traits>

#include "backend/cuda/expert_tiles.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/matvec_grouped_kernel.cuh"
#include "backend/cuda/moe_route.cuh"
#include "backend/cuda/moe_tiled_decode.cuh"

namespace kiln::cuda::detail {
namespace {

constexpr int kGateUpWarps = 8;
constexpr int kGateUpLanes = 8;  // a row's lanes: 4 rows a warp
constexpr int kGateUpBlockRows = kGateUpWarps * kWarpSize / kGateUpLanes;  // 32: one int8 block of h
constexpr int kDownWarps = 8;
constexpr int kDownItemLanes = kWarpSize / kExpertTileRows;  // items a warp takes at once: 4

template <typename Fmt>
constexpr bool kQ6 = std::is_same_v<Fmt, GroupQ6_K>;

// Shared-memory bytes of the int8 activations of `count` groups (values, then scales, both
// padded per group as matvec_grouped_kernel lays them out).
constexpr size_t staged_q8_bytes(int64_t count) { return size_t(count) * (kXGroupBytes + kDsGroupBytes); }

// Copies the int8 activations of rows first .. first + rows - 1 of q (their `groups` groups of
// 256 each) into shared memory, group (r, g) at index r * groups + g; commits one copy group.
// Every thread of the block calls it.
__device__ __forceinline__ void stage_q8_groups(uint8_t* smem, const Q8Rows& q, int64_t first, int rows, int groups) {
  uint8_t* x_s = smem;
  uint8_t* ds_s = smem + size_t(rows) * groups * kXGroupBytes;
  const int n = rows * groups;
  for (int p = threadIdx.x; p < n * 16; p += blockDim.x) {  // 16 pieces of 16 values a group
    const int item = p / 16, r = item / groups, g = item % groups;
    cp_async_16(x_s + item * kXGroupBytes + (p % 16) * 16, q.qs + (first + r) * q.pitch + 256 * g + (p % 16) * 16);
  }
  for (int p = threadIdx.x; p < n * 4; p += blockDim.x) {  // 4 pieces of 2 scale pairs a group
    const int item = p / 4, r = item / groups, g = item % groups;
    cp_async_16(ds_s + item * kDsGroupBytes + (p % 4) * 16, q.ds + (first + r) * q.ds_pitch + 8 * g + 2 * (p % 4));
  }
  cp_async_commit();
}

__device__ __forceinline__ const int4* staged_x(const uint8_t* smem, int item) {
  return reinterpret_cast<const int4*>(smem + item * kXGroupBytes);
}
__device__ __forceinline__ const float4* staged_ds(const uint8_t* smem, int n_items, int item) {
  return reinterpret_cast<const float4*>(smem + size_t(n_items) * kXGroupBytes + item * kDsGroupBytes);
}

// Word k of group `group` of the row in slot `tile_slot` of the tile at `tile` (its first byte)
// at first + k * step (16-byte words); a q6_K group's d at d.
template <typename Fmt>
__device__ __forceinline__ WordAddress tiled_group(const uint8_t* tile, int group, int tile_slot) {
  const uint8_t* region = tile + expert_tile_group_start(group, Fmt::kGroupBytes);
  constexpr int kStep = (expert_tile_word_in_group(1, 0) - expert_tile_word_in_group(0, 0)) / 16;
  WordAddress at{reinterpret_cast<const uint4*>(region + expert_tile_word_in_group(0, tile_slot)), kStep};
  if constexpr (kQ6<Fmt>) at.d = reinterpret_cast<const unsigned short*>(region + expert_tile_q6_k_d_in_group(tile_slot));
  return at;
}

// The first byte of the tile holding row `row` of the stacked matrix.
template <typename Fmt>
__device__ __forceinline__ const uint8_t* tile_of(const void* data, int64_t row, int groups) {
  return static_cast<const uint8_t*>(data) + expert_tile_start(row, groups, Fmt::kGroupBytes);
}

// The same pointer, which the compiler cannot see to be the same: up's dot then reloads x
// instead of keeping gate's 80 registers of x live across both dots (which spilled at the 128
// registers of two resident blocks).
template <typename T>
__device__ __forceinline__ const T* opaque(const T* p) {
  asm volatile("" : "+l"(p));
  return p;
}

// The folded front (moe.h's MoeFoldedFront). Without router or selection bias the logits
// sums[e] / rms(x) rank as the router sums themselves (1 / rms > 0; rounding may make two equal,
// never swap them), so the slots are ranked from the sums alone: the gate / up blocks start on
// their weights before x is read, and the down blocks repeat the ranking before their wait.
// Every thread of the block calls it; sums_s (kRouterSumsMaxExperts floats: the sums, rounded
// to float) and slot_id / slot_score are complete when it returns.
constexpr int kFoldedPerLane = kRouterSumsMaxExperts / kWarpSize;
__device__ __forceinline__ void rank_by_sums(const MoeFfnArgs& a, float* sums_s, int* slot_id, float* slot_score) {
  static_assert(kRouterSumsMaxExperts <= kGroupedThreads / 2, "two threads an expert");
  if (threadIdx.x < a.n_expert) sums_s[threadIdx.x] = float(__ldcg(a.front.sums + threadIdx.x));
  route_detail::rank_chosen(int(a.n_expert), int(a.n_used), sums_s, sums_s, slot_id, slot_score);
}

// Slot j's expert of the ranking (-1: none, as expert_of).
__device__ __forceinline__ int folded_expert(const MoeFfnArgs& a, const int* slot_id, int64_t j) {
  const int e = slot_id[j];
  return e >= 0 && e < a.n_expert ? e : -1;
}

// The routing's weights from the logits sums_s[e] * inv (inv = 1 / rms(x); sums_s as
// rank_by_sums left it) and the ranked slots, with the ids, where the down kernel reads them
// (route.ids / weights). Warp 0 of one block.
__device__ __forceinline__ void write_folded_route(const MoeFfnArgs& a, const float* sums_s, const int* slot_id,
                                                   float inv) {
  __shared__ float score_s[kRouterSumsMaxExperts];
  const MoeRouteArgs& r = a.front.route;
  const int lane = threadIdx.x % kWarpSize;
  float score[kFoldedPerLane], choose[kFoldedPerLane];
  route_detail::route_scores<kFoldedPerLane>(
      r, [&](int e) { return __fmul_rn(sums_s[e], inv); }, score, choose);
#pragma unroll
  for (int i = 0; i < kFoldedPerLane; ++i) score_s[lane + kWarpSize * i] = score[i];
  __syncwarp();
  const int id = lane < r.n_used ? folded_expert(a, slot_id, lane) : 0;
  route_detail::finish_route(r, 0, id, id >= 0 ? score_s[id] : moe_nan());
}

// Grid (n_ff / 32, pairs), two resident blocks of 8 warps a multiprocessor (128 registers).
// Lane (slot, li) of warp w takes row 4 w + slot of the block, its groups li, li + 8, ...; item
// 2 k is gate's group li + 8 k, item 2 k + 1 up's, in one set of registers: up's words load
// while gate's are dotted. A block takes 32 rows (one int8 block of h, which it quantizes
// itself: no counters). Measured against 16-row blocks of 4 warps with gate's and up's groups
// in registers at once (168 registers, 3 blocks a multiprocessor): 1.6696 against 1.7177 ms a
// Qwen3-30B-A3B step. Dynamic shared memory: x's int8 copy (staged_q8_bytes(groups)).
// kFolded: the front folded in (rank_by_sums; one token), x normed and quantized here, not
// read from xq.
template <typename Fmt, bool kFolded>
__global__ void __launch_bounds__(kGateUpWarps * kWarpSize, 2)
    moe_tiled_gate_up_kernel(MoeFfnArgs a, Q8Rows xq, float* h, Q8Rows hq) {
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ float h_block[kGateUpBlockRows];
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int slot = lane / kGateUpLanes, li = lane % kGateUpLanes;
  const int p = blockIdx.y, t = p / int(a.n_used), j = p - t * int(a.n_used);  // pairs < 65536
  const int r = warp * (kWarpSize / kGateUpLanes) + slot;  // the lane's row in the block
  const int64_t block_row = int64_t(blockIdx.x) * kGateUpBlockRows;
  int e;
  F32Input in;  // folded: x, normed and quantized here
  float4 norm_w[kFolded ? kPairF32Steps : 1];
  __shared__ float sums_s[kFolded ? kRouterSumsMaxExperts : 1];
  __shared__ int slot_id[kFolded ? route_detail::kMaxUsed : 1];
  __shared__ float slot_score[kFolded ? route_detail::kMaxUsed : 1];
  if constexpr (kFolded) {
    in.x = a.front.x, in.norm_weight = a.front.norm_weight, in.eps = a.front.eps;
    load_norm_weights<kPairF32Steps>(in, int(a.n_embd), norm_w);  // no kernel of the step writes them
    begin_chained_kernel();  // the router sums and x, from the kernel before
    rank_by_sums(a, sums_s, slot_id, slot_score);
    e = folded_expert(a, slot_id, j);
  } else {
    begin_chained_kernel();  // the ids and x's int8 copy, from the kernels before
    e = expert_of(a, t, j);
  }
  trace_stamp(1, uint32_t(e));  // trace builds: the id read
  const int groups = int(a.n_embd / kExpertTileGroupWeights);
  const int pairs = (groups - li + kGateUpLanes - 1) / kGateUpLanes;  // (gate, up) item pairs of this lane
  const int64_t row = int64_t(e < 0 ? 0 : e) * a.n_ff + block_row + r;  // in the stacked matrix
  const uint8_t* gate_tile = tile_of<Fmt>(a.gate.data, row, groups);
  const int64_t up_from_gate = static_cast<const uint8_t*>(a.up.data) - static_cast<const uint8_t*>(a.gate.data);
  auto address = [&](int item) {
    return item < 2 * pairs ? tiled_group<Fmt>(gate_tile + (item % 2 ? up_from_gate : 0),
                                               li + (item / 2) * kGateUpLanes, r % kExpertTileRows)
                            : WordAddress{};
  };
  uint32_t w[group_words<Fmt>()];
  load_words<Fmt>(w, address(0));
  if constexpr (kFolded) {  // x normed and quantized while the first weights arrive
    const float inv = quantize_input_to_shared<kPairF32Steps>(in, int(a.n_embd), smem,
                                                              smem + groups * kXGroupBytes, norm_w);
    if (blockIdx.x == 0 && j == 0 && warp == 0) write_folded_route(a, sums_s, slot_id, inv);
  } else {
    stage_q8_groups(smem, xq, t, 1, groups);
    cp_async_wait<0>();
  }
  __syncthreads();
  trace_stamp(2, w[0]);  // x staged, the first weights in
  float acc_gate = 0.0f, acc_up = 0.0f;
  for (int k = 0; k < pairs; ++k) {
    const int group = li + k * kGateUpLanes;
    const int4* xg = staged_x(smem, group);
    const float4* dg = staged_ds(smem, groups, group);
    accumulate_group_words<Fmt, true>(w, xg, dg, acc_gate, address(2 * k + 1));
    accumulate_group_words<Fmt, true>(w, opaque(xg), opaque(dg), acc_up, address(2 * k + 2));
  }
#pragma unroll
  for (int off = kGateUpLanes / 2; off > 0; off >>= 1) {
    acc_gate += __shfl_xor_sync(kFullMask, acc_gate, off);
    acc_up += __shfl_xor_sync(kFullMask, acc_up, off);
  }
  if (li == 0) {
    const int64_t out_row = block_row + r;
    const float v = e < 0 ? moe_nan()
                          : glu_of(a.act, acc_gate + bias_at(a.gate, e, out_row), acc_up + bias_at(a.up, e, out_row),
                                   a.alpha, a.limit);
    h[p * a.n_ff + out_row] = v;
    h_block[r] = v;
  }
  trace_stamp(3);  // thread 0's row of h written
  if (!hq.qs) return;
  __syncthreads();
  if (warp == 0)
    quantize_block32(h_block[lane], const_cast<int8_t*>(hq.qs) + p * hq.pitch + block_row + lane,
                     const_cast<float2*>(hq.ds) + p * hq.ds_pitch + blockIdx.x);
}

// Resident down blocks a multiprocessor the register bound asks for. q4_K's down compiles at
// 80 registers without spills at three, which leaves room beside two of its blocks for a block
// of the next layer's q/k/v product (80 registers), so that block loads its weights before its
// wait (Qwen3-30B-A3B: -14 us a step against two). q6_K's would spill at three: two.
template <typename Fmt>
constexpr int kDownMinBlocks = std::is_same_v<Fmt, GroupQ4_K> ? 3 : 2;

// Grid (n_embd / 8, tokens), kDownMinBlocks<Fmt> resident blocks a multiprocessor. Lane (q, s) =
// (lane / 8, lane % 8) of warp w takes row 8 x + s, items 4 w + q + 32 m (item i: slot i /
// groups, group i % groups). Dynamic shared memory: h's int8 copy for the token's slots
// (staged_q8_bytes(n_used * groups)).
// kFolded: the front folded in: the slots ranked from the router sums before the wait, as
// gate / up ranked them (rank_by_sums); its ids and weights, read after the wait, for the end.
template <typename Fmt, bool kFolded>
__global__ void __launch_bounds__(kDownWarps * kWarpSize, kDownMinBlocks<Fmt>)
    moe_tiled_down_kernel(MoeFfnArgs a, Q8Rows hq) {
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ float partial[kDownWarps][kExpertTileRows];
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int s = lane % kExpertTileRows, q = lane / kExpertTileRows;
  const int64_t tile_row = int64_t(blockIdx.x) * kExpertTileRows;
  const int64_t t = blockIdx.y;
  const int groups = int(a.n_ff / kExpertTileGroupWeights);
  const int items = int(a.n_used) * groups;
  const int first = warp * kDownItemLanes + q;
  constexpr int kStep = kDownWarps * kDownItemLanes;
  __shared__ float sums_s[kFolded ? kRouterSumsMaxExperts : 1];
  __shared__ int slot_id[kFolded ? route_detail::kMaxUsed : 1];
  __shared__ float slot_score[kFolded ? route_detail::kMaxUsed : 1];
  auto address = [&](int i) {
    if (i >= items) return WordAddress{};
    const int j = i / groups, e = kFolded ? folded_expert(a, slot_id, j) : expert_of(a, t, j);
    return tiled_group<Fmt>(tile_of<Fmt>(a.down.data, int64_t(e < 0 ? 0 : e) * a.n_embd + tile_row, groups),
                            i - j * groups, s);
  };
  // The ids were written two kernels back (folded: the sums they are ranked from): read before
  // the wait, with the first words.
  uint32_t g[group_words<Fmt>()];
  if constexpr (kFolded) rank_by_sums(a, sums_s, slot_id, slot_score);
  load_words<Fmt>(g, address(first));
  begin_chained_kernel();
  stage_q8_groups(smem, hq, t * a.n_used, int(a.n_used), groups);
  const float old = a.residual && threadIdx.x < kExpertTileRows ? a.residual[t * a.residual_stride + tile_row + threadIdx.x]
                                                                 : 0.0f;
  cp_async_wait<0>();
  __syncthreads();
  trace_stamp(2, g[0]);  // h staged, the first weights in
  float acc = 0.0f;
  for (int i = first; i < items; i += kStep) {
    const int j = i / groups;
    float dot = 0.0f;
    accumulate_group_words<Fmt, true>(g, staged_x(smem, i), staged_ds(smem, items, i), dot, address(i + kStep));
    acc = fmaf(a.weights[t * a.weights_stride + j], dot, acc);
  }
  acc += __shfl_xor_sync(kFullMask, acc, 8);
  acc += __shfl_xor_sync(kFullMask, acc, 16);
  if (q == 0) partial[warp][s] = acc;
  __syncthreads();
  if (threadIdx.x >= kExpertTileRows) return;
  float sum = partial[0][threadIdx.x];
#pragma unroll
  for (int w = 1; w < kDownWarps; ++w) sum += partial[w][threadIdx.x];
  store_down_row(a, t, tile_row + threadIdx.x, sum, old);
  trace_stamp(3);  // thread 0's row stored
}

template <typename F>
Status visit_tiled_format(GgmlType type, const char* what, F&& f) {
  if (type == GgmlType::Q4_K) return f(GroupQ4_K{});
  if (type == GgmlType::Q6_K) return f(GroupQ6_K{});
  return Status::invalid(std::string("moe_ffn: ") + what + " experts of type " + std::string(type_name(type)) +
                         " cannot be in the row-tile layout (q4_K, q6_K)");
}

// Raises a kernel's dynamic shared memory limit to `bytes` the first time a launch needs more
// than it was last raised to. (Not only past 48 KB: without the raise, the kernel's static
// shared memory counts against those 48 KB too.) The limit stays raised.
template <auto kernel>
Status allow_shared(size_t bytes, const char* name) {
  static size_t allowed = 0;
  if (bytes <= allowed) return Status();
  if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
      e != cudaSuccess)
    return Status::invalid(std::string("moe_ffn: ") + name + " needs " + std::to_string(bytes) +
                           " bytes of shared memory: " + cudaGetErrorString(e));
  allowed = bytes;
  return Status();
}

// One launch of `kernel` (a gate / up or down instance) with `smem` bytes of shared memory.
template <auto kernel, typename... Args>
Status launch_tiled(const char* name, dim3 grid, size_t smem, cudaStream_t stream, const Args&... args) {
  static_assert(kGateUpWarps * kWarpSize == kGroupedThreads && kDownWarps * kWarpSize == kGroupedThreads,
                "both kernels' blocks are kGroupedThreads threads (quantize_input_to_shared's, rank_by_sums')");
  if (Status s = allow_shared<kernel>(smem, name); !s.ok()) return s;
  const cudaError_t e = launch_chained(kernel, grid, dim3(kGroupedThreads), smem, stream, args...);
  return e != cudaSuccess ? Status::from_cuda(e, name) : launch_status(name);
}

}  // namespace

Status launch_tiled_gate_up(const MoeFfnArgs& a, const Q8Rows& xq, float* h, const Q8Rows& hq, cudaStream_t stream) {
  if (!expert_tiles_fit(a.gate.type, a.n_ff, a.n_embd))
    return Status::invalid("moe_ffn: tiled gate / up experts of " + std::to_string(a.n_ff) + " rows of " +
                           std::to_string(a.n_embd) + " do not fit the row-tile layout");
  const dim3 grid(unsigned(a.n_ff / kGateUpBlockRows), unsigned(a.n_tokens * a.n_used));
  const size_t smem = staged_q8_bytes(a.n_embd / kExpertTileGroupWeights);
  return visit_tiled_format(a.gate.type, "gate / up", [&](auto fmt) {
    using Fmt = decltype(fmt);
    constexpr const char* kName = "moe_tiled_gate_up_kernel";
    return a.front.sums ? launch_tiled<moe_tiled_gate_up_kernel<Fmt, true>>(kName, grid, smem, stream, a, xq, h, hq)
                        : launch_tiled<moe_tiled_gate_up_kernel<Fmt, false>>(kName, grid, smem, stream, a, xq, h, hq);
  });
}

Status launch_tiled_down(const MoeFfnArgs& a, const Q8Rows& hq, cudaStream_t stream) {
  if (!expert_tiles_fit(a.down.type, a.n_embd, a.n_ff))
    return Status::invalid("moe_ffn: tiled down experts of " + std::to_string(a.n_embd) + " rows of " +
                           std::to_string(a.n_ff) + " do not fit the row-tile layout");
  const dim3 grid(unsigned(a.n_embd / kExpertTileRows), unsigned(a.n_tokens));
  const size_t smem = staged_q8_bytes(a.n_used * (a.n_ff / kExpertTileGroupWeights));
  return visit_tiled_format(a.down.type, "down", [&](auto fmt) {
    using Fmt = decltype(fmt);
    constexpr const char* kName = "moe_tiled_down_kernel";
    return a.front.sums ? launch_tiled<moe_tiled_down_kernel<Fmt, true>>(kName, grid, smem, stream, a, hq)
                        : launch_tiled<moe_tiled_down_kernel<Fmt, false>>(kName, grid, smem, stream, a, hq);
  });
}

bool folded_front_fits(const MoeFfnArgs& a) {
  const MoeFoldedFront& f = a.front;
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return f.sums && f.x && f.norm_weight && aligned(f.x) && aligned(f.norm_weight) && a.n_tokens == 1 &&
         a.gate.row_tiles && a.up.row_tiles && a.down.row_tiles && a.n_embd % kExpertTileGroupWeights == 0 &&
         a.n_embd <= int64_t(kPairF32Steps) * kGroupedThreads * 4 && a.n_expert <= kRouterSumsMaxExperts &&
         f.route.n_expert == a.n_expert && f.route.n_used == a.n_used && f.route.ids == a.ids &&
         f.route.weights == a.weights && !f.router_bias && !f.route.selection_bias &&
         route_detail::route_refusal(f.route).empty();
}

}  // namespace kiln::cuda::detail
