// Decode matvec kernels (see matvec.h for the contract).
//
// Quantized weights: a warp (or a group of 2 or 4 warps, for matrices with few rows) owns
// 1 or 2 rows and walks their columns in chunks of 32 slices (a slice = 32 elements; one
// lane each). It copies each chunk's bytes of its rows into shared memory with aligned
// 16-byte asynchronous copies, 3 chunks ahead -- GGUF blocks are 17..210 bytes and only byte-
// or 2-byte aligned, so reading them straight from global memory would take many narrow
// loads -- then each lane decodes its slice from shared memory and takes its dot product
// with the int8 activations, loaded once for all the warp's rows. Partial sums meet in a
// warp reduction (and across the group's warps through shared memory).
//
// Float weights: the same block shape; each lane reads 8 consecutive weights per row with
// 16-byte loads and multiplies them with x in f32.
#include <string>

#include "backend/cuda/block_formats.cuh"
#include "backend/cuda/common.cuh"
#include "backend/cuda/decode_layout.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/matvec.h"
#include "backend/cuda/matvec_grouped.h"

namespace kiln::cuda {
namespace detail {

constexpr int kMatvecWarps = 4;
constexpr int kMatvecThreads = kMatvecWarps * kWarpSize;

// One warp per block of 32 values, a value a lane (quantize_block_spread: the arithmetic of
// every int8 copy of the backend).
__global__ void quantize_q8_kernel(const float* __restrict__ x, int64_t n, int8_t* __restrict__ qs,
                                   float2* __restrict__ ds) {
  begin_chained_kernel();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;  // n % 32 == 0: whole warps leave together
  const float one[1] = {x[i]};
  quantize_block_spread<kWarpSize, 1>(one, qs + i, ds + i / 32);
}

// Sums each row's per-warp partials and writes y.
template <int kRows>
__device__ __forceinline__ void finish_rows(float (&acc)[kRows], int64_t row0, int64_t rows, const float* add,
                                            float* y) {
  __shared__ float partial[kMatvecWarps][kRows];
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const float v = warp_sum(acc[r]);
    if (lane == 0) partial[warp][r] = v;
  }
  __syncthreads();
  if (threadIdx.x < kRows) {
    const int r = threadIdx.x;
    const int64_t row = row0 + r;
    if (row < rows) {
      float sum = 0.0f;
#pragma unroll
      for (int w = 0; w < kMatvecWarps; ++w) sum += partial[w][r];
      if (add) sum += add[row];
      y[row] = sum;
    }
  }
}

// Warps of a block form row groups of `split` warps; a group owns kRows rows and its warps
// take the row chunks in turn (chunk = 32 slices of 32 elements, one slice per lane). Each
// warp keeps kStages chunks in flight: while it computes chunk k, chunks k+1 .. k+kStages-1
// are being copied into its shared-memory stages.
template <typename Fmt, int kRows, int kStages>
__global__ void __launch_bounds__(kMatvecThreads)
    matvec_q8_kernel(const uint8_t* __restrict__ w, int64_t w_row_bytes, int64_t rows, int64_t n_slices,
                     const int8_t* __restrict__ xqs, const float2* __restrict__ xds, const float* add, float* y,
                     int split) {
  constexpr int kSlicesPerBlock = Fmt::kElems / 32;
  constexpr int kBlocksPerChunk = kWarpSize / kSlicesPerBlock;
  constexpr int kChunkBytes = kBlocksPerChunk * Fmt::kBytes;
  // Up to 15 bytes of misalignment ahead of the chunk, the last 16-byte piece's tail, and
  // the word load_words() reads past its data.
  constexpr int kStageBytes = (kChunkBytes + 46) / 16 * 16;
  __shared__ __align__(16) uint8_t stage[kMatvecWarps][kStages][kRows][kStageBytes];
  __shared__ float partial[kMatvecWarps][kRows];

  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int group = warp / split, member = warp % split;
  const int64_t row0 = (int64_t(blockIdx.x) * (kMatvecWarps / split) + group) * kRows;
  const int64_t n_blocks = n_slices / kSlicesPerBlock;
  const int64_t n_chunks = (n_slices + kWarpSize - 1) / kWarpSize;
  // This warp's chunks: member, member + split, ... (none when its rows are past the end).
  const int64_t my_chunks = row0 < rows && member < n_chunks ? (n_chunks - member + split - 1) / split : 0;
  const uint8_t* row_start[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) row_start[r] = w + min64(row0 + r, rows - 1) * w_row_bytes;  // past the end: re-read, not written

  // Copies this warp's k-th chunk into stage k % kStages; always commits a group (maybe
  // empty) so that group k is the k-th chunk.
  auto issue = [&](int64_t k) {
    if (k < my_chunks) {
      const int64_t first_block = (member + k * split) * kBlocksPerChunk;
      const int chunk_bytes = int(min64(kBlocksPerChunk, n_blocks - first_block)) * Fmt::kBytes;
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const uintptr_t addr = reinterpret_cast<uintptr_t>(row_start[r] + first_block * Fmt::kBytes);
        const uint8_t* aligned = reinterpret_cast<const uint8_t*>(addr & ~uintptr_t(15));
        const int n_pieces = (int(addr & 15) + chunk_bytes + 15) / 16;
        uint8_t* dst = stage[warp][k % kStages][r];
        for (int p = lane; p < n_pieces; p += kWarpSize) cp_async_16(dst + 16 * p, aligned + 16 * p);
      }
    }
    cp_async_commit();
  };

