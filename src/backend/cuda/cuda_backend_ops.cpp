// The CUDA backend's ops: argument checks on the host (throwing, naming the op), then a
// launch closure handed to the step recorder (graph.h), which runs it now or in a graph.
// Closures capture only plain values (pointers, sizes), never the caller's Tensors.
#include <algorithm>
#include <tuple>

#include "backend/cuda/attention.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/dequant.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/matvec.h"
#include "backend/cuda/matvec_f16_grouped.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/ops_extra.h"
#include "backend/cuda/prefill_attention.h"
#include "backend/cuda/rope_store.h"
#include "backend/op_checks.h"

namespace kiln {

namespace cuda_ops {

using cuda::SignatureHash;

constexpr int64_t kMatvecMaxTokens = 8;                 // up to this many rows: one matvec per row
constexpr int64_t kPrefillAttentionMinTokens = 16;      // from this many tokens of one sequence: tensor-core tiles
constexpr size_t kSlabBytes = size_t(256) << 20;        // dequantized weight slab of prefill / exact products

void require_f32(const Tensor& t, const char* op, const char* what) {
  KILN_CHECK(!t.empty(), "cuda {}: {} is missing", op, what);
  KILN_CHECK(t.dtype == GgmlType::F32 && t.nb[0] == sizeof(float), "cuda {}: {} ({} {}) must be f32 with packed rows",
             op, what, t.name, t.describe());
  KILN_CHECK(t.device == Device::Cuda, "cuda {}: {} ({}) is not in device memory", op, what, t.name);
}

// The KV cache: f32 or f16 rows, k and v of one type.
void require_cache(const KvLayer& cache, const char* op) {
  for (const Tensor* t : {&cache.k, &cache.v}) {
    KILN_CHECK(!t->empty() && t->device == Device::Cuda, "cuda {}: cache {} is missing or not in device memory", op,
               t->name);
    KILN_CHECK((t->dtype == GgmlType::F32 || t->dtype == GgmlType::F16) && t->nb[0] == traits(t->dtype).type_size,
               "cuda {}: cache {} ({}) must be f32 or f16 with packed rows", op, t->name, t->describe());
  }
  KILN_CHECK(cache.k.dtype == cache.v.dtype, "cuda {}: cache k is {}, cache v {}", op, type_name(cache.k.dtype),
             type_name(cache.v.dtype));
}

// Elements between the cache's slots.
int64_t slot_stride(const Tensor& cache) { return int64_t(cache.nb[1] / cache.nb[0]); }

void require_device(const Tensor& t, const char* op, const char* what) {
  KILN_CHECK(!t.empty() && t.device == Device::Cuda, "cuda {}: {} ({}) is missing or not in device memory", op, what,
             t.name);
}

// Rows spaced evenly (dims 1..3 flatten to one stride): the stride in floats, else -1.
int64_t even_stride(const Tensor& t) {
  const int64_t s1 = int64_t(t.nb[1] / sizeof(float));
  if (t.ne[2] > 1 && t.nb[2] != t.nb[1] * size_t(t.ne[1])) return -1;
  if (t.ne[3] > 1 && t.nb[3] != t.nb[2] * size_t(t.ne[2])) return -1;
  return s1;
}

int64_t stride_of(const Tensor& t, const char* op, const char* what) {
  const int64_t s = even_stride(t);
  KILN_CHECK(s >= 0, "cuda {}: {} ({} {}) rows are not evenly spaced", op, what, t.name, t.describe());
  return s;
}

cuda::RowLayout layout_of(const Tensor& t) {
  cuda::RowLayout l;
  l.base = static_cast<float*>(t.data);
  l.ne1 = t.ne[1], l.ne2 = t.ne[2];
  l.s1 = int64_t(t.nb[1] / 4), l.s2 = int64_t(t.nb[2] / 4), l.s3 = int64_t(t.nb[3] / 4);
  return l;
}

void same_shape(const Tensor& a, const Tensor& b, const char* op) {
  KILN_CHECK(a.ne[0] == b.ne[0] && a.rows() == b.rows(), "cuda {}: shapes differ: {} is {}, {} is {}", op, a.name,
             a.describe(), b.name, b.describe());
}

// Signature of an op: its name and every tensor and scalar it was called with.
struct Sig {
  SignatureHash h;
  explicit Sig(Op op) { h.pod(op); }
  Sig& t(const Tensor& x) {
    h.pod(x.dtype), h.pod(x.data), h.bytes(x.ne, sizeof(x.ne)), h.bytes(x.nb, sizeof(x.nb));
    return *this;
  }
  template <typename T>
  Sig& v(const T& x) {
    h.pod(x);
    return *this;
  }
};

// Bytes per token of the int8 input copies (the same for every quantized weight type).
size_t q8_row_bytes(int64_t cols) { return (cuda::matvec_scratch_bytes(GgmlType::Q4_0, cols) + 255) / 256 * 256; }

// The same tensor view: data, type, shape and strides.
bool same_view(const Tensor& a, const Tensor& b) {
  return a.data == b.data && a.dtype == b.dtype && std::equal(std::begin(a.ne), std::end(a.ne), std::begin(b.ne)) &&
         std::equal(std::begin(a.nb), std::end(a.nb), std::begin(b.nb));
}

}  // namespace cuda_ops

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
  record(Sig(Op::RmsNorm).t(x).t(weight).t(out).v(eps).v(a.q8).h, tokens,
         [=](cudaStream_t s) { return cuda::rmsnorm(a, s); }, "rmsnorm");
  remember_q8(a.y, a.dim, a.rows, a.y_stride, a.q8);
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
  record(Sig(Op::AddRmsNorm).t(x).t(residual).t(weight).t(out).v(eps).v(a.q8).h, x.rows(),
         [=](cudaStream_t s) { return cuda::rmsnorm(a, s); }, "add_rmsnorm");
  remember_q8(a.y, a.dim, a.rows, a.y_stride, a.q8);
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
  const size_t need = cuda::gemm_scratch_bytes(g, slab);
  void* sp = need ? scratch(matmul_scratch_, need) : nullptr;
  cublasHandle_t blas = blas_;
  record(Sig(Op::Matmul).t(x).t(w).t(out).h, T, [=](cudaStream_t s) { return cuda::gemm(g, blas, sp, need, s); },
         "matmul");
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

namespace cuda_ops {

cuda::RopeArgs rope_args(Tensor& x, const Tensor& positions, const RopeParams& p) {
  require_f32(x, "rope", "x");
  KILN_CHECK(positions.dtype == GgmlType::I32 && positions.elements() == x.ne[2],
             "cuda rope: {} positions for {} tokens", positions.elements(), x.ne[2]);
  cuda::RopeArgs a;
  a.x = x.as<float>();
  a.token_stride = int64_t(x.nb[2] / 4), a.head_stride = int64_t(x.nb[1] / 4);
  a.n_tokens = x.ne[2], a.n_heads = x.ne[1], a.head_dim = x.ne[0];
  a.positions = positions.as<int32_t>();
  a.n_rot = p.n_rot, a.neox = p.style == RopeStyle::Neox;
  a.freq_base = p.freq_base, a.freq_scale = p.freq_scale;
  if (p.freq_factors) {
    require_f32(*p.freq_factors, "rope", "freq_factors");
    a.freq_factors = p.freq_factors->as<float>();
  }
  a.ext_factor = p.yarn.ext_factor, a.attn_factor = p.yarn.attn_factor;
  a.beta_fast = p.yarn.beta_fast, a.beta_slow = p.yarn.beta_slow, a.n_ctx_orig = p.yarn.n_ctx_orig;
  a.yarn_truncate = p.yarn.truncate;
  return a;
}

void hash_rope(Sig& sig, const RopeParams& p, const cuda::RopeArgs& a) {
  sig.v(a.freq_factors).v(p.n_rot).v(p.style).v(p.freq_base).v(p.freq_scale);
  sig.v(p.yarn.ext_factor).v(p.yarn.attn_factor).v(p.yarn.beta_fast).v(p.yarn.beta_slow).v(p.yarn.n_ctx_orig).v(p.yarn.truncate);
}

cuda::KvStoreArgs kv_store_args(const Tensor& k, const Tensor& v, KvLayer& cache, const Tensor& slots) {
  require_f32(k, "kv_store", "k");
  require_f32(v, "kv_store", "v");
  require_cache(cache, "kv_store");
  KILN_CHECK(k.ne[0] == cache.k.ne[0] && v.ne[0] == cache.v.ne[0],
             "cuda kv_store: k {} / v {} rows do not match the cache's {} / {}", k.describe(), v.describe(),
             cache.k.ne[0], cache.v.ne[0]);
  KILN_CHECK(slots.dtype == GgmlType::I32 && slots.elements() == k.ne[1] && v.ne[1] == k.ne[1],
             "cuda kv_store: {} slots for {} tokens", slots.elements(), k.ne[1]);
  cuda::KvStoreArgs a;
  a.k = k.as<float>(), a.k_stride = int64_t(k.nb[1] / 4), a.k_width = k.ne[0];
  a.v = v.as<float>(), a.v_stride = int64_t(v.nb[1] / 4), a.v_width = v.ne[0];
  a.cache_k = cache.k.data, a.cache_v = cache.v.data, a.cache_type = cache.k.dtype;
  a.cache_k_stride = slot_stride(cache.k), a.cache_v_stride = slot_stride(cache.v);
  a.n_slots = cache.k.ne[1];
  a.slots = slots.as<int32_t>(), a.n_tokens = k.ne[1];
  return a;
}

}  // namespace cuda_ops

void CudaBackend::rope(Tensor& x, const Tensor& positions, const RopeParams& p) {
  const cuda::RopeArgs a = rope_args(x, positions, p);
  Sig sig(Op::Rope);
  sig.t(x).t(positions);
  hash_rope(sig, p, a);
  record(sig.h, x.ne[2], [=](cudaStream_t s) { return cuda::rope(a, s); }, "rope");
}

void CudaBackend::kv_store(const Tensor& k, const Tensor& v, KvLayer& cache, const Tensor& slots) {
  const cuda::KvStoreArgs a = kv_store_args(k, v, cache, slots);
  record(Sig(Op::KvStore).t(k).t(v).t(cache.k).t(cache.v).t(slots).h, k.ne[1],
         [=](cudaStream_t s) { return cuda::kv_store(a, s); }, "kv_store");
}

void CudaBackend::rope_kv_store(Tensor& q_heads, Tensor& k_heads, const Tensor& v, const Tensor& positions,
                                const RopeParams& p, KvLayer& cache, const Tensor& slots) {
  // Prefill measured faster with the three kernels (pp512 -4.7% with the fused one at T=512).
  if (q_heads.ne[2] > kMatvecMaxTokens || !record_rope_store(q_heads, k_heads, v, positions, p, cache, slots, {}))
    Backend::rope_kv_store(q_heads, k_heads, v, positions, p, cache, slots);
}

void CudaBackend::norm_rope_kv_store(Tensor& q_heads, Tensor& k_heads, const Tensor& v, const Tensor& q_norm,
                                     const Tensor& k_norm, float eps, const Tensor& positions, const RopeParams& p,
                                     KvLayer& cache, const Tensor& slots) {
  cuda::HeadNorms norms;
  norms.eps = eps;
  bool fits = q_heads.ne[2] <= kMatvecMaxTokens;
  for (auto [w, dst, heads] : {std::tuple{&q_norm, &norms.q, &q_heads}, std::tuple{&k_norm, &norms.k, &k_heads}}) {
    if (w->empty()) continue;
    require_f32(*w, "norm_rope_kv_store", "norm weight");
    fits = fits && w->elements() == heads->ne[0];
    *dst = w->as<float>();
  }
  if (!fits || !record_rope_store(q_heads, k_heads, v, positions, p, cache, slots, norms))
    Backend::norm_rope_kv_store(q_heads, k_heads, v, q_norm, k_norm, eps, positions, p, cache, slots);
}

// One rope_store launch (decode), or, without head norms and right after the q/k/v
// products, their epilogue; the angles from the pass's table. False: nothing recorded, the
// heads are laid out in a way the kernels do not take.
bool CudaBackend::record_rope_store(Tensor& q_heads, Tensor& k_heads, const Tensor& v, const Tensor& positions,
                                    const RopeParams& p, KvLayer& cache, const Tensor& slots,
                                    const cuda::HeadNorms& norms) {
  const Tensor k_rows = k_heads.reshape({k_heads.ne[0] * k_heads.ne[1], k_heads.ne[2]});
  const cuda::RopeArgs q = rope_args(q_heads, positions, p), k = rope_args(k_heads, positions, p);
  const cuda::KvStoreArgs st = kv_store_args(k_rows, v, cache, slots);
  const bool norm = norms.q || norms.k;
  if (k.head_stride != k.head_dim || st.k_stride != k.token_stride) return false;
  if (norm && (q.head_stride != q.head_dim || q.head_dim > 256)) return false;
  Sig sig(Op::KvStore);
  sig.t(q_heads).t(k_heads).t(v).t(positions).t(cache.k).t(cache.v).t(slots).v(norms.q).v(norms.k).v(norms.eps);
  hash_rope(sig, p, q);
  Sig table_key(Op::Rope);
  table_key.t(positions);
  hash_rope(table_key, p, q);
  // Right after the q/k/v products: rotated and stored in their epilogue where they can.
  cuda::PairEpilogue ep;
  ep.kind = cuda::PairEpilogueKind::RopeStore;
  ep.head_dim = int(q.head_dim), ep.n_rot = q.n_rot, ep.store = st;
  const Tensor* outs[] = {&q_heads, &k_heads, &v};
  const float* angles = rope_table_for(q, table_key.h.value);
  if (!norm && !q.neox && q.head_stride == q.head_dim && pending_products_take(outs, ep)) {
    ep.angles = angles;
    fuse_into_pending_products(ep, sig.h, "qkv_rope_kv_store");
    return true;
  }
  record(sig.h, q.n_tokens, [=](cudaStream_t s) { return cuda::rope_store(q, k, st, s, angles, norms); },
         norm ? "norm_rope_kv_store" : "rope_kv_store");
  return true;
}

void CudaBackend::attention(const Tensor& q, const KvLayer& cache, const BatchIndex& batch, const AttentionParams& p,
                            Tensor& out) {
  require_f32(q, "attention", "q");
  require_f32(out, "attention", "out");
  require_cache(cache, "attention");
  check_attention_shapes("cuda attention", q, cache, batch, p, out);
  const int64_t T = q.ne[1];
  const float* sinks = nullptr;
  if (p.sinks) {
    require_f32(*p.sinks, "attention", "sinks");
    sinks = p.sinks->as<float>();
  }
  const int64_t width = batch.block_tables.ne[0];
  const int limit = int(width) * cache.block_size;
  KILN_CHECK(batch.max_position < limit, "cuda attention: position {} beyond the block tables ({} positions)",
             batch.max_position, limit);
  const bool library_kernel = p.head_dim_k == p.head_dim_v &&
                              (p.head_dim_k == 64 || p.head_dim_k == 128 || p.head_dim_k == 256);
  Sig sig(Op::Attention);
  sig.t(q).t(cache.k).t(cache.v).t(batch.positions).t(batch.seq_rows).t(batch.block_tables).t(out);
  sig.v(p.n_head).v(p.n_head_kv).v(p.head_dim_k).v(p.head_dim_v).v(p.scale).v(p.softcap).v(p.sliding_window).v(sinks);

  // Prompt chunks: tensor-core tiles of 64 queries (f16 products) unless exact mode asks
  // for f32 throughout.
  if (!options_.exact && batch.one_sequence_in_order && T >= kPrefillAttentionMinTokens &&
      p.head_dim_k == p.head_dim_v && cuda::prefill_attention_supports(p.head_dim_k, cache.k.dtype)) {
    cuda::PrefillAttentionArgs a;
    a.q = q.as<float>(), a.q_stride = int64_t(q.nb[1] / 4);
    a.k_cache = cache.k.data, a.v_cache = cache.v.data;
    a.k_slot_stride = slot_stride(cache.k), a.v_slot_stride = slot_stride(cache.v);
    a.cache_type = cache.k.dtype;
    a.block_tables = batch.block_tables.as<int32_t>(), a.block_table_stride = width;
    a.seq_rows = batch.seq_rows.as<int32_t>(), a.block_size = cache.block_size;
    a.first_position = batch.first_position, a.n_tokens = int(T);
    a.n_head = p.n_head, a.n_head_kv = p.n_head_kv, a.head_dim = p.head_dim_k;
    a.scale = p.scale, a.softcap = p.softcap, a.sliding_window = p.sliding_window, a.sinks = sinks;
    a.out = out.as<float>(), a.out_stride = int64_t(out.nb[1] / 4);
    sig.v(a.first_position);
    record(sig.h, T, [=](cudaStream_t s) { return cuda::prefill_attention(a, s); }, "attention");
    return;
  }
  if (!library_kernel) {
    cuda::GeneralAttentionArgs a;
    a.q = q.as<float>(), a.q_stride = int64_t(q.nb[1] / 4);
    a.k_cache = cache.k.data, a.v_cache = cache.v.data, a.cache_type = cache.k.dtype;
    a.k_slot_stride = slot_stride(cache.k), a.v_slot_stride = slot_stride(cache.v);
    a.block_tables = batch.block_tables.as<int32_t>(), a.table_width = width, a.block_size = cache.block_size;
    a.positions = batch.positions.as<int32_t>(), a.seq_rows = batch.seq_rows.as<int32_t>(), a.n_tokens = T;
    a.n_head = p.n_head, a.n_head_kv = p.n_head_kv, a.head_dim_k = p.head_dim_k, a.head_dim_v = p.head_dim_v;
    a.scale = p.scale, a.softcap = p.softcap, a.sliding_window = p.sliding_window, a.sinks = sinks;
    a.out = out.as<float>(), a.out_stride = int64_t(out.nb[1] / 4);
    record(sig.h, T, [=](cudaStream_t s) { return cuda::general_attention(a, s); }, "attention");
    return;
  }
  // Token t reads its sequence's block table, row seq_rows[t] of the cache's tables.
  cuda::DecodeAttentionArgs a;
  a.q = q.as<float>(), a.q_stride = int64_t(q.nb[1] / 4);
  a.k_cache = cache.k.data, a.v_cache = cache.v.data;
  a.k_slot_stride = slot_stride(cache.k), a.v_slot_stride = slot_stride(cache.v);
  a.cache_type = cache.k.dtype;
  a.block_tables = batch.block_tables.as<int32_t>(), a.block_table_stride = width, a.block_size = cache.block_size;
  a.table_rows = batch.seq_rows.as<int32_t>();
  a.positions = batch.positions.as<int32_t>();
  a.n_seq = int(T), a.n_head = p.n_head, a.n_head_kv = p.n_head_kv, a.head_dim = p.head_dim_k;
  // Graphed passes plan for a bucket of context lengths; blocks past a token's position exit.
  const bool graphed = graphs_->enabled() && T <= options_.graph_max_tokens;
  a.max_context = graphed ? cuda::attention_bucket(batch.max_position + 1, limit) : batch.max_position + 1;
  a.scale = p.scale, a.softcap = p.softcap, a.sliding_window = p.sliding_window, a.sinks = sinks;
  a.out = out.as<float>(), a.out_stride = int64_t(out.nb[1] / 4);
  const size_t need = cuda::decode_attention_scratch_bytes(a);
  void* sp = need ? scratch(attention_scratch_, need) : nullptr;
  sig.v(a.max_context);
  record(sig.h, T, [=](cudaStream_t s) { return cuda::decode_attention(a, sp, need, s); }, "attention");
}

void CudaBackend::glu(const Tensor& gate, const Tensor& up, const GluParams& p, Tensor& out) {
  require_f32(gate, "glu", "gate");
  require_f32(up, "glu", "up");
  require_f32(out, "glu", "out");
  same_shape(gate, up, "glu");
  same_shape(gate, out, "glu");
  cuda::GluArgs a;
  a.kind = p.act == Activation::Silu ? cuda::GluKind::Silu
           : p.act == Activation::GeluTanh ? cuda::GluKind::GeluTanh : cuda::GluKind::SwigluOai;
  a.gate = gate.as<float>(), a.gate_stride = stride_of(gate, "glu", "gate");
  a.up = up.as<float>(), a.up_stride = stride_of(up, "glu", "up");
  a.rows = gate.rows(), a.n = gate.ne[0];
  a.out = out.as<float>(), a.out_stride = stride_of(out, "glu", "out");
  a.alpha = p.alpha, a.limit = p.limit;
  if (cuda::glu_can_quantize(a)) a.q8 = q8_for_next_matmul(a.n, a.rows, &a.q8_row_bytes);
  record(Sig(Op::Glu).t(gate).t(up).t(out).v(p.act).v(p.alpha).v(p.limit).v(a.q8).h, gate.rows(),
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
  require_f32(logits, "moe_route", "logits");
  require_f32(weights, "moe_route", "weights");
  const int64_t n_expert = logits.ne[0], T = logits.rows();
  KILN_CHECK(p.n_used > 0 && p.n_used <= n_expert, "cuda moe_route: {} experts used of {}", p.n_used, n_expert);
  KILN_CHECK(ids.dtype == GgmlType::I32 && ids.ne[0] == p.n_used && ids.rows() == T && weights.ne[0] == p.n_used &&
                 weights.rows() == T,
             "cuda moe_route: ids {} / weights {} are not [{}, {}]", ids.describe(), weights.describe(), p.n_used, T);
  cuda::MoeRouteArgs a;
  a.logits = logits.as<float>(), a.logits_stride = stride_of(logits, "moe_route", "logits");
  a.n_expert = n_expert, a.n_tokens = T, a.n_used = p.n_used;
  a.gating = p.gating == MoeGating::Softmax ? 0 : p.gating == MoeGating::Sigmoid ? 1 : 2;
  a.normalize = p.normalize, a.scale = p.scale;
  if (p.selection_bias) {
    require_f32(*p.selection_bias, "moe_route", "selection_bias");
    KILN_CHECK(p.selection_bias->elements() == n_expert, "cuda moe_route: selection bias of {} for {} experts",
               p.selection_bias->elements(), n_expert);
    a.selection_bias = p.selection_bias->as<float>();
  }
  a.ids = ids.as<int32_t>(), a.ids_stride = int64_t(ids.nb[1] / 4);
  a.weights = weights.as<float>(), a.weights_stride = int64_t(weights.nb[1] / 4);
  Sig sig(Op::MoeRoute);
  sig.t(logits).t(ids).t(weights).v(p.n_used).v(p.gating).v(p.normalize).v(p.scale).v(a.selection_bias);
  record(sig.h, T, [=](cudaStream_t s) { return cuda::moe_route(a, s); }, "moe_route");
}

void CudaBackend::argmax(const Tensor& x, Tensor& out) {
  require_f32(x, "argmax", "x");
  KILN_CHECK(out.dtype == GgmlType::I32 && out.elements() == x.rows() && out.device == Device::Cuda,
             "cuda argmax: out {} {} is not a device I32 [{}]", out.name, out.describe(), x.rows());
  const float* xp = x.as<float>();
  const int64_t stride = stride_of(x, "argmax", "x"), rows = x.rows(), n = x.ne[0];
  int32_t* op = out.as<int32_t>();
  const size_t need = cuda::argmax_scratch_bytes(rows, n);
  void* sp = need ? scratch(argmax_scratch_, need) : nullptr;
  record(Sig(Op::Argmax).t(x).t(out).h, rows,
         [=](cudaStream_t s) { return cuda::argmax_rows(xp, stride, rows, n, op, sp, need, s); }, "argmax");
}

}  // namespace kiln
