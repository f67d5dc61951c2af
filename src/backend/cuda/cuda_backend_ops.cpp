// The CUDA backend's ops: argument checks on the host (throwing, naming the op), then a
// launch closure handed to the step recorder (graph.h), which runs it now or in a graph.
// Closures capture only plain values (pointers, sizes), never the caller's Tensors. Rope,
// the KV cache and attention are in cuda_backend_attention.cpp; the fused decode products
// in cuda_backend_fused.cpp.
#include <algorithm>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_backend_checks.h"
#include "backend/cuda/dequant.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/matvec.h"
#include "backend/cuda/matvec_f16_grouped.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/ops_extra.h"
#include "backend/op_checks.h"

namespace kiln {

using namespace cuda_ops;

void CudaBackend::get_rows(const Tensor& table, const Tensor& ids, Tensor& out) {
  require_f32(out, "get_rows", "out");
  require_device(table, "get_rows", "table");
  KILN_CHECK(ids.dtype == GgmlType::I32 && ids.elements() == out.rows(), "cuda get_rows: {} ids for {} output rows",
             ids.elements(), out.rows());
  KILN_CHECK(table.ne[0] == out.ne[0], "cuda get_rows: table {} {} rows are not {} wide", table.name,
             table.describe(), out.ne[0]);
  KILN_CHECK(cuda::dequantize_supports(table.dtype), "cuda get_rows: table {} of type {} has no device dequantizer",
             table.name, type_name(table.dtype));
  const GgmlType type = table.dtype;
  const void* src = table.data;
  const int64_t row_bytes = int64_t(table.nb[1]), n_rows = table.rows(), cols = out.ne[0], n = out.rows();
  const int32_t* id = ids.as<int32_t>();
  float* dst = out.as<float>();
  const int64_t stride = stride_of(out, "get_rows", "out");
  record(Sig(Op::GetRows).t(table).t(ids).t(out).h, n, [=](cudaStream_t s) {
    return cuda::get_rows(type, src, row_bytes, n_rows, cols, id, n, dst, stride, s);
  }, "get_rows");
}

uint8_t* CudaBackend::q8_for_next_matmul(int64_t cols, int64_t rows, int64_t* row_bytes) {
  if (options_.exact || !options_.fused || rows > kMatvecMaxTokens || cols % 32 != 0 || cols < 512) return nullptr;
  *row_bytes = int64_t(q8_row_bytes(cols));
  return static_cast<uint8_t*>(scratch(q8_scratch_, size_t(*row_bytes) * kMatvecMaxTokens));
}

void CudaBackend::remember_q8(const float* x, int64_t cols, int64_t rows, int64_t stride, uint8_t* q8) {
  if (q8) quantized_input_ = QuantizedInput{x, cols, rows, stride, q8};
}

void CudaBackend::rmsnorm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) {
  if (pending_add_ && same_view(pending_add_->residual, x) && out.data != x.data &&
      out.data != pending_add_->out.data) {
    PendingAdd p = std::move(*pending_add_);  // x is that residual: add, then norm, in one op
    pending_add_.reset();
    return add_rmsnorm(p.out, p.residual, weight, eps, out);
  }
  require_f32(x, "rmsnorm", "x");
  require_f32(out, "rmsnorm", "out");
  same_shape(x, out, "rmsnorm");
  if (!weight.empty()) require_f32(weight, "rmsnorm", "weight");
  KILN_CHECK(weight.empty() || weight.elements() == x.ne[0], "cuda rmsnorm: weight {} has {} elements, rows have {}",
             weight.name, weight.elements(), x.ne[0]);
  cuda::RmsNormArgs a;
  a.x = x.as<float>(), a.x_stride = stride_of(x, "rmsnorm", "x");
  a.weight = weight.empty() ? nullptr : weight.as<float>();
  a.eps = eps, a.rows = x.rows(), a.dim = x.ne[0];
  a.y = out.as<float>(), a.y_stride = stride_of(out, "rmsnorm", "out");
  a.q8 = q8_for_next_matmul(a.dim, a.rows, &a.q8_row_bytes);
  // Heads as rows ({head_dim, heads, T}, the q/k norms of qwen3): T tokens, not heads * T rows,
  // or a one-token decode pass of 32 heads counts as 32 tokens and is never graphed.
  const int64_t tokens = x.n_dims >= 3 ? x.ne[2] * x.ne[3] : x.rows();
  const Sig sig = Sig(Op::RmsNorm).t(x).t(weight).t(out).v(eps).v(a.q8);
  if (record_norm(a, sig.h, tokens, "rmsnorm")) remember_q8(a.y, a.dim, a.rows, a.y_stride, a.q8);
}

