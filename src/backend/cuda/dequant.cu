// Dequantization kernels (see dequant.h). One block per output row; each thread decodes
// groups of 8 consecutive elements with the block formats' exact decode8().
#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>

#include "backend/cuda/block_formats.cuh"
#include "backend/cuda/decode_layout.h"
#include "backend/cuda/dequant.h"

namespace kiln::cuda {
namespace detail {

constexpr int kDequantThreads = 128;

template <OutType kOut>
struct Store;
template <>
struct Store<OutType::F32> {
  using T = float;
  __device__ static T convert(float v) { return v; }
  __device__ static void store8(T* p, const float* v) {
    reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
  }
};
template <>
struct Store<OutType::BF16> {
  using T = __nv_bfloat16;
  __device__ static T convert(float v) { return __float2bfloat16_rn(v); }
  __device__ static void store8(T* p, const float* v) { *reinterpret_cast<uint4*>(p) = detail::pack_bf16x8(v); }
};
template <>
struct Store<OutType::F16> {
  using T = __half;
  __device__ static T convert(float v) { return __float2half_rn(v); }
  __device__ static void store8(T* p, const float* v) {
    uint4 u;
    uint32_t* w = reinterpret_cast<uint32_t*>(&u);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const __half2 pair = __floats2half2_rn(v[2 * i], v[2 * i + 1]);
      w[i] = *reinterpret_cast<const uint32_t*>(&pair);
    }
    *reinterpret_cast<uint4*>(p) = u;
  }
};

// The source row of output row r, or -1 when its id is out of range.
__device__ __forceinline__ int64_t source_row(const int32_t* ids, int64_t r, int64_t src_rows) {
  if (!ids) return r;
  const int64_t id = ids[r];
  return id >= 0 && id < src_rows ? id : -1;
}

// Output row r of `cols` elements from source row `row` (null: sr < 0, a row of NaN).
template <typename Fmt, OutType kOut, bool kVectorStore>
__device__ __forceinline__ void decode_row(const uint8_t* row, int64_t cols, typename Store<kOut>::T* out) {
  using S = Store<kOut>;
  constexpr int kGroupsPerBlock = Fmt::kElems / 8;
  const int64_t n_groups = cols / 8;
  for (int64_t g = threadIdx.x; g < n_groups; g += kDequantThreads) {
    float v[8];
    if (row) {
      Fmt::decode8(row + (g / kGroupsPerBlock) * Fmt::kBytes, int(g % kGroupsPerBlock), v);
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = __int_as_float(0x7fc00000);
    }
    if constexpr (kVectorStore) {
      S::store8(out + 8 * g, v);
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) out[8 * g + i] = S::convert(v[i]);
    }
  }
}

template <typename Fmt, OutType kOut, bool kVectorStore>
__global__ void __launch_bounds__(kDequantThreads)
    dequant_blocks_kernel(const uint8_t* __restrict__ src, int64_t src_row_bytes, int64_t cols,
                          const int32_t* __restrict__ ids, int64_t src_rows, void* dst, int64_t dst_stride) {
  const int64_t r = blockIdx.x;
  const int64_t sr = source_row(ids, r, src_rows);
  decode_row<Fmt, kOut, kVectorStore>(sr < 0 ? nullptr : src + sr * src_row_bytes, cols,
                                      static_cast<typename Store<kOut>::T*>(dst) + r * dst_stride);
}

