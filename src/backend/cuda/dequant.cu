// Dequantization kernels (see dequant.h). One block per output row; each thread decodes
// groups of 8 consecutive elements with the block formats' exact decode8().
#include <cmath>
#include <string>

#include "backend/cuda/block_formats.cuh"
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

template <typename Fmt, OutType kOut, bool kVectorStore>
__global__ void __launch_bounds__(kDequantThreads)
    dequant_blocks_kernel(const uint8_t* __restrict__ src, int64_t src_row_bytes, int64_t cols,
                          const int32_t* __restrict__ ids, int64_t src_rows, void* dst, int64_t dst_stride) {
  using S = Store<kOut>;
  constexpr int kGroupsPerBlock = Fmt::kElems / 8;
  const int64_t r = blockIdx.x;
  const int64_t sr = source_row(ids, r, src_rows);
  typename S::T* out = static_cast<typename S::T*>(dst) + r * dst_stride;
  const uint8_t* row = src + (sr < 0 ? 0 : sr) * src_row_bytes;
  const int64_t n_groups = cols / 8;
  for (int64_t g = threadIdx.x; g < n_groups; g += kDequantThreads) {
    float v[8];
    if (sr >= 0) {
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
