// MoE for many tokens: grouped expert GEMMs on the tensor cores (see moe.h).
//
//   1. sort: one block counts the (token, slot) pairs per expert, lays the experts' lists
//      end to end (sorted position -> pair, pair -> sorted position) and cuts each list into
//      tiles of kTileTokens (expert, first position, count). The order of pairs inside one
//      expert's list is whatever the atomics give, but every pair's results are computed
//      and stored on their own, so the output does not depend on it.
//   2. gate/up + GLU: one launch; block (x, y) takes rows x*64.. of gate and of up of tile
//      y's expert (blocks past the last tile leave at once: the grid is sized for the worst
//      case, so nothing is read back to the host) and its tokens, over K = n_embd: the raw
//      weight bytes of 256 columns (one K-quant super-block, 8 blocks of 32) per row are
//      copied into shared memory with 16-byte asynchronous copies one chunk ahead, then
//      decoded 32 columns at a time into a bf16 tile; activations are gathered by token
//      and rounded to bf16 (fetched one step ahead); bf16 WMMA with f32 accumulators; the
//      epilogue applies the GLU and stores h (bf16) at the pairs' sorted positions.
//   3. down: one launch over (row tiles of n_embd, tiles), K = n_ff, h as the bf16 operand;
//      stores y (f32, bias added) at the sorted positions.
//   4. combine: out[t] = sum_j weights[t][j] * y[pos(t, j)], slots in order (and
//      residual[t] += out[t] when a residual is given).
// Steps 2 and 3 run one of the tile engines of moe_gemm_tile.cuh (v4, v6, v7) or
// moe_gemm_v8.cuh (v8: q4_K and q6_K weights, 256 rows per block, activations as bf16 copied
// with the weights; x is rounded to bf16 by one small launch first); MoeFfnArgs::gemm_version
// picks one. The description above is v4's.
#include <string>

#include "backend/cuda/env_switch.h"
#include "backend/cuda/moe.h"
#include "backend/cuda/moe_gemm_v8.cuh"

