#pragma once
// Shared by the CUDA backend's op files (cuda_backend_ops.cpp, cuda_backend_attention.cpp):
// the host-side argument checks that throw naming the op, the layouts handed to kernels, the
// op signature for the step recorder, and the batch sizes that pick decode or prefill paths.
#include <algorithm>
#include <cstdint>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/matvec.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/ops_extra.h"
#include "core/error.h"

namespace kiln::cuda_ops {

using cuda::SignatureHash;

constexpr int64_t kMatvecMaxTokens = 8;                 // up to this many rows: one matvec per row
constexpr int64_t kPrefillAttentionMinTokens = 16;      // from this many tokens of one sequence: tensor-core tiles
constexpr size_t kSlabBytes = size_t(256) << 20;        // dequantized weight slab of prefill / exact products

inline void require_f32(const Tensor& t, const char* op, const char* what) {
  KILN_CHECK(!t.empty(), "cuda {}: {} is missing", op, what);
  KILN_CHECK(t.dtype == GgmlType::F32 && t.nb[0] == sizeof(float), "cuda {}: {} ({} {}) must be f32 with packed rows",
             op, what, t.name, t.describe());
  KILN_CHECK(t.device == Device::Cuda, "cuda {}: {} ({}) is not in device memory", op, what, t.name);
}

// The KV cache: f32 or f16 rows, k and v of one type.
inline void require_cache(const KvLayer& cache, const char* op) {
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
inline int64_t slot_stride(const Tensor& cache) { return int64_t(cache.nb[1] / cache.nb[0]); }

inline void require_device(const Tensor& t, const char* op, const char* what) {
  KILN_CHECK(!t.empty() && t.device == Device::Cuda, "cuda {}: {} ({}) is missing or not in device memory", op, what,
             t.name);
}

// Rows spaced evenly (dims 1..3 flatten to one stride): the stride in floats, else -1.
inline int64_t even_stride(const Tensor& t) {
  const int64_t s1 = int64_t(t.nb[1] / sizeof(float));
  if (t.ne[2] > 1 && t.nb[2] != t.nb[1] * size_t(t.ne[1])) return -1;
  if (t.ne[3] > 1 && t.nb[3] != t.nb[2] * size_t(t.ne[2])) return -1;
  return s1;
}

inline int64_t stride_of(const Tensor& t, const char* op, const char* what) {
  const int64_t s = even_stride(t);
  KILN_CHECK(s >= 0, "cuda {}: {} ({} {}) rows are not evenly spaced", op, what, t.name, t.describe());
  return s;
}

inline cuda::RowLayout layout_of(const Tensor& t) {
  cuda::RowLayout l;
  l.base = static_cast<float*>(t.data);
  l.ne1 = t.ne[1], l.ne2 = t.ne[2];
  l.s1 = int64_t(t.nb[1] / 4), l.s2 = int64_t(t.nb[2] / 4), l.s3 = int64_t(t.nb[3] / 4);
  return l;
}

inline void same_shape(const Tensor& a, const Tensor& b, const char* op) {
  KILN_CHECK(a.ne[0] == b.ne[0] && a.rows() == b.rows(), "cuda {}: shapes differ: {} is {}, {} is {}", op, a.name,
             a.describe(), b.name, b.describe());
}

// A tensor's part of an op's signature: its type, data pointer, shape and strides.
inline void hash_tensor(SignatureHash& h, const Tensor& x) {
  h.pod(x.dtype), h.pod(x.data), h.bytes(x.ne, sizeof(x.ne)), h.bytes(x.nb, sizeof(x.nb));
}

// Signature of an op: its name and every tensor and scalar it was called with.
struct Sig {
  SignatureHash h;
  explicit Sig(Op op) { h.pod(op); }
  Sig& t(const Tensor& x) {
    hash_tensor(h, x);
    return *this;
  }
  template <typename T>
  Sig& v(const T& x) {
    h.pod(x);
    return *this;
  }
};

// The kernels' name for a model's gated activation.
inline cuda::GluKind glu_kind(Activation act) {
  return act == Activation::Silu ? cuda::GluKind::Silu
         : act == Activation::GeluTanh ? cuda::GluKind::GeluTanh : cuda::GluKind::SwigluOai;
}

// Bytes per token of the int8 input copies (the same for every quantized weight type).
inline size_t q8_row_bytes(int64_t cols) { return (cuda::matvec_scratch_bytes(GgmlType::Q4_0, cols) + 255) / 256 * 256; }

// The same tensor view: data, type, shape and strides.
inline bool same_view(const Tensor& a, const Tensor& b) {
  return a.data == b.data && a.dtype == b.dtype && std::equal(std::begin(a.ne), std::end(a.ne), std::begin(b.ne)) &&
         std::equal(std::begin(a.nb), std::end(a.nb), std::begin(b.nb));
}

// The routing kernel's arguments (ops_extra.h) for moe_route's tensors, checked.
inline cuda::MoeRouteArgs moe_route_args(const Tensor& logits, const MoeRouteParams& p, Tensor& ids, Tensor& weights,
                                         const char* op) {
  require_f32(logits, op, "logits");
  require_f32(weights, op, "weights");
  const int64_t n_expert = logits.ne[0], T = logits.rows();
  KILN_CHECK(p.n_used > 0 && p.n_used <= n_expert, "cuda {}: {} experts used of {}", op, p.n_used, n_expert);
  KILN_CHECK(ids.dtype == GgmlType::I32 && ids.device == Device::Cuda && ids.ne[0] == p.n_used && ids.rows() == T &&
                 weights.ne[0] == p.n_used && weights.rows() == T,
             "cuda {}: ids {} / weights {} are not [{}, {}]", op, ids.describe(), weights.describe(), p.n_used, T);
  cuda::MoeRouteArgs a;
  a.logits = logits.as<float>(), a.logits_stride = stride_of(logits, op, "logits");
  a.n_expert = n_expert, a.n_tokens = T, a.n_used = p.n_used;
  a.gating = p.gating == MoeGating::Softmax ? 0 : p.gating == MoeGating::Sigmoid ? 1 : 2;
  a.normalize = p.normalize, a.scale = p.scale;
  if (p.selection_bias) {
    require_f32(*p.selection_bias, op, "selection_bias");
    KILN_CHECK(p.selection_bias->elements() == n_expert, "cuda {}: selection bias of {} for {} experts", op,
               p.selection_bias->elements(), n_expert);
    a.selection_bias = p.selection_bias->as<float>();
  }
  a.ids = ids.as<int32_t>(), a.ids_stride = int64_t(ids.nb[1] / 4);
  a.weights = weights.as<float>(), a.weights_stride = int64_t(weights.nb[1] / 4);
  return a;
}

}  // namespace kiln::cuda_ops