bool CudaBackend::record_norm(const cuda::RmsNormArgs& a, const cuda::SignatureHash& sig, int64_t tokens,
                              const char* op) {
  if (holds_half_sources(tokens) && cuda::rmsnorm_writes_half(a)) {  // (never with an int8 copy)
    hold_half_source({sig, tokens, op, a.y, a.dim, a.rows, a.y_stride,
                      [a](cudaStream_t s, void* half, bool bf16) {
                        cuda::RmsNormArgs with_copy = a;
                        with_copy.y_half = half, with_copy.y_half_bf16 = bf16;
                        return cuda::rmsnorm(with_copy, s);
                      }});
    return false;
  }
  record(sig, tokens, [=](cudaStream_t s) { return cuda::rmsnorm(a, s); }, op);
  return true;
}

void CudaBackend::add_rmsnorm(const Tensor& x, Tensor& residual, const Tensor& weight, float eps, Tensor& out) {
  require_f32(x, "add_rmsnorm", "x");
  require_f32(residual, "add_rmsnorm", "residual");
  require_f32(out, "add_rmsnorm", "out");
  same_shape(x, residual, "add_rmsnorm");
  same_shape(x, out, "add_rmsnorm");
  if (!weight.empty()) require_f32(weight, "add_rmsnorm", "weight");
  cuda::RmsNormArgs a;
  a.x = x.as<float>(), a.x_stride = stride_of(x, "add_rmsnorm", "x");
  a.residual = residual.as<float>(), a.residual_stride = stride_of(residual, "add_rmsnorm", "residual");
  a.weight = weight.empty() ? nullptr : weight.as<float>();
  a.eps = eps, a.rows = x.rows(), a.dim = x.ne[0];
  a.y = out.as<float>(), a.y_stride = stride_of(out, "add_rmsnorm", "out");
  a.q8 = q8_for_next_matmul(a.dim, a.rows, &a.q8_row_bytes);
  const Sig sig = Sig(Op::AddRmsNorm).t(x).t(residual).t(weight).t(out).v(eps).v(a.q8);
  if (record_norm(a, sig.h, x.rows(), "add_rmsnorm")) remember_q8(a.y, a.dim, a.rows, a.y_stride, a.q8);
}

void CudaBackend::add_bias(const Tensor& bias, Tensor& out) {
  if (bias.empty()) return;
  require_f32(bias, "matmul", "bias");
  KILN_CHECK(bias.elements() == out.ne[0], "cuda matmul: bias {} has {} elements for {} outputs", bias.name,
             bias.elements(), out.ne[0]);
  add(out, bias.reshape({bias.elements(), 1}), out);
}