namespace kiln::cuda {
namespace detail {

struct MoeTile {
  int expert, start, count, pad;
};

struct Routing {
  int32_t* n_tiles;
  MoeTile* tiles;
  int32_t* sorted_pair;  // [P]
  int32_t* pos_of_pair;  // [P], -1 for an id out of range
};

__device__ __forceinline__ int routed_expert(const MoeFfnArgs& a, int64_t p) {
  const int e = a.ids[(p / a.n_used) * a.ids_stride + p % a.n_used];
  return e >= 0 && e < a.n_expert ? e : -1;
}

// One block; shared memory: two ints per expert.
__global__ void __launch_bounds__(1024) moe_sort_kernel(MoeFfnArgs a, Routing r) {
  extern __shared__ int counts[];
  int* cursor = counts + a.n_expert;
  const int64_t P = a.n_tokens * a.n_used;
  for (int64_t e = threadIdx.x; e < a.n_expert; e += blockDim.x) counts[e] = 0;
  __syncthreads();
  for (int64_t p = threadIdx.x; p < P; p += blockDim.x) {
    const int e = routed_expert(a, p);
    if (e >= 0) atomicAdd(&counts[e], 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int offset = 0, n = 0;
    for (int e = 0; e < a.n_expert; ++e) {
      cursor[e] = offset;
      for (int s = 0; s < counts[e]; s += kTileTokens) r.tiles[n++] = MoeTile{e, offset + s, min(kTileTokens, counts[e] - s), 0};
      offset += counts[e];
    }
    *r.n_tiles = n;
  }
  __syncthreads();
  for (int64_t p = threadIdx.x; p < P; p += blockDim.x) {
    const int e = routed_expert(a, p);
    int pos = -1;
    if (e >= 0) {
      pos = atomicAdd(&cursor[e], 1);
      r.sorted_pair[pos] = int32_t(p);
    }
    r.pos_of_pair[p] = pos;
  }
}

__device__ __forceinline__ const uint8_t* matrix_row(const ExpertMatrix& m, int expert, int64_t row) {
  return static_cast<const uint8_t*>(m.data) + int64_t(expert) * m.expert_bytes + row * m.row_bytes;
}

// Activations of gate/up: f32 rows of x gathered by token, rounded to bf16. Thread ->
// tokens tid / 8 and tid / 8 + 32, 4 columns at (tid % 8) * 4.
struct GatheredX {
  const float* rows[2];
  bool vector;
  float4 v[2];
  __device__ void load(int64_t sub) {
    const int col = (threadIdx.x % 8) * 4;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      v[i] = make_float4(0, 0, 0, 0);
      if (rows[i]) {
        const float* src = rows[i] + sub * kTileK + col;
        v[i] = vector ? __ldg(reinterpret_cast<const float4*>(src)) : make_float4(src[0], src[1], src[2], src[3]);
      }
    }
  }
  __device__ void store(uint16_t* b_tile, int pitch) const {
    const int tok = threadIdx.x / 8, col = (threadIdx.x % 8) * 4;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const uint2 packed = make_uint2(pack_bf16x2(v[i].x, v[i].y), pack_bf16x2(v[i].z, v[i].w));
      *reinterpret_cast<uint2*>(b_tile + (tok + 32 * i) * pitch + col) = packed;
    }
  }
};

// Activations of down: h (bf16) at the tile's sorted positions. Thread -> token tid / 4,
// 8 columns at (tid % 4) * 8.
struct SortedH {
  const Bf16* row;
  uint4 v;
  __device__ void load(int64_t sub) {
    v = row ? __ldg(reinterpret_cast<const uint4*>(row + sub * kTileK + (threadIdx.x % 4) * 8)) : make_uint4(0, 0, 0, 0);
  }
  __device__ void store(uint16_t* b_tile, int pitch) const {
    *reinterpret_cast<uint4*>(b_tile + (threadIdx.x / 4) * pitch + (threadIdx.x % 4) * 8) = v;
  }
};

// The block's product of its weight rows with its first n_tokens activation rows, left in
// shared memory as c[token * kLdC + row] with every thread past a barrier: tile engine v4,
// v6 or v7 (v6 with unpadded B rows; moe_gemm_tile.cuh).
template <typename W, int V, typename Act>
__device__ __forceinline__ float* tile_product(uint8_t* smem, const uint8_t* const* rows, int64_t K, int n_tokens,
                                               Act& act) {
  if constexpr (V >= 6) {
    return gemm_tile_v6<W, V == 7 ? kTileK : kLdK>(smem, rows, K, n_tokens, act);
  } else {
    AccFrag acc[2][2];
    zero_acc(acc);
    gemm_tile<W>(smem, rows, K, act, acc);
    float* c = reinterpret_cast<float*>(smem);
    store_acc(c, acc);
    __syncthreads();
    return c;
  }
}

template <typename W, int V>
struct TileSmem {
  static constexpr int kBytes = V >= 6 ? GemmLayoutV6<W, V == 7 ? kTileK : kLdK>::kTotal : GemmLayout<W>::kTotal;
};

// Rows x*64 .. of gate (tile rows 0..63) and up (64..127) of the tile's expert.
template <typename W, int V>
__global__ void __launch_bounds__(kGemmThreads, kGemmBlocksPerSm) moe_gate_up_gemm_kernel(MoeFfnArgs a, Routing rt, Bf16* h) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ const uint8_t* rows[kTileRows];
  if (int(blockIdx.y) >= *rt.n_tiles) return;
  const MoeTile tile = rt.tiles[blockIdx.y];
  const int64_t row0 = int64_t(blockIdx.x) * (kTileRows / 2);
  const int tid = threadIdx.x;
  if (tid < kTileRows) {
    const int64_t row = row0 + tid % 64;
    rows[tid] = row < a.n_ff ? matrix_row(tid < 64 ? a.gate : a.up, tile.expert, row) : nullptr;
  }
  GatheredX act;
  act.vector = a.x_stride % 4 == 0 && reinterpret_cast<uintptr_t>(a.x) % 16 == 0;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int n = tid / 8 + 32 * i;
    act.rows[i] = n < tile.count ? a.x + int64_t(rt.sorted_pair[tile.start + n] / a.n_used) * a.x_stride : nullptr;
  }
  __syncthreads();
  const float* c = tile_product<W, V>(smem, rows, a.n_embd, tile.count, act);
  for (int idx = tid; idx < kTileTokens * 64; idx += kGemmThreads) {
    const int n = idx / 64, r = idx % 64;
    const int64_t row = row0 + r;
    if (n >= tile.count || row >= a.n_ff) continue;
    float g = c[n * kLdC + r], u = c[n * kLdC + r + 64];
    if (a.gate.bias) g += a.gate.bias[int64_t(tile.expert) * a.gate.bias_stride + row];
    if (a.up.bias) u += a.up.bias[int64_t(tile.expert) * a.up.bias_stride + row];
    h[int64_t(tile.start + n) * a.n_ff + row] = __float2bfloat16_rn(glu_of(a.act, g, u, a.alpha, a.limit));
  }
}