  float acc[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) acc[r] = 0.0f;
#pragma unroll
  for (int k = 0; k < kStages - 1; ++k) issue(k);
  // The first chunks of weights are on their way; x and y belong to the kernels before.
  wait_for_previous_kernels();
  allow_next_kernel();
  for (int64_t k = 0; k < my_chunks; ++k) {
    issue(k + kStages - 1);
    const int64_t chunk = member + k * split;
    const int64_t slice = chunk * kWarpSize + lane;
    const bool active = slice < n_slices;
    int x[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    float2 ds = make_float2(0.0f, 0.0f);
    if (active) {
      const int4* xv = reinterpret_cast<const int4*>(xqs + 32 * slice);
      const int4 a = __ldg(xv), b = __ldg(xv + 1);
      x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
      ds = __ldg(xds + slice);
    }
    cp_async_wait<kStages - 1>();  // chunk k has landed (for this lane's copies)
    __syncwarp();                  // ... and for every lane's
    if (active) {
      const int64_t first_block = chunk * kBlocksPerChunk;
      const int block_in_chunk = lane / kSlicesPerBlock, sub = lane % kSlicesPerBlock;
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        // Where the chunk begins in its 16-byte piece decides which loads the decoder may use
        // (the same for the whole warp: no divergence).
        const int head = int(reinterpret_cast<uintptr_t>(row_start[r] + first_block * Fmt::kBytes) & 15);
        const uint8_t* st = stage[warp][k % kStages][r];
        const int off = head + block_in_chunk * Fmt::kBytes;
        if constexpr (Fmt::kMaxAlign >= 16) {
          if (head == 0) {
            acc[r] += Fmt::template dot_q8<16>(st, off, sub, x, ds);
            continue;
          }
        }
        if constexpr (Fmt::kMaxAlign >= 4) {
          if ((head & 3) == 0) {
            acc[r] += Fmt::template dot_q8<4>(st, off, sub, x, ds);
            continue;
          }
        }
        acc[r] += Fmt::template dot_q8<1>(st, off, sub, x, ds);
      }
    }
    __syncwarp();  // the stage is refilled next iteration
  }
  cp_async_wait<0>();

#pragma unroll
  for (int r = 0; r < kRows; ++r) acc[r] = warp_sum(acc[r]);
  if (split == 1) {
    if (lane < kRows && row0 + lane < rows) {
      float sum = acc[0];
#pragma unroll
      for (int r = 1; r < kRows; ++r)
        if (lane == r) sum = acc[r];
      const int64_t row = row0 + lane;
      if (add) sum += add[row];
      y[row] = sum;
    }
    return;
  }
  if (lane == 0)
#pragma unroll
    for (int r = 0; r < kRows; ++r) partial[warp][r] = acc[r];
  __syncthreads();
  if (member == 0 && lane < kRows && row0 + lane < rows) {
    float sum = 0.0f;
    for (int m = 0; m < split; ++m) sum += partial[warp + m][lane];
    const int64_t row = row0 + lane;
    if (add) sum += add[row];
    y[row] = sum;
  }
}