void CudaBackend::matmul(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& out) {
  require_f32(x, "matmul", "x");
  require_f32(out, "matmul", "out");
  require_device(w, "matmul", "weight");
  KILN_CHECK(w.ne[0] == x.ne[0] && w.ne[2] == 1 && w.ne[3] == 1,
             "cuda matmul: weight {} {} does not take rows of {} (x {})", w.name, w.describe(), x.ne[0], x.name);
  KILN_CHECK(out.ne[0] == w.ne[1] && out.rows() == x.rows() && x.ne[2] == 1 && out.ne[2] == 1,
             "cuda matmul: out {} {} is not [{}, {}] for weight {}", out.name, out.describe(), w.ne[1], x.rows(),
             w.name);
  const bool float_weights = w.dtype == GgmlType::F32 || w.dtype == GgmlType::F16 || w.dtype == GgmlType::BF16;
  if (options_.exact && w.dtype != GgmlType::F32) return matmul_exact(x, w, bias, out);
  const int64_t T = x.ne[1], N = w.ne[1], K = w.ne[0];
  const float* xp = x.as<float>();
  float* yp = out.as<float>();
  const int64_t xs = int64_t(x.nb[1] / 4), ys = int64_t(out.nb[1] / 4);
  const GgmlType type = w.dtype;
  const void* wp = w.data;
  const int64_t w_row = int64_t(w.nb[1]);

  if (T <= kMatvecMaxTokens && cuda::matvec_supports(type) && !float_weights) {
    const float* bp = nullptr;
    if (!bias.empty()) {
      require_f32(bias, "matmul", "bias");
      KILN_CHECK(bias.elements() == N, "cuda matmul: bias {} has {} elements for {} outputs", bias.name,
                 bias.elements(), N);
      bp = bias.as<float>();
    }
    // One int8 copy of each input row, kept for the matmuls that follow over the same x.
    const size_t per_token = q8_row_bytes(K);
    auto* q8 = static_cast<uint8_t*>(scratch(q8_scratch_, per_token * kMatvecMaxTokens));
    const QuantizedInput input{xp, K, T, xs, q8};
    const bool reuse = quantized_input_ == input;
    record(Sig(Op::Matmul).t(x).t(w).t(bias).t(out).v(reuse).h, T, [=](cudaStream_t s) {
      for (int64_t t = 0; t < T; ++t) {
        const cuda::Q8Vector xq = cuda::q8_vector_in(q8 + size_t(t) * per_token, K);
        if (!reuse)
          if (cuda::Status st = cuda::quantize_q8(xp + t * xs, K, xq, s); !st.ok()) return st;
        cuda::MatvecArgs a;
        a.type = type, a.w = wp, a.w_row_bytes = w_row, a.rows = N, a.cols = K;
        a.x = xp + t * xs, a.add = bp, a.y = yp + t * ys;
        if (cuda::Status st = cuda::matvec_q8(a, xq, s); !st.ok()) return st;
      }
      return cuda::Status();
    }, "matmul");
    // Keep the int8 copy unless this product overwrote its own input.
    const auto* x_begin = reinterpret_cast<const uint8_t*>(xp);
    const auto* x_end = x_begin + size_t((T - 1) * xs + K) * sizeof(float);
    const auto* y_begin = reinterpret_cast<const uint8_t*>(yp);
    const auto* y_end = y_begin + size_t((T - 1) * ys + N) * sizeof(float);
    if (y_end <= x_begin || x_end <= y_begin) quantized_input_ = input;
    return;
  }
  if (T <= kMatvecMaxTokens && cuda::matvec_supports(type)) {
    const size_t need = cuda::matvec_scratch_bytes(type, K);
    void* sp = need ? scratch(matmul_scratch_, need) : nullptr;
    const float* bp = nullptr;
    if (!bias.empty()) {
      require_f32(bias, "matmul", "bias");
      KILN_CHECK(bias.elements() == N, "cuda matmul: bias {} has {} elements for {} outputs", bias.name,
                 bias.elements(), N);
      bp = bias.as<float>();
    }
    // f16 / bf16 weights (the lm_head of a 16-bit model): the grouped kernel with one part,
    // which requests its first weights before waiting for the kernel that writes x. Its
    // blocks stage x into shared memory, so y must not overlap x.
    const bool half = (type == GgmlType::F16 || type == GgmlType::BF16) && options_.fused;
    const auto* x_begin = reinterpret_cast<const uint8_t*>(xp);
    const auto* x_end = x_begin + size_t((T - 1) * xs + K) * sizeof(float);
    const auto* y_begin = reinterpret_cast<const uint8_t*>(yp);
    const auto* y_end = y_begin + size_t((T - 1) * ys + N) * sizeof(float);
    cuda::MatvecPart part{wp, N, bp, yp, nullptr};
    cuda::F32Input in;
    in.x = xp;
    if (half && xs % 4 == 0 && (y_end <= x_begin || x_end <= y_begin) &&
        cuda::matvec_half_parts_fit(type, K, w_row, std::span(&part, 1), in)) {
      record(Sig(Op::Matmul).t(x).t(w).t(bias).t(out).v(half).h, T, [=](cudaStream_t s) {
        for (int64_t t = 0; t < T; ++t) {
          cuda::MatvecPart row = part;
          row.y = yp + t * ys;
          cuda::F32Input token_in;
          token_in.x = xp + t * xs;
          if (cuda::Status st = cuda::matvec_half_parts(type, K, w_row, std::span(&row, 1), token_in, s); !st.ok())
            return st;
        }
        return cuda::Status();
      }, "matmul");
      return;
    }
    record(Sig(Op::Matmul).t(x).t(w).t(bias).t(out).h, T, [=](cudaStream_t s) {
      for (int64_t t = 0; t < T; ++t) {
        cuda::MatvecArgs a;
        a.type = type, a.w = wp, a.w_row_bytes = w_row, a.rows = N, a.cols = K;
        a.x = xp + t * xs, a.add = bp, a.y = yp + t * ys;
        if (cuda::Status st = cuda::matvec(a, sp, need, s); !st.ok()) return st;
      }
      return cuda::Status();
    }, "matmul");
    return;
  }
  KILN_CHECK(cuda::gemm_supports(type), "cuda matmul: weight {} of type {} is not supported on the device", w.name,
             type_name(type));
  cuda::GemmArgs g;
  g.type = type, g.w = wp, g.w_row_bytes = w_row, g.n = N, g.k = K;
  g.x = xp, g.x_stride = xs, g.t = T, g.y = yp, g.y_stride = ys;
  const int64_t slab = float_weights ? 0 : std::max<int64_t>(64, int64_t(kSlabBytes / (size_t(K) * 2)) / 64 * 64);
  g.x_half = record_half_source_for(xp, K, T, xs, type);  // the attention's copy, before o
  const size_t need = cuda::gemm_scratch_bytes(g, slab);
  void* sp = need ? scratch(matmul_scratch_, need) : nullptr;
  cublasHandle_t blas = blas_;
  record(Sig(Op::Matmul).t(x).t(w).t(out).v(g.x_half).h, T,
         [=](cudaStream_t s) { return cuda::gemm(g, blas, sp, need, s); }, "matmul");
  add_bias(bias, out);
}