// Rows x*128 .. of down of the tile's expert; y (f32, bias added) at the sorted positions.
template <typename W, int V>
__global__ void __launch_bounds__(kGemmThreads, kGemmBlocksPerSm) moe_down_gemm_kernel(MoeFfnArgs a, Routing rt, const Bf16* h,
                                                                     float* y) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ const uint8_t* rows[kTileRows];
  if (int(blockIdx.y) >= *rt.n_tiles) return;
  const MoeTile tile = rt.tiles[blockIdx.y];
  const int64_t row0 = int64_t(blockIdx.x) * kTileRows;
  const int tid = threadIdx.x;
  if (tid < kTileRows) rows[tid] = row0 + tid < a.n_embd ? matrix_row(a.down, tile.expert, row0 + tid) : nullptr;
  SortedH act;
  act.row = tid / 4 < tile.count ? h + int64_t(tile.start + tid / 4) * a.n_ff : nullptr;
  __syncthreads();
  const float* c = tile_product<W, V>(smem, rows, a.n_ff, tile.count, act);
  for (int idx = tid; idx < kTileTokens * kTileRows; idx += kGemmThreads) {
    const int n = idx / kTileRows, r = idx % kTileRows;
    const int64_t row = row0 + r;
    if (n >= tile.count || row >= a.n_embd) continue;
    float v = c[n * kLdC + r];
    if (a.down.bias) v += a.down.bias[int64_t(tile.expert) * a.down.bias_stride + row];
    y[int64_t(tile.start + n) * a.n_embd + row] = v;
  }
}

// ---- tile engine v8 (moe_gemm_v8.cuh): q4_K and q6_K weights ------------------------------

// xb[t][i] = bf16(x[t][i]): gate/up's activations, rounded once per token (v7 rounds them in
// every tile that uses the token); grid (ceil(n_embd / 256), tokens).
__global__ void __launch_bounds__(256) moe_x_to_bf16_kernel(MoeFfnArgs a, Bf16* xb) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, t = blockIdx.y;
  if (i < a.n_embd) xb[t * a.n_embd + i] = __float2bfloat16_rn(a.x[t * a.x_stride + i]);
}

// The first row of row's tile in the row-tile layout (expert_tiles.h): where gemm_tile_v8 finds it.
__device__ __forceinline__ int64_t tiled_row_base(int64_t row) { return row / kExpertTileRows * kExpertTileRows; }