// Rows of a q4_0 / q8_0 / q4_K / q6_K matrix in the interleaved layout (decode_layout.h;
// `matrix` is its first byte, source rows count from its row `first_row`): each block first
// gathers its source row's words back into the block layout in shared memory, then decodes as
// above.
template <typename Fmt, OutType kOut, bool kVectorStore>
__global__ void __launch_bounds__(kDequantThreads)
    dequant_interleaved_kernel(const uint4* __restrict__ matrix, int64_t first_row, int64_t cols,
                               const int32_t* __restrict__ ids, int64_t src_rows, void* dst, int64_t dst_stride) {
  extern __shared__ uint4 row_s[];
  const int64_t r = blockIdx.x;
  const int64_t sr = source_row(ids, r, src_rows);
  const int64_t groups = cols / 256;
  if constexpr (std::is_same_v<Fmt, Format<GgmlType::Q6_K>>) {
    // A group's 13 words and its d back to its 210 bytes (an even offset: 2-byte stores).
    auto* row_h = reinterpret_cast<uint16_t*>(row_s);
    constexpr int kLoads = kQ6KLayoutWords + 1;
    if (sr >= 0)
      for (int64_t w = threadIdx.x; w < groups * kLoads; w += kDequantThreads) {
        const int64_t group = w / kLoads, row = first_row + sr;
        const int k = int(w % kLoads);
        uint16_t* to = row_h + group * (kQ6KGroupBytes / 2) + 8 * k;
        if (k == kQ6KLayoutWords) {
          *to = *reinterpret_cast<const uint16_t*>(reinterpret_cast<const uint8_t*>(matrix) +
                                                   interleaved_q6_k_d_byte(row, group, groups));
        } else {
          const uint4 v = matrix[interleaved_q6_k_word(row, group, k, groups)];
          const uint32_t words[4] = {v.x, v.y, v.z, v.w};
          for (int e = 0; e < 8; ++e) to[e] = uint16_t(words[e / 2] >> (16 * (e % 2)));
        }
      }
  } else {
    constexpr int kWords = 256 / Fmt::kElems * Fmt::kBytes / 16;  // a group of 256 weights
    const int64_t row_words = groups * kWords;
    if (sr >= 0)
      for (int64_t w = threadIdx.x; w < row_words; w += kDequantThreads)
        row_s[w] = matrix[interleaved_word(first_row + sr, w / kWords, int(w % kWords), groups, kWords)];
  }
  __syncthreads();
  decode_row<Fmt, kOut, kVectorStore>(sr < 0 ? nullptr : reinterpret_cast<const uint8_t*>(row_s), cols,
                                      static_cast<typename Store<kOut>::T*>(dst) + r * dst_stride);
}

// f32 / f16 / bf16 sources: one element per thread and step.
template <GgmlType kIn, OutType kOut>
__global__ void __launch_bounds__(kDequantThreads)
    convert_rows_kernel(const uint8_t* __restrict__ src, int64_t src_row_bytes, int64_t cols,
                        const int32_t* __restrict__ ids, int64_t src_rows, void* dst, int64_t dst_stride) {
  using S = Store<kOut>;
  const int64_t r = blockIdx.x;
  const int64_t sr = source_row(ids, r, src_rows);
  typename S::T* out = static_cast<typename S::T*>(dst) + r * dst_stride;
  const uint8_t* row = src + (sr < 0 ? 0 : sr) * src_row_bytes;
  for (int64_t i = threadIdx.x; i < cols; i += kDequantThreads) {
    float v;
    if (sr < 0)
      v = __int_as_float(0x7fc00000);
    else if constexpr (kIn == GgmlType::F32)
      v = reinterpret_cast<const float*>(row)[i];
    else if constexpr (kIn == GgmlType::F16)
      v = half_to_float(reinterpret_cast<const unsigned short*>(row)[i]);
    else
      v = bf16_to_float(reinterpret_cast<const unsigned short*>(row)[i]);
    out[i] = S::convert(v);
  }
}