// Exact mode: weights dequantized to f32 in slabs, each slab one f32 product (no TF32).
void CudaBackend::matmul_exact(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& out) {
  KILN_CHECK(cuda::dequantize_supports(w.dtype), "cuda matmul: weight {} of type {} has no device dequantizer",
             w.name, type_name(w.dtype));
  const int64_t T = x.ne[1], N = w.ne[1], K = w.ne[0];
  const int64_t slab = std::min<int64_t>(N, std::max<int64_t>(64, int64_t(kSlabBytes / (size_t(K) * 4))));
  float* sp = static_cast<float*>(scratch(matmul_scratch_, size_t(slab) * size_t(K) * 4));
  const GgmlType type = w.dtype;
  const auto* wp = static_cast<const uint8_t*>(w.data);
  const int64_t w_row = int64_t(w.nb[1]);
  const float* xp = x.as<float>();
  float* yp = out.as<float>();
  const int64_t xs = int64_t(x.nb[1] / 4), ys = int64_t(out.nb[1] / 4);
  cublasHandle_t blas = blas_;
  record(Sig(Op::Matmul).t(x).t(w).t(out).v(true).h, T, [=](cudaStream_t s) {
    for (int64_t n0 = 0; n0 < N; n0 += slab) {
      const int64_t rows = std::min(slab, N - n0);
      cuda::DequantArgs d;
      d.type = type, d.src = wp + n0 * w_row, d.src_row_bytes = w_row, d.rows = rows, d.cols = K;
      d.dst = sp, d.dst_stride = K, d.out = cuda::OutType::F32;
      if (cuda::Status st = cuda::dequantize_rows(d, s); !st.ok()) return st;
      cuda::GemmArgs g;
      g.type = GgmlType::F32, g.w = sp, g.w_row_bytes = K * 4, g.n = rows, g.k = K;
      g.x = xp, g.x_stride = xs, g.t = T, g.y = yp + n0, g.y_stride = ys;
      if (cuda::Status st = cuda::gemm(g, blas, nullptr, 0, s); !st.ok()) return st;
    }
    return cuda::Status();
  }, "matmul");
  add_bias(bias, out);
}

void CudaBackend::glu(const Tensor& gate, const Tensor& up, const GluParams& p, Tensor& out) {
  require_f32(gate, "glu", "gate");
  require_f32(up, "glu", "up");
  require_f32(out, "glu", "out");
  same_shape(gate, up, "glu");
  same_shape(gate, out, "glu");
  cuda::GluArgs a;
  a.kind = glu_kind(p.act);
  a.gate = gate.as<float>(), a.gate_stride = stride_of(gate, "glu", "gate");
  a.up = up.as<float>(), a.up_stride = stride_of(up, "glu", "up");
  a.rows = gate.rows(), a.n = gate.ne[0];
  a.out = out.as<float>(), a.out_stride = stride_of(out, "glu", "out");
  a.alpha = p.alpha, a.limit = p.limit;
  const Sig sig = Sig(Op::Glu).t(gate).t(up).t(out).v(p.act).v(p.alpha).v(p.limit);
  // Right after held gate/up products (f16 / bf16, or int8 over f32 x): in their launch's
  // epilogue where it can.
  if (fuse_glu_into_products(gate, up, a, sig.h)) return;
  if (cuda::glu_can_quantize(a)) a.q8 = q8_for_next_matmul(a.n, a.rows, &a.q8_row_bytes);
  record(Sig(sig).v(a.q8).h, gate.rows(),
         [=](cudaStream_t s) { return cuda::glu(a, s); }, "glu");
  remember_q8(a.out, a.n, a.rows, a.out_stride, a.q8);
}