// Rows x*128 .. of gate (tile rows 0..127) and up (128..255) of the tile's expert, tokens from xb.
template <typename W, int kStages>
__global__ void __launch_bounds__(kV8Threads, 1) moe_gate_up_v8_kernel(MoeFfnArgs a, Routing rt, const Bf16* xb, Bf16* h) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ const uint8_t* rows[kV8Rows];
  __shared__ const Bf16* act[kTileTokens];
  if (int(blockIdx.y) >= *rt.n_tiles) return;
  const MoeTile tile = rt.tiles[blockIdx.y];
  constexpr int kHalf = kV8Rows / 2;
  const int64_t row0 = int64_t(blockIdx.x) * kHalf;
  const int tid = threadIdx.x;
  if (tid < kV8Rows) {
    const int64_t row = row0 + tid % kHalf;
    const ExpertMatrix& m = tid < kHalf ? a.gate : a.up;
    rows[tid] = row < a.n_ff ? matrix_row(m, tile.expert, m.row_tiles ? tiled_row_base(row) : row) : nullptr;
  } else if (tid - kV8Rows < kTileTokens) {
    const int n = tid - kV8Rows;
    act[n] = n < tile.count ? xb + int64_t(rt.sorted_pair[tile.start + n] / a.n_used) * a.n_embd : nullptr;
  }
  __syncthreads();
  const float* c = gemm_tile_v8<W, kStages>(smem, rows, act, a.n_embd, tile.count, a.gate.row_tiles);
  for (int idx = tid; idx < kTileTokens * kHalf; idx += kV8Threads) {
    const int n = idx / kHalf, r = idx % kHalf;
    const int64_t row = row0 + r;
    if (n >= tile.count || row >= a.n_ff) continue;
    float g = c[n * kV8LdC + r], u = c[n * kV8LdC + r + kHalf];
    if (a.gate.bias) g += a.gate.bias[int64_t(tile.expert) * a.gate.bias_stride + row];
    if (a.up.bias) u += a.up.bias[int64_t(tile.expert) * a.up.bias_stride + row];
    h[int64_t(tile.start + n) * a.n_ff + row] = __float2bfloat16_rn(glu_of(a.act, g, u, a.alpha, a.limit));
  }
}

// Rows x*256 .. of down of the tile's expert; y (f32, bias added) at the sorted positions.
template <typename W, int kStages>
__global__ void __launch_bounds__(kV8Threads, 1) moe_down_v8_kernel(MoeFfnArgs a, Routing rt, const Bf16* h, float* y) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ const uint8_t* rows[kV8Rows];
  __shared__ const Bf16* act[kTileTokens];
  if (int(blockIdx.y) >= *rt.n_tiles) return;
  const MoeTile tile = rt.tiles[blockIdx.y];
  const int64_t row0 = int64_t(blockIdx.x) * kV8Rows;
  const int tid = threadIdx.x;
  if (tid < kV8Rows) {
    const int64_t row = row0 + tid;
    rows[tid] = row < a.n_embd ? matrix_row(a.down, tile.expert, a.down.row_tiles ? tiled_row_base(row) : row) : nullptr;
  } else if (tid - kV8Rows < kTileTokens) {
    const int n = tid - kV8Rows;
    act[n] = n < tile.count ? h + int64_t(tile.start + n) * a.n_ff : nullptr;
  }
  __syncthreads();
  const float* c = gemm_tile_v8<W, kStages>(smem, rows, act, a.n_ff, tile.count, a.down.row_tiles);
  for (int idx = tid; idx < kTileTokens * kV8Rows; idx += kV8Threads) {
    const int n = idx / kV8Rows, r = idx % kV8Rows;
    const int64_t row = row0 + r;
    if (n >= tile.count || row >= a.n_embd) continue;
    float v = c[n * kV8LdC + r];
    if (a.down.bias) v += a.down.bias[int64_t(tile.expert) * a.down.bias_stride + row];
    y[int64_t(tile.start + n) * a.n_embd + row] = v;
  }
}

// out[t][i] = sum_j weights[t][j] * y[pos(t, j)][i]; grid (ceil(n_embd / 256), tokens).
__global__ void __launch_bounds__(256) moe_combine_sorted_kernel(MoeFfnArgs a, const int32_t* pos_of_pair,
                                                                 const float* y) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, t = blockIdx.y;
  if (i >= a.n_embd) return;
  float sum = 0.0f;
  for (int64_t j = 0; j < a.n_used; ++j) {
    const int pos = pos_of_pair[t * a.n_used + j];
    const float v = pos < 0 ? moe_nan() : y[int64_t(pos) * a.n_embd + i];
    sum = fmaf(a.weights[t * a.weights_stride + j], v, sum);
  }
  a.out[t * a.out_stride + i] = sum;
  if (a.residual) a.residual[t * a.residual_stride + i] += sum;  // the residual stream's add, folded in
}

// ---- host side -------------------------------------------------------------------------------

constexpr size_t kGemmAlign = 256;
size_t gemm_align(size_t v) { return (v + kGemmAlign - 1) / kGemmAlign * kGemmAlign; }

int64_t max_tiles(const MoeFfnArgs& a) { return (a.n_tokens * a.n_used + kTileTokens - 1) / kTileTokens + a.n_expert; }