// ---- float weights -------------------------------------------------------------------------

struct F32Weights {
  static constexpr int kSize = 4;
  __device__ static void load8(const uint8_t* row, int64_t g, float* v) {
    const float4* p = reinterpret_cast<const float4*>(row) + 2 * g;
    const float4 a = __ldg(p), b = __ldg(p + 1);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  }
  __device__ static float load1(const uint8_t* row, int64_t i) { return __ldg(reinterpret_cast<const float*>(row) + i); }
};

struct F16Weights {
  static constexpr int kSize = 2;
  __device__ static void load8(const uint8_t* row, int64_t g, float* v) {
    const uint4 u = __ldg(reinterpret_cast<const uint4*>(row) + g);
    const uint32_t words[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&words[i]));
      v[2 * i] = f.x, v[2 * i + 1] = f.y;
    }
  }
  __device__ static float load1(const uint8_t* row, int64_t i) {
    return half_to_float(__ldg(reinterpret_cast<const unsigned short*>(row) + i));
  }
};

struct BF16Weights {
  static constexpr int kSize = 2;
  __device__ static void load8(const uint8_t* row, int64_t g, float* v) {
    const uint4 u = __ldg(reinterpret_cast<const uint4*>(row) + g);
    const uint32_t words[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[2 * i] = __uint_as_float(words[i] << 16);
      v[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
    }
  }
  __device__ static float load1(const uint8_t* row, int64_t i) {
    return bf16_to_float(__ldg(reinterpret_cast<const unsigned short*>(row) + i));
  }
};

// kVector: 8 weights per lane and step with 16-byte loads (cols % 8 == 0, rows 16-byte
// aligned); otherwise one weight per lane and step.
template <typename Weights, int kRows, bool kVector>
__global__ void __launch_bounds__(kMatvecThreads)
    matvec_float_kernel(const uint8_t* __restrict__ w, int64_t w_row_bytes, int64_t rows, int64_t cols,
                        const float* __restrict__ x, const float* add, float* y) {
  begin_chained_kernel();
  const int64_t row0 = int64_t(blockIdx.x) * kRows;
  const uint8_t* row_ptr[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) row_ptr[r] = w + min64(row0 + r, rows - 1) * w_row_bytes;
  float acc[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) acc[r] = 0.0f;

  if constexpr (kVector) {
    const int64_t n_groups = cols / 8;
#pragma unroll 2
    for (int64_t g = threadIdx.x; g < n_groups; g += kMatvecThreads) {
      const float4* xp = reinterpret_cast<const float4*>(x) + 2 * g;
      const float4 xa = __ldg(xp), xb = __ldg(xp + 1);
      const float xv[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        float v[8];
        Weights::load8(row_ptr[r], g, v);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[r] = fmaf(v[i], xv[i], acc[r]);
      }
    }
  } else {
    for (int64_t i = threadIdx.x; i < cols; i += kMatvecThreads) {
      const float xi = __ldg(x + i);
#pragma unroll
      for (int r = 0; r < kRows; ++r) acc[r] = fmaf(Weights::load1(row_ptr[r], i), xi, acc[r]);
    }
  }
  finish_rows<kRows>(acc, row0, rows, add, y);
}

constexpr int kMatvecStages = 3;

template <int kRows>
Status launch_quant(const MatvecArgs& a, const Q8Vector& xq, int split, cudaStream_t stream) {
  Status status;
  visit_quant_format(a.type, [&](auto fmt) {
    using Fmt = decltype(fmt);
    const int64_t rows_per_block = int64_t(kMatvecWarps / split) * kRows;
    const unsigned grid = unsigned((a.rows + rows_per_block - 1) / rows_per_block);
    launch_chained(matvec_q8_kernel<Fmt, kRows, kMatvecStages>, grid, kMatvecThreads, 0, stream,
                   static_cast<const uint8_t*>(a.w), a.w_row_bytes, a.rows, a.cols / 32, xq.qs, xq.ds, a.add, a.y,
                   split);
    status = launch_status("matvec_q8_kernel");
  });
  return status;
}

template <typename Weights, int kRows>
Status launch_float(const MatvecArgs& a, cudaStream_t stream) {
  const unsigned grid = unsigned((a.rows + kRows - 1) / kRows);
  const auto* w = static_cast<const uint8_t*>(a.w);
  const bool vector = a.cols % 8 == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0 && a.w_row_bytes % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(a.x) % 16 == 0;
  if (vector)
    launch_chained(matvec_float_kernel<Weights, kRows, true>, grid, kMatvecThreads, 0, stream, w, a.w_row_bytes,
                   a.rows, a.cols, a.x, a.add, a.y);
  else
    launch_chained(matvec_float_kernel<Weights, kRows, false>, grid, kMatvecThreads, 0, stream, w, a.w_row_bytes,
                   a.rows, a.cols, a.x, a.add, a.y);
  return launch_status("matvec_float_kernel");
}

template <typename Weights>
Status dispatch_float_rows(const MatvecArgs& a, int rows_per_block, cudaStream_t stream) {
  if (rows_per_block == 1) return launch_float<Weights, 1>(a, stream);
  return launch_float<Weights, 2>(a, stream);
}

bool is_float_type(GgmlType t) { return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16; }

// Rows per warp: 2 share each activation load; 1 gives more warps for smaller matrices.
int pick_rows_per_warp(const MatvecArgs& a) {
  if (a.rows_per_warp == 1 || a.rows_per_warp == 2) return a.rows_per_warp;
  return a.rows >= 4096 ? 2 : 1;
}

// Warps per row group: the fewest (1, 2, 4) that give about 16 warps per SM (132 SMs), and
// no more than there are chunks of 1024 elements per row.
int pick_split(const MatvecArgs& a, int rows_per_warp) {
  if (a.warps_per_row == 1 || a.warps_per_row == 2 || a.warps_per_row == 4) return a.warps_per_row;
  const int64_t groups = (a.rows + rows_per_warp - 1) / rows_per_warp;
  const int64_t chunks = (a.cols + 1023) / 1024;
  int split = 1;
  while (split < 4 && groups * split < 2048 && chunks >= 2 * split) split *= 2;
  return split;
}

Status check_args(const MatvecArgs& a) {
  if (!matvec_supports(a.type))
    return Status::invalid(std::string("matvec: weight type ") + std::string(type_name(a.type)) +
                           " is not supported; supported: f32 f16 bf16 " + kQuantFormatNames);
  const TypeTraits& t = traits(a.type);
  if (a.rows <= 0 || a.cols <= 0 || a.cols % t.block_size != 0)
    return Status::invalid("matvec: " + std::to_string(a.rows) + " x " + std::to_string(a.cols) +
                           " is not a matrix of whole " + std::string(t.name) + " blocks of " +
                           std::to_string(t.block_size));
  const int64_t row_bytes = a.cols / t.block_size * t.type_size;
  if (a.w_row_bytes < row_bytes)
    return Status::invalid("matvec: row stride " + std::to_string(a.w_row_bytes) + " bytes is shorter than a row (" +
                           std::to_string(row_bytes) + " bytes)");
  if (!a.w || !a.x || !a.y) return Status::invalid("matvec: w, x and y must be device pointers, not null");
  if (is_float_type(a.type) &&
      (reinterpret_cast<uintptr_t>(a.w) % t.type_size != 0 || a.w_row_bytes % t.type_size != 0))
    return Status::invalid("matvec: " + std::string(t.name) + " rows must be aligned to their element size");
  return Status();
}

}  // namespace detail