void CudaBackend::softmax(const Tensor& x, Tensor& out) {
  require_f32(x, "softmax", "x");
  require_f32(out, "softmax", "out");
  same_shape(x, out, "softmax");
  const cuda::RowLayout lx = layout_of(x), lo = layout_of(out);
  const int64_t rows = x.rows(), n = x.ne[0];
  record(Sig(Op::Softmax).t(x).t(out).h, rows, [=](cudaStream_t s) { return cuda::softmax_rows(lx, lo, rows, n, s); },
         "softmax");
}

void CudaBackend::add(const Tensor& a, const Tensor& b, Tensor& out) {
  require_f32(a, "add", "a");
  require_f32(b, "add", "b");
  require_f32(out, "add", "out");
  same_shape(a, out, "add");
  KILN_CHECK(b.ne[0] == a.ne[0] && (b.rows() == a.rows() || b.rows() == 1), "cuda add: {} {} does not fit {} {}",
             b.name, b.describe(), a.name, a.describe());
  cuda::EltwiseArgs e;
  e.kind = cuda::EltwiseKind::Add;
  e.a = layout_of(a), e.b = layout_of(b), e.out = layout_of(out);
  e.rows = a.rows(), e.n = a.ne[0], e.b_one_row = b.rows() == 1 && a.rows() != 1;
  record(Sig(Op::Add).t(a).t(b).t(out).h, a.rows(), [=](cudaStream_t s) { return cuda::eltwise(e, s); }, "add");
}

void CudaBackend::scale(const Tensor& x, float factor, Tensor& out) {
  require_f32(x, "scale", "x");
  require_f32(out, "scale", "out");
  same_shape(x, out, "scale");
  cuda::EltwiseArgs e;
  e.kind = cuda::EltwiseKind::Scale;
  e.a = layout_of(x), e.out = layout_of(out), e.rows = x.rows(), e.n = x.ne[0], e.value = factor;
  record(Sig(Op::Scale).t(x).t(out).v(factor).h, x.rows(), [=](cudaStream_t s) { return cuda::eltwise(e, s); },
         "scale");
}

void CudaBackend::softcap(const Tensor& x, float cap, Tensor& out) {
  require_f32(x, "softcap", "x");
  require_f32(out, "softcap", "out");
  same_shape(x, out, "softcap");
  KILN_CHECK(cap > 0, "cuda softcap: cap {} must be positive", cap);
  cuda::EltwiseArgs e;
  e.kind = cuda::EltwiseKind::SoftCap;
  e.a = layout_of(x), e.out = layout_of(out), e.rows = x.rows(), e.n = x.ne[0], e.value = cap;
  record(Sig(Op::SoftCap).t(x).t(out).v(cap).h, x.rows(), [=](cudaStream_t s) { return cuda::eltwise(e, s); },
         "softcap");
}

void CudaBackend::moe_route(const Tensor& logits, const MoeRouteParams& p, Tensor& ids, Tensor& weights) {
  const cuda::MoeRouteArgs a = moe_route_args(logits, p, ids, weights, "moe_route");
  Sig sig(Op::MoeRoute);
  sig.t(logits).t(ids).t(weights).v(p.n_used).v(p.gating).v(p.normalize).v(p.scale).v(a.selection_bias);
  record(sig.h, logits.rows(), [=](cudaStream_t s) { return cuda::moe_route(a, s); }, "moe_route");
}

void CudaBackend::argmax(const Tensor& x, Tensor& out) {
  require_f32(x, "argmax", "x");
  KILN_CHECK(out.dtype == GgmlType::I32 && out.elements() == x.rows() && out.device == Device::Cuda,
             "cuda argmax: out {} {} is not a device I32 [{}]", out.name, out.describe(), x.rows());
  flush_pending();
  PendingArgmax a;
  a.x = x.as<float>();
  a.stride = stride_of(x, "argmax", "x"), a.rows = x.rows(), a.n = x.ne[0];
  a.out = out.as<int32_t>();
  a.scratch_bytes = cuda::argmax_scratch_bytes(a.rows, a.n);
  a.scratch = a.scratch_bytes ? scratch(argmax_scratch_, a.scratch_bytes) : nullptr;
  a.sig = Sig(Op::Argmax).t(x).t(out).h;
  pending_argmax_ = a;  // recorded by the next op, sync point or download_async
}

void CudaBackend::record_held_argmax(int32_t* host_out) {
  const PendingArgmax a = *pending_argmax_;
  pending_argmax_.reset();  // before record(), which records whatever is still held
  cuda::SignatureHash sig = a.sig;
  sig.pod(host_out);
  record(sig, a.rows,
         [=](cudaStream_t s) {
           return cuda::argmax_rows(a.x, a.stride, a.rows, a.n, a.out, a.scratch, a.scratch_bytes, s, host_out);
         },
         "argmax");
}

}  // namespace kiln