template <OutType kOut>
Status launch_dequant(const DequantArgs& a, bool vector_store, cudaStream_t stream) {
  const auto* src = static_cast<const uint8_t*>(a.src);
  const unsigned grid = unsigned(a.rows);
  switch (a.type) {
    case GgmlType::F32:
      convert_rows_kernel<GgmlType::F32, kOut>
          <<<grid, kDequantThreads, 0, stream>>>(src, a.src_row_bytes, a.cols, a.ids, a.src_rows, a.dst, a.dst_stride);
      return launch_status("convert_rows_kernel");
    case GgmlType::F16:
      convert_rows_kernel<GgmlType::F16, kOut>
          <<<grid, kDequantThreads, 0, stream>>>(src, a.src_row_bytes, a.cols, a.ids, a.src_rows, a.dst, a.dst_stride);
      return launch_status("convert_rows_kernel");
    case GgmlType::BF16:
      convert_rows_kernel<GgmlType::BF16, kOut>
          <<<grid, kDequantThreads, 0, stream>>>(src, a.src_row_bytes, a.cols, a.ids, a.src_rows, a.dst, a.dst_stride);
      return launch_status("convert_rows_kernel");
    default: break;
  }
  Status status;
  visit_quant_format(a.type, [&](auto fmt) {
    using Fmt = decltype(fmt);
    if (vector_store)
      dequant_blocks_kernel<Fmt, kOut, true>
          <<<grid, kDequantThreads, 0, stream>>>(src, a.src_row_bytes, a.cols, a.ids, a.src_rows, a.dst, a.dst_stride);
    else
      dequant_blocks_kernel<Fmt, kOut, false>
          <<<grid, kDequantThreads, 0, stream>>>(src, a.src_row_bytes, a.cols, a.ids, a.src_rows, a.dst, a.dst_stride);
    status = launch_status("dequant_blocks_kernel");
  });
  return status;
}

bool is_plain(GgmlType t) { return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16; }

template <typename Fmt, OutType kOut>
Status launch_interleaved(const DequantArgs& a, const uint8_t* matrix, int64_t first_row, bool vector_store,
                          cudaStream_t stream) {
  const size_t smem = size_t(a.cols) / Fmt::kElems * Fmt::kBytes;  // one row in the block layout
  constexpr auto vector_kernel = dequant_interleaved_kernel<Fmt, kOut, true>;
  constexpr auto scalar_kernel = dequant_interleaved_kernel<Fmt, kOut, false>;
  const auto kernel = vector_store ? vector_kernel : scalar_kernel;
  if (smem > 48 * 1024)
    if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
        e != cudaSuccess)
      return Status::from_cuda(e, "cudaFuncSetAttribute (dequant_interleaved_kernel)");
  kernel<<<unsigned(a.rows), kDequantThreads, smem, stream>>>(reinterpret_cast<const uint4*>(matrix), first_row,
                                                              a.cols, a.ids, a.src_rows, a.dst, a.dst_stride);
  return launch_status("dequant_interleaved_kernel");
}

// Rows of matrices in the interleaved layout (decode_layout.h), a run of rows per matrix: a
// slab of weights loaded side by side may cross from one matrix into the next. With ids (a
// gather) the ids count rows from src, all in its matrix.
Status dequantize_interleaved(const DequantArgs& a, bool vector_store, cudaStream_t stream) {
  if (a.src_row_bytes != a.cols / int64_t(traits(a.type).block_size) * int64_t(traits(a.type).type_size))
    return Status::invalid("dequantize: rows of interleaved weights must be packed (" +
                           std::to_string(a.src_row_bytes) + " bytes a row of " + std::to_string(a.cols) + ")");
  DequantArgs run = a;
  for (int64_t done = 0; done < a.rows;) {
    const uint8_t* at = static_cast<const uint8_t*>(a.src) + done * a.src_row_bytes;
    const uint8_t* base = nullptr;
    size_t bytes = 0;
    if (!interleaved_matrix(at, base, bytes) || (at - base) % a.src_row_bytes != 0)
      return Status::invalid("dequantize: rows of interleaved weights must start at a whole row of one matrix");
    const int64_t first_row = (at - base) / a.src_row_bytes, rows_left = int64_t(bytes) / a.src_row_bytes - first_row;
    run.rows = a.ids ? a.rows : std::min<int64_t>(a.rows - done, rows_left);
    if (run.rows <= 0 || (a.ids && a.src_rows > rows_left))
      return Status::invalid("dequantize: the rows run past the end of their interleaved matrix");
    Status s;
    visit_quant_format(a.type, [&](auto fmt) {
      using Fmt = decltype(fmt);
      if constexpr (std::is_same_v<Fmt, Format<GgmlType::Q4_0>> || std::is_same_v<Fmt, Format<GgmlType::Q8_0>> ||
                    std::is_same_v<Fmt, Format<GgmlType::Q4_K>> ||
                    std::is_same_v<Fmt, Format<GgmlType::Q6_K>>) {  // interleaved_type
        switch (a.out) {
          case OutType::F32:
            s = launch_interleaved<Fmt, OutType::F32>(run, base, first_row, vector_store, stream);
            break;
          case OutType::BF16:
            s = launch_interleaved<Fmt, OutType::BF16>(run, base, first_row, vector_store, stream);
            break;
          case OutType::F16:
            s = launch_interleaved<Fmt, OutType::F16>(run, base, first_row, vector_store, stream);
            break;
        }
      } else {
        s = Status::invalid("dequantize: only q4_0 / q8_0 / q4_K / q6_K weights take the interleaved layout");
      }
    });
    if (!s.ok()) return s;
    const size_t out_size = a.out == OutType::F32 ? 4 : 2;
    run.dst = static_cast<uint8_t*>(run.dst) + size_t(run.rows) * size_t(a.dst_stride) * out_size;
    done += run.rows;
  }
  return Status();
}

}  // namespace detail