bool matvec_supports(GgmlType type) {
  return detail::is_float_type(type) || detail::visit_quant_format(type, [](auto) {});
}

size_t matvec_scratch_bytes(GgmlType type, int64_t cols) {
  if (detail::is_float_type(type) || cols <= 0) return 0;
  return q8_vector_bytes(cols);
}

size_t q8_vector_bytes(int64_t n) { return (size_t(n) + 15) / 16 * 16 + size_t(n / 32) * sizeof(float2); }

bool q8_rows_fit(const void* rows, int64_t row_bytes, int64_t n) {
  return n % 32 == 0 && detail::aligned16(rows) && row_bytes % 16 == 0 && row_bytes >= int64_t(q8_vector_bytes(n));
}

Q8Vector q8_vector_in(void* scratch, int64_t n) {
  Q8Vector q;
  q.qs = static_cast<int8_t*>(scratch);
  q.ds = reinterpret_cast<float2*>(static_cast<uint8_t*>(scratch) + (size_t(n) + 15) / 16 * 16);
  q.n = n;
  return q;
}

Status quantize_q8(const float* x, int64_t n, const Q8Vector& q, cudaStream_t stream) {
  if (n <= 0 || n % 32 != 0 || q.n != n)
    return Status::invalid("quantize_q8: " + std::to_string(n) + " values (a positive multiple of 32 is needed) into " +
                           std::to_string(q.n));
  if (!x || !q.qs || !q.ds || reinterpret_cast<uintptr_t>(q.qs) % 16 != 0)
    return Status::invalid("quantize_q8: x, qs (16-byte aligned) and ds must be device pointers");
  constexpr int kThreads = 256;
  launch_chained(detail::quantize_q8_kernel, unsigned((n + kThreads - 1) / kThreads), kThreads, 0, stream, x, n, q.qs,
                 q.ds);
  return launch_status("quantize_q8_kernel");
}

