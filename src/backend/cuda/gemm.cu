// Prefill GEMM through cuBLAS (see gemm.h).
#include <string>

#include "backend/cuda/dequant.h"
#include "backend/cuda/gemm.h"

namespace kiln::cuda {
namespace {

constexpr size_t kAlign = 256;
size_t align_up(size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

bool is_quantized(GgmlType t) { return t != GgmlType::F32 && t != GgmlType::F16 && t != GgmlType::BF16; }

Status blas_status(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return Status();
  return Status::from_cuda(cudaErrorUnknown, std::string("gemm: ") + what + " failed: " + cublasGetStatusString(s));
}

// X (f32) -> the half type of the product, packed rows of k.
size_t x_copy_bytes(const GemmArgs& a) { return a.type == GgmlType::F32 ? 0 : align_up(size_t(a.t) * a.k * 2); }

Status product(const GemmArgs& a, cublasHandle_t blas, cudaDataType_t type, const void* w, int64_t ldw,
               int64_t rows, const void* x, int64_t ldx, float* y) {
  const float alpha = 1.0f, beta = 0.0f;
  // Row-major Y[t][rows] = X W^T is column-major Y^T (rows x t) = W (rows x k, stored
  // column-major as k x rows, hence op T) times X^T (k x t).
  return blas_status(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, int(rows), int(a.t), int(a.k), &alpha, w, type,
                                  int(ldw), x, type, int(ldx), &beta, y, CUDA_R_32F, int(a.y_stride),
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     "cublasGemmEx");
}

}  // namespace

bool gemm_supports(GgmlType type) { return dequantize_supports(type); }

size_t gemm_scratch_bytes(const GemmArgs& a, int64_t slab_rows) {
  if (a.n <= 0 || a.k <= 0 || a.t <= 0) return 0;
  size_t bytes = x_copy_bytes(a);
  if (is_quantized(a.type)) bytes += align_up(size_t(slab_rows > 0 && slab_rows < a.n ? slab_rows : a.n) * a.k * 2);
  return bytes;
}

Status gemm(const GemmArgs& a, cublasHandle_t blas, void* scratch, size_t scratch_bytes, cudaStream_t stream) {
  if (!gemm_supports(a.type))
    return Status::invalid("gemm: weight type " + std::string(type_name(a.type)) +
                           " is not supported; supported: f32 f16 bf16 and the types dequantize_rows takes");
  const TypeTraits& tr = traits(a.type);
  if (a.n <= 0 || a.k <= 0 || a.t <= 0 || a.k % tr.block_size != 0 || a.n > 0x7fffffff || a.k > 0x7fffffff ||
      a.t > 0x7fffffff)
    return Status::invalid("gemm: shape t " + std::to_string(a.t) + ", n " + std::to_string(a.n) + ", k " +
                           std::to_string(a.k) + " is not a product of whole " + std::string(tr.name) + " rows");
  if (!a.w || !a.x || !a.y || !blas) return Status::invalid("gemm: w, x, y and the cuBLAS handle must be set");
  if (a.x_stride < a.k || a.y_stride < a.n || a.w_row_bytes < a.k / tr.block_size * int64_t(tr.type_size))
    return Status::invalid("gemm: a row stride is shorter than its row");
  if (!is_quantized(a.type) && a.w_row_bytes % tr.type_size != 0)
    return Status::invalid("gemm: the weight row stride must be a whole number of elements");
  if (Status s = blas_status(cublasSetStream(blas, stream), "cublasSetStream"); !s.ok()) return s;

  if (a.type == GgmlType::F32)
    return product(a, blas, CUDA_R_32F, a.w, a.w_row_bytes / 4, a.n, a.x, a.x_stride, a.y);

  const size_t x_bytes = x_copy_bytes(a);
  // Quantized weights need room for at least one slab of 64 rows (or all rows, if fewer).
  const size_t min_slab = size_t(a.n < 64 ? a.n : 64);
  const size_t min_scratch = x_bytes + (is_quantized(a.type) ? align_up(size_t(a.k) * 2 * min_slab) : 0);
  if (!scratch || scratch_bytes < min_scratch || reinterpret_cast<uintptr_t>(scratch) % kAlign != 0)
    return Status::invalid("gemm: needs at least " + std::to_string(min_scratch) +
                           " bytes of 256-byte aligned scratch (gemm_scratch_bytes), got " +
                           std::to_string(scratch_bytes));

  // X rounded to the weights' half type (bf16 for quantized weights).
  const OutType half = a.type == GgmlType::F16 ? OutType::F16 : OutType::BF16;
  const cudaDataType_t half_type = a.type == GgmlType::F16 ? CUDA_R_16F : CUDA_R_16BF;
  void* x_half = scratch;
  DequantArgs xc;
  xc.type = GgmlType::F32;
  xc.src = a.x;
  xc.src_row_bytes = a.x_stride * 4;
  xc.rows = a.t;
  xc.cols = a.k;
  xc.dst = x_half;
  xc.dst_stride = a.k;
  xc.out = half;
  if (Status s = dequantize_rows(xc, stream); !s.ok()) return s;

  if (!is_quantized(a.type))
    return product(a, blas, half_type, a.w, a.w_row_bytes / 2, a.n, x_half, a.k, a.y);

  // Quantized: slabs of rows (multiples of 64) dequantized to bf16, one product each.
  void* w_half = static_cast<uint8_t*>(scratch) + x_bytes;
  int64_t slab = int64_t((scratch_bytes - x_bytes) / (size_t(a.k) * 2));
  if (slab < a.n) slab = slab / 64 * 64;
  if (slab > a.n) slab = a.n;
  for (int64_t n0 = 0; n0 < a.n; n0 += slab) {
    const int64_t rows = a.n - n0 < slab ? a.n - n0 : slab;
    DequantArgs wd;
    wd.type = a.type;
    wd.src = static_cast<const uint8_t*>(a.w) + n0 * a.w_row_bytes;
    wd.src_row_bytes = a.w_row_bytes;
    wd.rows = rows;
    wd.cols = a.k;
    wd.dst = w_half;
    wd.dst_stride = a.k;
    wd.out = OutType::BF16;
    if (Status s = dequantize_rows(wd, stream); !s.ok()) return s;
    if (Status s = product(a, blas, CUDA_R_16BF, w_half, a.k, rows, x_half, a.k, a.y + n0); !s.ok()) return s;
  }
  return Status();
}

}  // namespace kiln::cuda