bool dequantize_supports(GgmlType type) {
  return detail::is_plain(type) || detail::visit_quant_format(type, [](auto) {});
}

Status dequantize_rows(const DequantArgs& a, cudaStream_t stream) {
  if (!dequantize_supports(a.type))
    return Status::invalid(std::string("dequantize: type ") + std::string(type_name(a.type)) +
                           " is not supported; supported: f32 f16 bf16 " + detail::kQuantFormatNames);
  const TypeTraits& t = traits(a.type);
  if (a.rows <= 0 || a.cols <= 0 || a.cols % t.block_size != 0 || a.rows > 0x7fffffff)
    return Status::invalid("dequantize: " + std::to_string(a.rows) + " rows of " + std::to_string(a.cols) +
                           " are not whole " + std::string(t.name) + " blocks of " + std::to_string(t.block_size));
  if (a.src_row_bytes < a.cols / t.block_size * int64_t(t.type_size) || a.dst_stride < a.cols)
    return Status::invalid("dequantize: row strides (" + std::to_string(a.src_row_bytes) + " bytes in, " +
                           std::to_string(a.dst_stride) + " elements out) are shorter than a row");
  if (!a.src || !a.dst) return Status::invalid("dequantize: src and dst must be device pointers");
  if (detail::is_plain(a.type) && (reinterpret_cast<uintptr_t>(a.src) % t.type_size || a.src_row_bytes % t.type_size))
    return Status::invalid("dequantize: " + std::string(t.name) + " rows must be aligned to their element size");
  const int out_size = a.out == OutType::F32 ? 4 : 2;
  const bool vector_store = reinterpret_cast<uintptr_t>(a.dst) % 16 == 0 && (a.dst_stride * out_size) % 16 == 0;
  const int64_t span_rows = a.ids ? a.src_rows : a.rows;
  if (interleaved_type(a.type) && is_interleaved(a.src, size_t(span_rows) * size_t(a.src_row_bytes)))
    return detail::dequantize_interleaved(a, vector_store, stream);
  switch (a.out) {
    case OutType::F32: return detail::launch_dequant<OutType::F32>(a, vector_store, stream);
    case OutType::BF16: return detail::launch_dequant<OutType::BF16>(a, vector_store, stream);
    case OutType::F16: return detail::launch_dequant<OutType::F16>(a, vector_store, stream);
  }
  return Status::invalid("dequantize: unknown output type");
}

Status get_rows(GgmlType type, const void* table, int64_t table_row_bytes, int64_t table_rows, int64_t cols,
                const int32_t* ids, int64_t n_ids, float* out, int64_t out_stride, cudaStream_t stream) {
  if (!ids) return Status::invalid("get_rows: ids must be a device pointer");
  DequantArgs a;
  a.type = type;
  a.src = table;
  a.src_row_bytes = table_row_bytes;
  a.rows = n_ids;
  a.cols = cols;
  a.ids = ids;
  a.src_rows = table_rows;
  a.dst = out;
  a.dst_stride = out_stride;
  a.out = OutType::F32;
  return dequantize_rows(a, stream);
}

}  // namespace kiln::cuda