struct GemmScratch {
  size_t n_tiles = 0, tiles = 0, sorted = 0, pos = 0, xb = 0, h = 0, y = 0, total = 0;
};

GemmScratch plan_gemm_scratch(const MoeFfnArgs& a) {
  GemmScratch s;
  const size_t P = size_t(a.n_tokens * a.n_used);
  size_t at = 0;
  auto take = [&](size_t bytes) {
    const size_t start = at;
    at += gemm_align(bytes);
    return start;
  };
  s.n_tiles = take(sizeof(int32_t));
  s.tiles = take(size_t(max_tiles(a)) * sizeof(MoeTile));
  s.sorted = take(P * sizeof(int32_t));
  s.pos = take(P * sizeof(int32_t));
  s.xb = take(size_t(a.n_tokens * a.n_embd) * sizeof(Bf16));  // v8's bf16 copy of x
  s.h = take(P * size_t(a.n_ff) * sizeof(Bf16));
  s.y = take(P * size_t(a.n_embd) * sizeof(float));
  s.total = at;
  return s;
}

// Sets the kernel's dynamic shared memory and launches it.
template <typename Kernel, typename... Args>
Status launch_gemm(Kernel kernel, const char* name, dim3 grid, int threads, int smem, cudaStream_t stream,
                   Args... args) {
  if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem); e != cudaSuccess)
    return Status::from_cuda(e, std::string("cudaFuncSetAttribute(") + name + ")");
  kernel<<<grid, threads, smem, stream>>>(args...);
  return launch_status(name);
}

// gate/up (+GLU) with tile engine V (4, 6 or 7).
template <int V>
Status launch_gate_up(const MoeFfnArgs& a, const Routing& rt, Bf16* h, cudaStream_t stream) {
  Status status;
  visit_moe_format(a.gate.type, [&](auto fmt) {
    using W = decltype(fmt);
    const dim3 grid(unsigned((a.n_ff + 63) / 64), unsigned(max_tiles(a)));
    status = launch_gemm(moe_gate_up_gemm_kernel<W, V>, "moe_gate_up_gemm_kernel", grid, kGemmThreads,
                         TileSmem<W, V>::kBytes, stream, a, rt, h);
  });
  return status;
}

// down with tile engine V (4, 6 or 7).
template <int V>
Status launch_down(const MoeFfnArgs& a, const Routing& rt, const Bf16* h, float* y, cudaStream_t stream) {
  Status status;
  visit_moe_format(a.down.type, [&](auto fmt) {
    using W = decltype(fmt);
    const dim3 grid(unsigned((a.n_embd + kTileRows - 1) / kTileRows), unsigned(max_tiles(a)));
    status = launch_gemm(moe_down_gemm_kernel<W, V>, "moe_down_gemm_kernel", grid, kGemmThreads,
                         TileSmem<W, V>::kBytes, stream, a, rt, h, y);
  });
  return status;
}

// Whether tile engine v8 takes matrix m over K columns: q6_K, or q4_K whose rows are all
// 16-byte aligned (v8 stages q4_K super-blocks without a misalignment head).
bool v8_takes(const ExpertMatrix& m, int64_t K) {
  if (K % kV8Chunk != 0) return false;
  if (m.type == GgmlType::Q6_K) return true;
  return m.type == GgmlType::Q4_K && reinterpret_cast<uintptr_t>(m.data) % 16 == 0 && m.row_bytes % 16 == 0 &&
         m.expert_bytes % 16 == 0;
}

// v8's pipeline depth: three stages where they fit in shared memory (q4_K: 204 KB; q6_K
// would need 276), else two; KILN_CUDA_MOE_V8_STAGES=2 keeps two everywhere (read once).
// Three stages measured 1-2% faster in the kernel bench and +0.3..1.5% pp512 (round 9).
template <typename W>
constexpr bool kV8ThreeStagesFit = V8Layout<W, 3>::kTotal <= 227 * 1024 - 4096;

bool v8_three_stages() {
  static const bool three = !env_is("KILN_CUDA_MOE_V8_STAGES", "2");
  return three;
}