Status matvec_q8(const MatvecArgs& a, const Q8Vector& xq, cudaStream_t stream) {
  if (Status s = detail::check_args(a); !s.ok()) return s;
  if (detail::is_float_type(a.type))
    return Status::invalid("matvec_q8: " + std::string(type_name(a.type)) + " weights take x in f32; call matvec");
  if (xq.n != a.cols || !xq.qs || !xq.ds)
    return Status::invalid("matvec_q8: the quantized x holds " + std::to_string(xq.n) + " values for " +
                           std::to_string(a.cols) + " columns");
  if (matvec_grouped_fits(a, xq)) return matvec_q8_grouped(a, xq, stream);
  if (is_interleaved(a.w, size_t(a.rows) * size_t(a.w_row_bytes)))
    return Status::invalid("matvec_q8: these weights are in the interleaved layout (KILN_CUDA_INTERLEAVED), which only "
                           "the grouped decode kernels read, and this product does not fit them");
  const int rows_per_warp = detail::pick_rows_per_warp(a);
  const int split = detail::pick_split(a, rows_per_warp);
  if (rows_per_warp == 1) return detail::launch_quant<1>(a, xq, split, stream);
  return detail::launch_quant<2>(a, xq, split, stream);
}

Status matvec(const MatvecArgs& a, void* scratch, size_t scratch_bytes, cudaStream_t stream) {
  if (Status s = detail::check_args(a); !s.ok()) return s;
  switch (a.type) {
    case GgmlType::F32: return detail::dispatch_float_rows<detail::F32Weights>(a, detail::pick_rows_per_warp(a), stream);
    case GgmlType::F16: return detail::dispatch_float_rows<detail::F16Weights>(a, detail::pick_rows_per_warp(a), stream);
    case GgmlType::BF16:
      return detail::dispatch_float_rows<detail::BF16Weights>(a, detail::pick_rows_per_warp(a), stream);
    default: break;
  }
  const size_t need = matvec_scratch_bytes(a.type, a.cols);
  if (!scratch || scratch_bytes < need)
    return Status::invalid("matvec: " + std::string(type_name(a.type)) + " weights need " + std::to_string(need) +
                           " bytes of scratch, got " + std::to_string(scratch_bytes));
  const Q8Vector xq = q8_vector_in(scratch, a.cols);
  if (Status s = quantize_q8(a.x, a.cols, xq, stream); !s.ok()) return s;
  return matvec_q8(a, xq, stream);
}

}  // namespace kiln::cuda
