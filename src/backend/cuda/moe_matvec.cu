// MoE for a few tokens: indexed expert matvecs (see moe.h).
//
// Quantized weights, int8 activations (two launches):
//   1. gate/up: every block first quantizes its token's x (f32) into int8 blocks of 32 in
//      shared memory; a warp then owns output row r of pair p and walks gate row r and up
//      row r of expert ids[p] together (they share the activation loads), and applies the
//      GLU; h is written in f32;
//   2. down: every block first quantizes its token's k rows of h the same way; a warp owns
//      output row(s) r of token t and walks row r of each of its k experts in slot order,
//      each slot's partial sums scaled by its routing weight: the sum over slots happens in
//      registers, in a fixed order (deterministic, no atomics). With a residual, the sum is
//      also added to it as each row is written.
// Quantizing inside the matvecs (v3) replaced two launches of a quantize kernel (v2): a
// kernel boundary in a chained decode graph costs ~2-3 us, re-reading x or h from L2 in each
// block costs less. The int8 values are those the quantize kernel wrote (same formulas).
// Weight rows go through shared memory as in matvec.cu (aligned 16-byte asynchronous
// copies, a few chunks ahead; GGUF blocks are only byte-aligned), here with the chunks of
// all of a warp's segments (pair rows) in one pipeline, so short rows (768 columns) still
// keep several copies in flight.
//
// Both launches are chained (launch.cuh). The gate/up kernel follows the routing that wrote
// the expert ids, so it waits before it reads them; it then lets the down kernel start,
// which may therefore read the ids (two kernels back) and issue its first weight copies
// before its own wait, and reads h only after.
//
// Plain weights, and every type in exact mode: the same two launches with f32 activations,
// the weights decoded to f32 by the block formats' exact decode8 straight from global
// memory (slower; the exact mode is for checking, plain weights are for tests).
#include <string>
#include <utility>

#include "backend/cuda/launch.cuh"
#include "backend/cuda/moe.h"
#include "backend/cuda/moe_kernels.cuh"