Status launch_gate_up_v8(const MoeFfnArgs& a, const Routing& rt, Bf16* xb, Bf16* h, cudaStream_t stream) {
  moe_x_to_bf16_kernel<<<dim3(unsigned((a.n_embd + 255) / 256), unsigned(a.n_tokens)), 256, 0, stream>>>(a, xb);
  if (Status st = launch_status("moe_x_to_bf16_kernel"); !st.ok()) return st;
  Status status = Status::invalid("moe_ffn grouped GEMM v8: gate/up type " + std::string(type_name(a.gate.type)));
  visit_moe_format(a.gate.type, [&](auto fmt) {
    using W = decltype(fmt);
    if constexpr (V8Weights<W>::kTaken) {
      const dim3 grid(unsigned((a.n_ff + kV8Rows / 2 - 1) / (kV8Rows / 2)), unsigned(max_tiles(a)));
      if constexpr (kV8ThreeStagesFit<W>) {
        if (v8_three_stages()) {
          status = launch_gemm(moe_gate_up_v8_kernel<W, 3>, "moe_gate_up_v8_kernel", grid, kV8Threads,
                               V8Layout<W, 3>::kTotal, stream, a, rt, static_cast<const Bf16*>(xb), h);
          return;
        }
      }
      status = launch_gemm(moe_gate_up_v8_kernel<W, 2>, "moe_gate_up_v8_kernel", grid, kV8Threads,
                           V8Layout<W, 2>::kTotal, stream, a, rt, static_cast<const Bf16*>(xb), h);
    }
  });
  return status;
}

Status launch_down_v8(const MoeFfnArgs& a, const Routing& rt, const Bf16* h, float* y, cudaStream_t stream) {
  Status status = Status::invalid("moe_ffn grouped GEMM v8: down type " + std::string(type_name(a.down.type)));
  visit_moe_format(a.down.type, [&](auto fmt) {
    using W = decltype(fmt);
    if constexpr (V8Weights<W>::kTaken) {
      const dim3 grid(unsigned((a.n_embd + kV8Rows - 1) / kV8Rows), unsigned(max_tiles(a)));
      if constexpr (kV8ThreeStagesFit<W>) {
        if (v8_three_stages()) {
          status = launch_gemm(moe_down_v8_kernel<W, 3>, "moe_down_v8_kernel", grid, kV8Threads,
                               V8Layout<W, 3>::kTotal, stream, a, rt, h, y);
          return;
        }
      }
      status = launch_gemm(moe_down_v8_kernel<W, 2>, "moe_down_v8_kernel", grid, kV8Threads, V8Layout<W, 2>::kTotal,
                           stream, a, rt, h, y);
    }
  });
  return status;
}

// gate/up (+GLU) and down with tile engine `version`; v8 runs the products whose weights it
// takes (v8_takes) and v7 the others.
Status launch_tile_gemms(int version, const MoeFfnArgs& a, const Routing& rt, Bf16* xb, Bf16* h, float* y,
                         cudaStream_t stream) {
  Status status;
  // Only v8 reads the row-tile layout: it runs those products whatever the version.
  const bool gate_up_v8 = (version == 8 || a.gate.row_tiles) && v8_takes(a.gate, a.n_embd) && v8_takes(a.up, a.n_embd);
  const bool down_v8 = (version == 8 || a.down.row_tiles) && v8_takes(a.down, a.n_ff);
  if ((a.gate.row_tiles && !gate_up_v8) || (a.down.row_tiles && !down_v8))
    return Status::invalid("moe_ffn grouped GEMM: experts in the row-tile layout must be q4_K / q6_K over whole "
                           "super-blocks (tile engine v8)");
  if (gate_up_v8)
    status = launch_gate_up_v8(a, rt, xb, h, stream);
  else
    status = version == 4 ? launch_gate_up<4>(a, rt, h, stream)
             : version == 6 ? launch_gate_up<6>(a, rt, h, stream)
                            : launch_gate_up<7>(a, rt, h, stream);
  if (!status.ok()) return status;
  if (down_v8) return launch_down_v8(a, rt, h, y, stream);
  return version == 4 ? launch_down<4>(a, rt, h, y, stream)
         : version == 6 ? launch_down<6>(a, rt, h, y, stream)
                        : launch_down<7>(a, rt, h, y, stream);
}

