// Prefill GEMM through cuBLAS (see gemm.h).
#include <string>

#include "backend/cuda/dequant.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/gemm_lt.h"

namespace kiln::cuda {
namespace {

constexpr size_t kAlign = 256;
size_t align_up(size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

bool is_quantized(GgmlType t) { return t != GgmlType::F32 && t != GgmlType::F16 && t != GgmlType::BF16; }

Status blas_status(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return Status();
  return Status::from_cuda(cudaErrorUnknown, std::string("gemm: ") + what + " failed: " + cublasGetStatusString(s));
}

// Products of more rows than a decode batch may take the timed cuBLASLt algorithms (gemm_lt.h,
// off by default).
constexpr int64_t kMinTunedTokens = 9;

// X (f32) -> the half type of the product, packed rows of k; then the cuBLASLt workspace.
size_t x_half_bytes(const GemmArgs& a) { return align_up(size_t(a.t) * a.k * 2); }
size_t x_copy_bytes(const GemmArgs& a) { return a.type == GgmlType::F32 ? 0 : x_half_bytes(a) + kLtWorkspaceBytes; }

// A workspace (null for f32 products) lets half products of prefill size take cuBLASLt.
Status product(cublasHandle_t blas, cudaDataType_t type, int64_t t, int64_t k, const void* w, int64_t ldw,
               int64_t rows, const void* x, int64_t ldx, float* y, int64_t ldy, void* workspace = nullptr,
               cudaStream_t stream = nullptr) {
  // Row-major Y[t][rows] = X W^T is column-major Y^T (rows x t) = W (rows x k, stored
  // column-major as k x rows, hence op T) times X^T (k x t).
  LtProduct p;
  p.type = type, p.rows = rows, p.t = t, p.k = k, p.w = w, p.ldw = ldw, p.x = x, p.ldx = ldx, p.y = y, p.ldy = ldy;
  if (workspace && t >= kMinTunedTokens && type != CUDA_R_32F) {
    Status status;
    if (lt_product(p, blas, workspace, kLtWorkspaceBytes, stream, &status)) return status;
  }
  return blas_status(gemm_ex_product(blas, p), "cublasGemmEx");
}
Status product(const GemmArgs& a, cublasHandle_t blas, cudaDataType_t type, const void* w, int64_t ldw,
               int64_t rows, const void* x, int64_t ldx, float* y, void* workspace = nullptr,
               cudaStream_t stream = nullptr) {
  return product(blas, type, a.t, a.k, w, ldw, rows, x, ldx, y, a.y_stride, workspace, stream);
}

// X (f32 rows) rounded into packed rows of the half type.
Status round_x(const float* x, int64_t x_stride, int64_t t, int64_t k, OutType half, void* dst, cudaStream_t stream) {
  DequantArgs xc;
  xc.type = GgmlType::F32;
  xc.src = x;
  xc.src_row_bytes = x_stride * 4;
  xc.rows = t;
  xc.cols = k;
  xc.dst = dst;
  xc.dst_stride = k;
  xc.out = half;
  return dequantize_rows(xc, stream);
}

GgmlType part_type(const GemmPartsArgs& a, const GemmPart& p) { return p.own_row_bytes ? p.own_type : a.type; }
int64_t part_row_bytes(const GemmPartsArgs& a, const GemmPart& p) {
  return p.own_row_bytes ? p.own_row_bytes : a.w_row_bytes;
}

Status cuda_status(cudaError_t e, const char* what) {
  return e == cudaSuccess ? Status() : Status::from_cuda(e, std::string("gemm_parts: ") + what);
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
  if (!a.w || !(a.x || a.x_half) || !a.y || !blas)
    return Status::invalid("gemm: w, x (or x_half), y and the cuBLAS handle must be set");
  if (a.x_half && (a.type == GgmlType::F32 || reinterpret_cast<uintptr_t>(a.x_half) % kAlign != 0))
    return Status::invalid("gemm: a rounded x_half needs half or quantized weights and 256-byte alignment");
  if ((!a.x_half && a.x_stride < a.k) || a.y_stride < a.n ||
      a.w_row_bytes < a.k / tr.block_size * int64_t(tr.type_size))
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
  const void* x_half = a.x_half ? a.x_half : scratch;
  void* workspace = static_cast<uint8_t*>(scratch) + x_half_bytes(a);
  if (!a.x_half)
    if (Status s = round_x(a.x, a.x_stride, a.t, a.k, half, scratch, stream); !s.ok()) return s;

  if (!is_quantized(a.type))
    return product(a, blas, half_type, a.w, a.w_row_bytes / 2, a.n, x_half, a.k, a.y, workspace, stream);

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
    if (Status s = product(a, blas, CUDA_R_16BF, w_half, a.k, rows, x_half, a.k, a.y + n0, workspace, stream);
        !s.ok())
      return s;
  }
  return Status();
}

size_t gemm_parts_scratch_bytes(const GemmPartsArgs& a) {
  if (a.k <= 0 || a.t <= 0) return 0;
  size_t bytes = align_up(size_t(a.t) * a.k * 2) + kMaxGemmLanes * kLtWorkspaceBytes;
  if (is_quantized(a.type))
    for (const GemmPart& p : a.parts) bytes += align_up(size_t(p.n) * a.k * 2);
  return bytes;
}

Status gemm_parts(const GemmPartsArgs& a, const GemmLanes& lanes, void* scratch, size_t scratch_bytes) {
  if (a.type == GgmlType::F32 || !gemm_supports(a.type))
    return Status::invalid("gemm_parts: weight type " + std::string(type_name(a.type)) +
                           " is not supported (f16, bf16 and the types dequantize_rows takes; f32 goes to gemm())");
  if (a.parts.empty() || lanes.count < 1 || lanes.count > kMaxGemmLanes || !lanes.blas[0] ||
      (lanes.count > 1 && !lanes.fork))
    return Status::invalid("gemm_parts: no parts, or lanes without streams, handles or events");
  // Each part's shape, strides and pointers as gemm() checks them.
  for (const GemmPart& p : a.parts) {
    if (p.own_row_bytes && (!is_quantized(a.type) || !is_quantized(p.own_type) || !gemm_supports(p.own_type)))
      return Status::invalid("gemm_parts: a part of its own type " + std::string(type_name(p.own_type)) +
                             " among " + std::string(type_name(a.type)) + " parts (only quantized types mix)");
    const TypeTraits& tr = traits(part_type(a, p));
    if (p.n <= 0 || a.k <= 0 || a.t <= 0 || a.k % tr.block_size != 0 || p.n > 0x7fffffff || a.k > 0x7fffffff ||
        a.t > 0x7fffffff || !p.w || !p.y || (!a.x_half && (!a.x || a.x_stride < a.k)) || p.y_stride < p.n ||
        part_row_bytes(a, p) < a.k / tr.block_size * int64_t(tr.type_size) ||
        (!is_quantized(a.type) && a.w_row_bytes % tr.type_size != 0))
      return Status::invalid("gemm_parts: part of " + std::to_string(p.n) + " rows (k " + std::to_string(a.k) +
                             ", t " + std::to_string(a.t) + ") has a bad shape, stride or pointer");
  }
  const size_t need = gemm_parts_scratch_bytes(a);
  if (!scratch || scratch_bytes < need || reinterpret_cast<uintptr_t>(scratch) % kAlign != 0)
    return Status::invalid("gemm_parts: needs " + std::to_string(need) +
                           " bytes of 256-byte aligned scratch (gemm_parts_scratch_bytes), got " +
                           std::to_string(scratch_bytes));

  cudaStream_t main = lanes.stream[0];
  const bool quantized = is_quantized(a.type);
  const OutType half = a.type == GgmlType::F16 ? OutType::F16 : OutType::BF16;
  const cudaDataType_t half_type = a.type == GgmlType::F16 ? CUDA_R_16F : CUDA_R_16BF;
  if (a.x_half && reinterpret_cast<uintptr_t>(a.x_half) % kAlign != 0)
    return Status::invalid("gemm_parts: a rounded x_half needs 256-byte alignment");
  const void* x_half = a.x_half ? a.x_half : scratch;
  if (!a.x_half)
    if (Status s = round_x(a.x, a.x_stride, a.t, a.k, half, scratch, main); !s.ok()) return s;

  // Every part's weights as bf16 rows in one slab (quantized), or where they are.
  const size_t n_parts = a.parts.size();
  const void* w_of[16];
  int64_t ldw = a.w_row_bytes / 2;
  if (n_parts > 16) return Status::invalid("gemm_parts: at most 16 parts");
  uint8_t* workspaces = static_cast<uint8_t*>(scratch) + align_up(size_t(a.t) * a.k * 2);  // one per lane
  uint8_t* slab = workspaces + kMaxGemmLanes * kLtWorkspaceBytes;
  for (size_t i = 0; i < n_parts; ++i) {
    const GemmPart& p = a.parts[i];
    if (!quantized) {
      w_of[i] = p.w;
      continue;
    }
    DequantArgs wd;
    wd.type = part_type(a, p);
    wd.src = p.w;
    wd.src_row_bytes = part_row_bytes(a, p);
    wd.rows = p.n;
    wd.cols = a.k;
    wd.dst = slab;
    wd.dst_stride = a.k;
    wd.out = OutType::BF16;
    if (Status s = dequantize_rows(wd, main); !s.ok()) return s;
    w_of[i] = slab;
    slab += align_up(size_t(p.n) * a.k * 2);
  }
  if (quantized) ldw = a.k;

  // Parts whose weights and outputs lie side by side: one product of all their rows.
  if (a.join && n_parts > 1) {
    bool joined = true;
    int64_t rows = a.parts[0].n;
    for (size_t i = 1; i < n_parts && joined; ++i) {
      const GemmPart& prev = a.parts[i - 1];
      const GemmPart& p = a.parts[i];
      joined = w_of[i] == static_cast<const uint8_t*>(w_of[i - 1]) + size_t(prev.n) * size_t(ldw) * 2 &&
               p.y == prev.y + prev.n && p.y_stride == prev.y_stride;
      rows += p.n;
    }
    if (joined && rows <= a.parts[0].y_stride && rows <= 0x7fffffff) {
      if (Status s = blas_status(cublasSetStream(lanes.blas[0], main), "cublasSetStream"); !s.ok()) return s;
      return product(lanes.blas[0], half_type, a.t, a.k, w_of[0], ldw, rows, x_half, a.k, a.parts[0].y,
                     a.parts[0].y_stride, workspaces, main);
    }
  }

  // Side by side only once every part's algorithm is chosen: timing wants the GPU alone.
  bool all_planned = true;
  for (size_t i = 0; i < n_parts; ++i) {
    LtProduct p;
    p.type = half_type, p.rows = a.parts[i].n, p.t = a.t, p.k = a.k, p.w = w_of[i], p.ldw = ldw;
    p.x = x_half, p.ldx = a.k, p.y = a.parts[i].y, p.ldy = a.parts[i].y_stride;
    all_planned = all_planned && (a.t < kMinTunedTokens || lt_planned(p));
  }
  const int lanes_used = all_planned ? int(n_parts < size_t(lanes.count) ? n_parts : size_t(lanes.count)) : 1;
  if (lanes_used > 1)
    if (Status s = cuda_status(cudaEventRecord(lanes.fork, main), "cudaEventRecord (fork)"); !s.ok()) return s;
  for (int lane = 1; lane < lanes_used; ++lane)
    if (Status s = cuda_status(cudaStreamWaitEvent(lanes.stream[lane], lanes.fork, 0), "cudaStreamWaitEvent");
        !s.ok())
      return s;
  for (size_t i = 0; i < n_parts; ++i) {
    const int lane = int(i % size_t(lanes_used));
    cublasHandle_t blas = lanes.blas[lane];
    if (Status s = blas_status(cublasSetStream(blas, lane == 0 ? main : lanes.stream[lane]), "cublasSetStream");
        !s.ok())
      return s;
    const GemmPart& p = a.parts[i];
    cudaStream_t stream = lane == 0 ? main : lanes.stream[lane];
    if (Status s = product(blas, half_type, a.t, a.k, w_of[i], ldw, p.n, x_half, a.k, p.y, p.y_stride,
                           workspaces + size_t(lane) * kLtWorkspaceBytes, stream);
        !s.ok())
      return s;
  }
  for (int lane = 1; lane < lanes_used; ++lane) {
    if (Status s = cuda_status(cudaEventRecord(lanes.join[lane], lanes.stream[lane]), "cudaEventRecord (join)");
        !s.ok())
      return s;
    if (Status s = cuda_status(cudaStreamWaitEvent(main, lanes.join[lane], 0), "cudaStreamWaitEvent (join)"); !s.ok())
      return s;
  }
  return Status();
}

}  // namespace kiln::cuda