namespace kiln::cuda {
namespace detail {

constexpr int kMoeWarps = 4;
constexpr int kMoeThreads = kMoeWarps * kWarpSize;
constexpr int kMoeStages = 4;
// The int8 kernels' blocks are larger: each quantizes its activations itself, so fewer blocks
// re-read them.
constexpr int kMoeQ8Warps = 8;
constexpr int kMoeQ8Threads = kMoeQ8Warps * kWarpSize;

// ---- int8 activations ----------------------------------------------------------------------

// Where a block's int8 activations live in its shared memory: `rows` rows of n values
// (n % 32 == 0) packed one after the other, then one (scale, scale * sum) pair per block of
// 32, as matvec.h's Q8Vector.
struct Q8Rows {
  const int8_t* qs = nullptr;
  int64_t pitch = 0;  // bytes between rows of qs
  const float2* ds = nullptr;
  int64_t blocks = 0;  // scale pairs per row
};

// Shared bytes for n int8 values with their scales.
__host__ __device__ constexpr int64_t q8_shared_bytes(int64_t n) { return n + n / 32 * int64_t(sizeof(float2)); }

// The whole block quantizes n consecutive floats (n % 32 == 0) into int8 blocks of 32 at qs
// (n bytes) with their scales at ds: 8 lanes per block of 32 values, 4 values per lane, a
// few loads issued before any arithmetic so that the block waits for L2 about once. The
// values are those of a warp per block (amax / 127, round to nearest), as the separate quantize
// kernel of decode v2b wrote them.
// `vec4`: src is 16-byte aligned (float4 loads).
template <int kThreads>
__device__ __forceinline__ void quantize_to_shared(const float* __restrict__ src, int64_t n, bool vec4, int8_t* qs,
                                                   float2* ds) {
  constexpr int kSteps = 4;
  constexpr int64_t kPerRound = int64_t(kSteps) * kThreads * 4;
  const int tid = threadIdx.x;
  // The 8 lanes of this thread's block of 32 (whole groups leave loops together: n % 32 == 0).
  const unsigned group_mask = 0xFFu << (tid & 24);
  for (int64_t base = 0; base < n; base += kPerRound) {
    float v[kSteps][4];
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      const int64_t i = base + (int64_t(s) * kThreads + tid) * 4;
      if (i >= n) break;
      if (vec4) {
        const float4 f = *reinterpret_cast<const float4*>(src + i);
        v[s][0] = f.x, v[s][1] = f.y, v[s][2] = f.z, v[s][3] = f.w;
      } else {
#pragma unroll
        for (int k = 0; k < 4; ++k) v[s][k] = src[i + k];
      }
    }
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      const int64_t i = base + (int64_t(s) * kThreads + tid) * 4;
      if (i >= n) break;
      float amax = fmaxf(fmaxf(fabsf(v[s][0]), fabsf(v[s][1])), fmaxf(fabsf(v[s][2]), fabsf(v[s][3])));
#pragma unroll
      for (int off = 4; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(group_mask, amax, off));
      const float d = amax / 127.0f;
      int q[4], sum = 0;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        q[k] = d == 0.0f ? 0 : int(roundf(v[s][k] / d));
        sum += q[k];
      }
#pragma unroll
      for (int off = 4; off > 0; off >>= 1) sum += __shfl_xor_sync(group_mask, sum, off);
      const uint32_t packed = (uint32_t(q[0]) & 0xFFu) | ((uint32_t(q[1]) & 0xFFu) << 8) |
                              ((uint32_t(q[2]) & 0xFFu) << 16) | (uint32_t(q[3]) << 24);
      *reinterpret_cast<uint32_t*>(qs + i) = packed;
      if ((tid & 7) == 0) ds[i / 32] = make_float2(d, d * float(sum));
    }
  }
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
// `stage` is this warp's [kMoeStages][kRows][kStageBytes] shared buffer.
//
// `ready()` runs once the first chunks' copies are issued and before any activation is read;
// every warp of the block calls it (n_segs may be 0): it fills the block's int8 activations
// in shared memory and ends with a block barrier. The down kernel waits there for the
// kernel before it (the expert ids it reads for the weight addresses were written two
// kernels back; see the top).
template <typename Fmt, int kRows, typename Segments, typename Ready>
__device__ __forceinline__ void segments_dot_q8(const Segments& segs, int n_segs, int64_t n_slices, uint8_t* stage,
                                                float (&acc)[kRows], Ready&& ready) {
  using S = ChunkShape<Fmt>;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t n_blocks = n_slices / S::kSlicesPerBlock;
  const int64_t per_seg = (n_slices + kWarpSize - 1) / kWarpSize;
  const int64_t total = n_segs * per_seg;
  auto stage_of = [&](int64_t k, int r) { return stage + (int(k % kMoeStages) * kRows + r) * S::kStageBytes; };

  auto issue = [&](int64_t k) {
    if (k < total) {
      const int seg = int(k / per_seg);
      const int64_t first_block = (k % per_seg) * S::kBlocksPerChunk;
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
  for (int k = 0; k < kMoeStages - 1; ++k) issue(k);
  ready();
  for (int64_t k = 0; k < total; ++k) {
    issue(k + kMoeStages - 1);
    const int seg = int(k / per_seg);
    const int64_t chunk = k % per_seg;
    const int64_t slice = chunk * kWarpSize + lane;
    const bool active = slice < n_slices;
    int x[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    float2 ds = make_float2(0.0f, 0.0f);
    if (active) {
      // In shared memory, written by the whole block in ready().
      const int4* xv = reinterpret_cast<const int4*>(segs.xqs(seg) + 32 * slice);
      const int4 a = xv[0], b = xv[1];
      x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
      ds = segs.xds(seg)[slice];
    }
    cp_async_wait<kMoeStages - 1>();  // chunk k has landed (this lane's copies)
    __syncwarp();                     // ... and every lane's
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

// The expert of slot j of token t, or -1 when the id is out of range.
__device__ __forceinline__ int expert_of(const MoeFfnArgs& a, int64_t t, int64_t j) {
  const int e = a.ids[t * a.ids_stride + j];
  return e >= 0 && e < a.n_expert ? e : -1;
}

__device__ __forceinline__ const uint8_t* expert_row(const ExpertMatrix& m, int expert, int64_t row) {
  return static_cast<const uint8_t*>(m.data) + int64_t(expert < 0 ? 0 : expert) * m.expert_bytes + row * m.row_bytes;
}

__device__ __forceinline__ float bias_at(const ExpertMatrix& m, int expert, int64_t row) {
  return m.bias && expert >= 0 ? m.bias[int64_t(expert) * m.bias_stride + row] : 0.0f;
}

// ---- gate / up + GLU ---------------------------------------------------------------------

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

// Dynamic shared memory of the int8 kernels: each warp's weight stages, then the block's
// int8 activations (q8_shared_bytes).
template <typename Fmt, int kRows>
constexpr int64_t stage_bytes_per_warp() { return int64_t(kMoeStages) * kRows * ChunkShape<Fmt>::kStageBytes; }

// Grid (ceil(n_ff / kMoeQ8Warps), pairs); warp w of block x owns row x * kMoeQ8Warps + w.
template <typename Fmt>
__global__ void __launch_bounds__(kMoeQ8Threads) moe_gate_up_q8_kernel(MoeFfnArgs a, bool x_vec4, float* h) {
  extern __shared__ __align__(16) uint8_t smem[];
  constexpr int64_t kStage = stage_bytes_per_warp<Fmt, 2>();
  int8_t* x_qs = reinterpret_cast<int8_t*>(smem + kMoeQ8Warps * kStage);
  float2* x_ds = reinterpret_cast<float2*>(x_qs + a.n_embd);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int64_t r = int64_t(blockIdx.x) * kMoeQ8Warps + warp;
  const int64_t p = blockIdx.y, t = p / a.n_used, j = p % a.n_used;
  const bool owns_row = r < a.n_ff;  // every warp still takes part in the block's quantization
  // The routing that wrote the ids may be the kernel just before: wait before reading them.
  begin_chained_kernel();
  const int e = expert_of(a, t, j);
  GateUpSegments segs{expert_row(a.gate, e, min64(r, a.n_ff - 1)), expert_row(a.up, e, min64(r, a.n_ff - 1)), x_qs,
                      x_ds};
  float acc[2] = {0.0f, 0.0f};
  segments_dot_q8<Fmt, 2>(segs, owns_row ? 1 : 0, a.n_embd / 32, smem + warp * kStage, acc, [&] {
    quantize_to_shared<kMoeQ8Threads>(a.x + t * a.x_stride, a.n_embd, x_vec4, x_qs, x_ds);
    __syncthreads();
  });
  if (!owns_row) return;
  const float g = warp_sum(acc[0]), u = warp_sum(acc[1]);
  if (lane == 0)
    h[p * a.n_ff + r] = e < 0 ? moe_nan()
                              : moe_glu(a.act, g + bias_at(a.gate, e, r), u + bias_at(a.up, e, r), a.alpha, a.limit);
}

// ---- down, weighted and summed over the slots ------------------------------------------------

template <int kRows>
struct DownSegments {
  const MoeFfnArgs* a;
  int64_t t, row0;
  Q8Rows hq;
  __device__ const uint8_t* row(int j, int r) const {
    return expert_row(a->down, expert_of(*a, t, j), min64(row0 + r, a->n_embd - 1));
  }
  __device__ const int8_t* xqs(int j) const { return hq.qs + j * hq.pitch; }  // the token's rows only
  __device__ const float2* xds(int j) const { return hq.ds + j * hq.blocks; }
  __device__ float factor(int j) const { return a->weights[t * a->weights_stride + j]; }
};

// Writes out[t][row0 + r] for the warp's rows: the slots' weighted biases added, NaN when a
// slot's id is out of range; adds the same to the residual when there is one.
template <int kRows>
__device__ __forceinline__ void finish_down(const MoeFfnArgs& a, int64_t t, int64_t row0, float (&acc)[kRows]) {
  const int lane = threadIdx.x % kWarpSize;
#pragma unroll
  for (int r = 0; r < kRows; ++r) acc[r] = warp_sum(acc[r]);
  if (lane >= kRows || row0 + lane >= a.n_embd) return;
  float sum = acc[0];
#pragma unroll
  for (int r = 1; r < kRows; ++r)
    if (lane == r) sum = acc[r];
  const int64_t row = row0 + lane;
  for (int64_t j = 0; j < a.n_used; ++j) {
    const int e = expert_of(a, t, j);
    if (e < 0) sum = moe_nan();
    sum += a.weights[t * a.weights_stride + j] * bias_at(a.down, e, row);
  }
  a.out[t * a.out_stride + row] = sum;
  if (a.residual) a.residual[t * a.residual_stride + row] += sum;
}

// Grid (ceil(n_embd / (kMoeQ8Warps * kRows)), tokens); h is [pairs][n_ff] f32.
template <typename Fmt, int kRows>
__global__ void __launch_bounds__(kMoeQ8Threads) moe_down_q8_kernel(MoeFfnArgs a, const float* h) {
  extern __shared__ __align__(16) uint8_t smem[];
  constexpr int64_t kStage = stage_bytes_per_warp<Fmt, kRows>();
  const int64_t n_h = a.n_used * a.n_ff;  // this token's rows of h, back to back
  int8_t* h_qs = reinterpret_cast<int8_t*>(smem + kMoeQ8Warps * kStage);
  float2* h_ds = reinterpret_cast<float2*>(h_qs + n_h);
  const int warp = threadIdx.x / kWarpSize;
  const int64_t row0 = (int64_t(blockIdx.x) * kMoeQ8Warps + warp) * kRows;
  const int64_t t = blockIdx.y;
  const bool owns_rows = row0 < a.n_embd;
  DownSegments<kRows> segs{&a, t, row0, Q8Rows{h_qs, a.n_ff, h_ds, a.n_ff / 32}};
  float acc[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) acc[r] = 0.0f;
  segments_dot_q8<Fmt, kRows>(segs, owns_rows ? int(a.n_used) : 0, a.n_ff / 32, smem + warp * kStage, acc, [&] {
    begin_chained_kernel();  // h is the kernel before's
    quantize_to_shared<kMoeQ8Threads>(h + t * n_h, n_h, true, h_qs, h_ds);
    __syncthreads();
  });
  if (owns_rows) finish_down<kRows>(a, t, row0, acc);
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
                              : moe_glu(a.act, g + bias_at(a.gate, e, r), u + bias_at(a.up, e, r), a.alpha, a.limit);
}

template <typename W>
__global__ void __launch_bounds__(kMoeThreads) moe_down_f32_kernel(MoeFfnArgs a, const float* h) {
  const int warp = threadIdx.x / kWarpSize;
  const int64_t row = int64_t(blockIdx.x) * kMoeWarps + warp;
  const int64_t t = blockIdx.y;
  if (row >= a.n_embd) return;
  float acc[1] = {0.0f};
  for (int64_t j = 0; j < a.n_used; ++j) {
    const int e = expert_of(a, t, j);
    const float d = row_dot_f32<W>(expert_row(a.down, e, row), h + (t * a.n_used + j) * a.n_ff, a.n_ff);
    acc[0] = fmaf(a.weights[t * a.weights_stride + j], d, acc[0]);
  }
  finish_down<1>(a, t, row, acc);
}

// ---- host side -------------------------------------------------------------------------------

constexpr size_t kAlignBytes = 256;  // of the scratch (h: [pairs][n_ff] f32)

size_t h_bytes(const MoeFfnArgs& a) { return size_t(a.n_tokens * a.n_used * a.n_ff) * sizeof(float); }

Status chained_status(cudaError_t e, const char* kernel) {
  return e != cudaSuccess ? Status::from_cuda(e, kernel) : launch_status(kernel);
}

// Launches an int8 kernel with `shared` bytes of dynamic shared memory, raising the kernel's
// limit above the default 48 KB where needed (a function attribute, not a stream operation:
// allowed while a graph is captured).
template <typename... Params, typename... Args>
Status launch_q8(void (*kernel)(Params...), const char* name, dim3 grid, int64_t shared, cudaStream_t stream,
                 Args&&... args) {
  constexpr int64_t kDefaultLimit = 48 * 1024;
  if (shared > kDefaultLimit) {
    int device = 0, most = 0;
    if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return Status::from_cuda(e, name);
    if (cudaError_t e = cudaDeviceGetAttribute(&most, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
        e != cudaSuccess)
      return Status::from_cuda(e, name);
    if (shared > most)
      return Status::invalid(std::string(name) + ": needs " + std::to_string(shared) +
                             " bytes of shared memory per block (weight stages and int8 activations), the device " +
                             "has " + std::to_string(most));
    if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared));
        e != cudaSuccess)
      return Status::from_cuda(e, name);
  }
  return chained_status(
      launch_chained(kernel, grid, dim3(kMoeQ8Threads), size_t(shared), stream, std::forward<Args>(args)...), name);
}

}  // namespace detail

bool moe_supports(GgmlType gate_up, GgmlType down) {
  auto known = [](GgmlType t) { return detail::visit_moe_format(t, [](auto) {}); };
  return known(gate_up) && known(down);
}

size_t moe_matvec_scratch_bytes(const MoeFfnArgs& a, bool) { return detail::h_bytes(a); }

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
  const bool q8_gate_up = !exact && !is_plain_type(a.gate.type);
  const bool q8_down = !exact && !is_plain_type(a.down.type);
  const size_t need = h_bytes(a);
  if (!scratch || scratch_bytes < need || reinterpret_cast<uintptr_t>(scratch) % kAlignBytes != 0)
    return Status::invalid("moe_ffn: needs " + std::to_string(need) + " bytes of 256-byte aligned scratch, got " +
                           std::to_string(scratch_bytes));
  float* h = static_cast<float*>(scratch);
  const int64_t P = a.n_tokens * a.n_used;
  Status status;

  // gate / up + GLU -> h
  if (q8_gate_up) {
    const dim3 grid(unsigned((a.n_ff + kMoeQ8Warps - 1) / kMoeQ8Warps), unsigned(P));
    const bool x_vec4 = reinterpret_cast<uintptr_t>(a.x) % 16 == 0 && a.x_stride % 4 == 0;
    visit_quant_format(a.gate.type, [&](auto fmt) {
      using Fmt = decltype(fmt);
      const int64_t shared = kMoeQ8Warps * stage_bytes_per_warp<Fmt, 2>() + q8_shared_bytes(a.n_embd);
      status = launch_q8(moe_gate_up_q8_kernel<Fmt>, "moe_gate_up_q8_kernel", grid, shared, stream, a, x_vec4, h);
    });
  } else {
    const dim3 grid(unsigned((a.n_ff + kMoeWarps - 1) / kMoeWarps), unsigned(P));
    visit_moe_format(a.gate.type, [&](auto fmt) {
      moe_gate_up_f32_kernel<decltype(fmt)><<<grid, kMoeThreads, 0, stream>>>(a, h);
      status = launch_status("moe_gate_up_f32_kernel");
    });
  }
  if (!status.ok()) return status;

  // down, weighted and summed over the slots -> out
  if (q8_down) {
    // One row per warp gives more warps (more copies in flight) while the grid is small.
    const bool two_rows = a.n_tokens * a.n_embd >= 16384;
    const int rows_per_block = kMoeQ8Warps * (two_rows ? 2 : 1);
    const dim3 grid(unsigned((a.n_embd + rows_per_block - 1) / rows_per_block), unsigned(a.n_tokens));
    const int64_t h_shared = q8_shared_bytes(a.n_used * a.n_ff);
    visit_quant_format(a.down.type, [&](auto fmt) {
      using Fmt = decltype(fmt);
      status = two_rows ? launch_q8(moe_down_q8_kernel<Fmt, 2>, "moe_down_q8_kernel", grid,
                                    kMoeQ8Warps * stage_bytes_per_warp<Fmt, 2>() + h_shared, stream, a, h)
                        : launch_q8(moe_down_q8_kernel<Fmt, 1>, "moe_down_q8_kernel", grid,
                                    kMoeQ8Warps * stage_bytes_per_warp<Fmt, 1>() + h_shared, stream, a, h);
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

}  // namespace kiln::cuda