// Tile engine v8 (v7 for the weight types v8 does not take) unless KILN_CUDA_MOE_PREFILL_V=4,
// 6 or 7 (read once). v8 beat v7 in the kernel bench by 38-50% and end to end (Qwen3-30B-A3B
// Q4_K_M pp512 +37%, moe_ffn 559 -> 359 us per layer; docs/perf-notes-moe.md, round 9);
// v4, v6 and v7 stay selectable for A/B.
int moe_gemm_default_version() {
  static const int version = [] {
    const int v = env_int("KILN_CUDA_MOE_PREFILL_V", 8);
    return v == 4 || v == 6 || v == 7 ? v : 8;
  }();
  return version;
}

}  // namespace detail

bool moe_gemm_fits(const MoeFfnArgs& a) {
  return moe_supports(a.gate.type, a.down.type) && a.gate.type == a.up.type && a.n_embd % detail::kTileK == 0 &&
         a.n_ff % detail::kTileK == 0 && a.n_expert > 0 && a.n_expert <= kMoeGemmMaxExperts && a.n_tokens > 0 &&
         a.n_tokens <= 65535 && a.n_used > 0 && detail::max_tiles(a) <= 65535 &&
         (a.n_ff + 63) / 64 <= 65535;
}

size_t moe_gemm_scratch_bytes(const MoeFfnArgs& a) { return detail::plan_gemm_scratch(a).total; }

Status moe_ffn_gemm(const MoeFfnArgs& a, void* scratch, size_t scratch_bytes, cudaStream_t stream) {
  using namespace detail;
  if (a.gemm_version != 0 && a.gemm_version != 4 && a.gemm_version != 6 && a.gemm_version != 7 && a.gemm_version != 8)
    return Status::invalid("moe_ffn grouped GEMM: tile engine version " + std::to_string(a.gemm_version) +
                           " does not exist (0 = default, 4, 6, 7 or 8)");
  if (a.gate.row_tiles != a.up.row_tiles)
    return Status::invalid("moe_ffn grouped GEMM: gate and up experts must both be in the row-tile layout or neither");
  if (!moe_gemm_fits(a))
    return Status::invalid("moe_ffn grouped GEMM: n_embd " + std::to_string(a.n_embd) + " and n_ff " +
                           std::to_string(a.n_ff) + " must be multiples of 32, gate and up of one supported type (" +
                           std::string(type_name(a.gate.type)) + " / " + std::string(type_name(a.up.type)) +
                           "), at most " + std::to_string(kMoeGemmMaxExperts) + " experts");
  const GemmScratch s = plan_gemm_scratch(a);
  if (!scratch || scratch_bytes < s.total || reinterpret_cast<uintptr_t>(scratch) % kGemmAlign != 0)
    return Status::invalid("moe_ffn grouped GEMM: needs " + std::to_string(s.total) +
                           " bytes of 256-byte aligned scratch, got " + std::to_string(scratch_bytes));
  auto* base = static_cast<uint8_t*>(scratch);
  Routing rt{reinterpret_cast<int32_t*>(base + s.n_tiles), reinterpret_cast<MoeTile*>(base + s.tiles),
             reinterpret_cast<int32_t*>(base + s.sorted), reinterpret_cast<int32_t*>(base + s.pos)};
  auto* xb = reinterpret_cast<Bf16*>(base + s.xb);
  auto* h = reinterpret_cast<Bf16*>(base + s.h);
  auto* y = reinterpret_cast<float*>(base + s.y);

  moe_sort_kernel<<<1, 1024, size_t(2 * a.n_expert) * sizeof(int), stream>>>(a, rt);
  if (Status st = launch_status("moe_sort_kernel"); !st.ok()) return st;

  const int version = a.gemm_version != 0 ? a.gemm_version : moe_gemm_default_version();
  if (Status st = launch_tile_gemms(version, a, rt, xb, h, y, stream); !st.ok()) return st;
  const dim3 grid(unsigned((a.n_embd + 255) / 256), unsigned(a.n_tokens));
  moe_combine_sorted_kernel<<<grid, 256, 0, stream>>>(a, rt.pos_of_pair, y);
  return launch_status("moe_combine_sorted_kernel");
}

}  // namespace kiln::cuda
