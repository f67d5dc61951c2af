// The CUDA backend's fused products in decode, one grouped-matvec launch per weight type and
// token:
//   - matmul_parts: several weights over one input (q/k/v, gate/up);
//   - rmsnorm_matmul_parts: the same with the input's RMS norm computed inside the launch
//     (every block normalizes and quantizes x itself; no norm kernel runs before);
//   - matmul_add: a product whose epilogue also adds it to the residual stream;
//   - the launch of two or three parts is held back (PendingProducts) and takes the next op
//     into its epilogue when it can: rope_kv_store after q/k/v; glu after gate/up for f16 /
//     bf16 weights (CudaOptions::half_epilogues) and for int8 launches over f32 x
//     (CudaOptions::int8_glu_epilogue), which then also write the activation's int8 copy.
// Parts of different types run as one launch per type, each computing the norm again, except
// in rmsnorm_matmul_parts the pair q4_K + q6_K (Q4_K_M's q/k with a q6_K v): one launch of
// the two-format kernel, held back like a one-type launch. q4_0 / q8_0 / q4_K / q6_K weights go to the grouped int8
// kernel (matvec_grouped.h), f16 / bf16 weights to the grouped 16-bit float kernel
// (matvec_f16_grouped.h), which takes x in f32. Anything neither takes (exact mode, other
// weight types, mixed widths) runs as the composed ops of backend.h; prefill batches of matmul_parts go to
// cuda_backend_prefill.cpp.
#include <array>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_backend_checks.h"
#include "backend/cuda/decode_layout.h"
#include "backend/cuda/matvec_f16_grouped.h"
#include "backend/cuda/matvec_grouped.h"
#include "backend/cuda/rope_store.h"

namespace kiln {

namespace cuda_fused {

constexpr int64_t kMaxTokens = 8;  // as cuda_backend_ops.cpp's kMatvecMaxTokens

size_t q8_row_bytes(int64_t cols) { return (cuda::matvec_scratch_bytes(GgmlType::Q4_0, cols) + 255) / 256 * 256; }

using cuda_ops::hash_tensor;

bool packed_f32(const Tensor& t) {
  return !t.empty() && t.dtype == GgmlType::F32 && t.nb[0] == sizeof(float) && t.device == Device::Cuda &&
         t.ne[2] == 1 && t.ne[3] == 1;
}

bool overlaps(const float* a, int64_t a_floats, const float* b, int64_t b_floats) {
  return a < b + b_floats && b < a + a_floats;
}

// Floats spanned by the T rows of a packed f32 tensor.
int64_t span_floats(const Tensor& t) { return (t.ne[1] - 1) * int64_t(t.nb[1] / 4) + t.ne[0]; }

bool half_type(GgmlType t) { return t == GgmlType::F16 || t == GgmlType::BF16; }

// Whether the grouped kernels can take these parts over x, one launch per weight type and
// token: decode batch, weight types of the kernels', one width, one row stride per type,
// packed f32 outputs that do not overlap x, token rows of x 16-byte aligned.
bool grouped_fits(const CudaOptions& o, const Tensor& x, std::span<const Backend::MatmulPart> parts) {
  const int64_t K = x.ne[0], T = x.ne[1];
  if (o.exact || !o.fused || parts.empty() || parts.size() > size_t(cuda::kMaxMatvecParts) || !packed_f32(x) ||
      T > kMaxTokens || x.nb[1] % 16 != 0)
    return false;
  for (const Backend::MatmulPart& p : parts) {
    KILN_CHECK(p.w && p.out, "cuda matmul_parts: a part lacks its weight or output");
    const Tensor& w = *p.w;
    const Tensor& out = *p.out;
    const Tensor bias = p.bias ? *p.bias : Tensor{};
    bool same_stride = true;  // as the first part of its type
    for (const Backend::MatmulPart& q : parts)
      if (q.w->dtype == w.dtype) {
        same_stride = q.w->nb[1] == w.nb[1];
        break;
      }
    const bool fits = (cuda::matvec_grouped_type(w.dtype) || half_type(w.dtype)) && w.device == Device::Cuda &&
                      w.ne[0] == K && w.ne[2] == 1 && w.ne[3] == 1 && same_stride && packed_f32(out) &&
                      out.ne[0] == w.ne[1] && out.ne[1] == T &&
                      (bias.empty() || (packed_f32(bias) && bias.elements() == w.ne[1])) &&
                      !overlaps(out.as<float>(), span_floats(out), x.as<float>(), span_floats(x));
    if (!fits) return false;
  }
  return true;
}

// The kernel's view of the parts (token 0), with each output's row stride in floats.
struct GroupedParts {
  std::array<cuda::MatvecPart, cuda::kMaxMatvecParts> mv{};
  std::array<int64_t, cuda::kMaxMatvecParts> y_stride{};
  size_t n = 0;
  // Token t's parts: outputs (and accumulators, which have the outputs' shape) moved t rows.
  std::array<cuda::MatvecPart, cuda::kMaxMatvecParts> token(int64_t t) const {
    std::array<cuda::MatvecPart, cuda::kMaxMatvecParts> row = mv;
    for (size_t i = 0; i < n; ++i) {
      row[i].y += t * y_stride[i];
      if (row[i].accumulate) row[i].accumulate += t * y_stride[i];
    }
    return row;
  }
  std::span<const cuda::MatvecPart> view(const std::array<cuda::MatvecPart, cuda::kMaxMatvecParts>& a) const {
    return std::span<const cuda::MatvecPart>(a.data(), n);
  }
};

GroupedParts grouped_parts(std::span<const Backend::MatmulPart> parts) {
  GroupedParts g;
  g.n = parts.size();
  for (size_t i = 0; i < g.n; ++i) {
    g.mv[i].w = parts[i].w->data;
    g.mv[i].rows = parts[i].w->ne[1];
    g.mv[i].add = parts[i].bias && !parts[i].bias->empty() ? parts[i].bias->as<float>() : nullptr;
    g.mv[i].y = parts[i].out->as<float>();
    g.y_stride[i] = int64_t(parts[i].out->nb[1] / 4);
  }
  return g;
}

// One launch's parts: those of one weight type (one row stride), kept in call order.
struct TypedLaunch {
  GgmlType type = GgmlType::F32;
  int64_t w_row = 0;
  GroupedParts g;
};
struct TypedLaunches {
  std::array<TypedLaunch, cuda::kMaxMatvecParts> at{};
  size_t n = 0;
};

// The parts split by weight type, launches in the order of each type's first part.
TypedLaunches launches_by_type(std::span<const Backend::MatmulPart> parts) {
  TypedLaunches l;
  for (size_t i = 0; i < parts.size(); ++i) {
    const GgmlType type = parts[i].w->dtype;
    bool seen = false;
    for (size_t j = 0; j < i; ++j) seen = seen || parts[j].w->dtype == type;
    if (seen) continue;
    std::array<Backend::MatmulPart, cuda::kMaxMatvecParts> same{};
    size_t n = 0;
    for (size_t j = i; j < parts.size(); ++j)
      if (parts[j].w->dtype == type) same[n++] = parts[j];
    TypedLaunch& launch = l.at[l.n++];
    launch.type = type;
    launch.w_row = int64_t(parts[i].w->nb[1]);
    launch.g = grouped_parts(std::span<const Backend::MatmulPart>(same.data(), n));
  }
  return l;
}

void hash_parts(cuda::SignatureHash& h, std::span<const Backend::MatmulPart> parts) {
  for (const Backend::MatmulPart& p : parts) {
    hash_tensor(h, *p.w), hash_tensor(h, *p.out);
    if (p.bias) hash_tensor(h, *p.bias);
  }
}

// The launch over f32 x for either kernel family (the int8 one quantizes x in every block).
bool f32_parts_fit(GgmlType type, int64_t cols, int64_t w_row, std::span<const cuda::MatvecPart> parts,
                   const cuda::F32Input& in) {
  if (half_type(type)) return cuda::matvec_half_parts_fit(type, cols, w_row, parts, in);
  return cuda::matvec_parts_f32_fit(type, cols, w_row, parts, in);
}
cuda::Status f32_parts(GgmlType type, int64_t cols, int64_t w_row, std::span<const cuda::MatvecPart> parts,
                       const cuda::F32Input& in, cudaStream_t s, const cuda::PairEpilogue& ep) {
  if (!half_type(type)) return cuda::matvec_f32_parts(type, cols, w_row, parts, in, s, ep);
  return cuda::matvec_half_parts(type, cols, w_row, parts, in, s, ep);
}

// Every part's type and row stride in call order (the two-format launch's view).
using PartFormats = std::array<cuda::PartFormat, cuda::kMaxMatvecParts>;
PartFormats part_formats(std::span<const Backend::MatmulPart> parts) {
  PartFormats f{};
  for (size_t i = 0; i < parts.size(); ++i) f[i] = {parts[i].w->dtype, int64_t(parts[i].w->nb[1])};
  return f;
}

// Whether a part's weights are in the interleaved layout (decode_layout.h), which the
// two-format kernel does not read: such parts run as one launch per type.
bool any_interleaved(std::span<const Backend::MatmulPart> parts) {
  for (const Backend::MatmulPart& p : parts)
    if (cuda::is_interleaved(p.w->data, p.w->bytes())) return true;
  return false;
}

// Whether the launches include f16 / bf16 weights (which take x in f32, never its int8 copy).
bool any_half(const TypedLaunches& launches) {
  bool half = false;
  for (size_t i = 0; i < launches.n; ++i) half = half || half_type(launches.at[i].type);
  return half;
}

// Whether `a` is the packed f32 rows {N, T} of `b`, seen as they are or as heads
// {head_dim, heads, T} (the view rope takes).
bool same_rows(const Tensor& a, const Tensor& b) {
  if (a.data != b.data || a.dtype != GgmlType::F32 || !packed_f32(b) || a.nb[0] != sizeof(float) || a.ne[3] != 1)
    return false;
  if (a.ne[2] == 1 && a.ne[0] == b.ne[0] && a.ne[1] == b.ne[1] && a.nb[1] == b.nb[1]) return true;
  return a.ne[0] * a.ne[1] == b.ne[0] && a.ne[2] == b.ne[1] && a.nb[1] == a.ne[0] * int64_t(sizeof(float)) &&
         (a.ne[2] == 1 || a.nb[2] == b.nb[1]);
}

// A pair epilogue for token t of the launch (its batch row).
cuda::PairEpilogue epilogue_for_token(cuda::PairEpilogue ep, int64_t t) {
  ep.token = t;
  return ep;
}

}  // namespace cuda_fused

struct CudaBackend::PendingProducts {
  cuda::SignatureHash sig;
  int64_t tokens = 0;
  std::array<Tensor, cuda::kMaxMatvecParts> outs{};
  cuda_fused::GroupedParts parts;  // token 0's
  int64_t cols = 0;
  ProductsLaunch launch;           // per token, with the epilogue it is given
  QuantizedInput input_after;      // the int8 copy of x the launch leaves, or none
  const char* op = "";
  bool half = false;               // f16 / bf16 weights: the pair kernel, over f32 x `in`
  cuda::F32Input in;               // token 0's
  bool int8_over_f32 = false;      // int8 weights of one type over f32 x: can take the glu
  const float* accumulate = nullptr;  // a matmul_add's residual (one part over int8 x): can take the router sums
};

void CudaBackend::defer_products(const cuda::SignatureHash& sig, int64_t tokens, std::span<const MatmulPart> parts,
                                 int64_t cols, ProductsLaunch launch, const QuantizedInput& after, const char* op,
                                 const cuda::F32Input* half_input, bool int8_over_f32) {
  flush_pending();
  auto p = std::make_shared<PendingProducts>();
  p->sig = sig, p->tokens = tokens, p->parts = cuda_fused::grouped_parts(parts), p->cols = cols;
  for (size_t i = 0; i < parts.size(); ++i) p->outs[i] = *parts[i].out;
  p->launch = std::move(launch), p->input_after = after, p->op = op;
  if (half_input) p->half = true, p->in = *half_input;
  p->int8_over_f32 = int8_over_f32;
  pending_products_ = std::move(p);
  quantized_input_ = after;
}

const float* CudaBackend::held_residual_add(int64_t* cols) const {
  if (!pending_products_ || !pending_products_->accumulate) return nullptr;
  *cols = pending_products_->cols;
  return pending_products_->accumulate;
}

void CudaBackend::flush_pending_products() {
  if (pending_products_) record_held_products(cuda::PairEpilogue{}, nullptr, pending_products_->op);
}

void CudaBackend::record_held_products(const cuda::PairEpilogue& ep, const cuda::SignatureHash* fused_sig,
                                       const char* op) {
  const std::shared_ptr<PendingProducts> held = std::move(pending_products_);  // record() finds none held
  cuda::SignatureHash h = held->sig;
  if (fused_sig) h.pod(fused_sig->value);
  record(h, held->tokens, [launch = held->launch, ep](cudaStream_t s) { return launch(s, ep); }, op);
  quantized_input_ = held->input_after;
}

bool CudaBackend::pending_products_take(std::span<const Tensor* const> outs, const cuda::PairEpilogue& ep) const {
  using namespace cuda_fused;
  if (!pending_products_) return false;
  const PendingProducts& p = *pending_products_;
  if (outs.size() != p.parts.n) return false;
  for (size_t i = 0; i < outs.size(); ++i)
    if (!same_rows(*outs[i], p.outs[i])) return false;
  if (!p.half) {
    if (ep.kind == cuda::PairEpilogueKind::Glu && (options_.int8_glu_epilogue == 0 || !p.int8_over_f32)) return false;
    return cuda::matvec_pairs_fit(p.cols, p.parts.view(p.parts.mv), ep);
  }
  const int wanted = ep.kind == cuda::PairEpilogueKind::Glu ? CudaOptions::kHalfEpilogueGlu
                                                             : CudaOptions::kHalfEpilogueRope;
  return (options_.half_epilogues & wanted) != 0 &&
         cuda::matvec_half_pairs_fit(p.cols, p.parts.view(p.parts.mv), p.in, ep);
}

void CudaBackend::fuse_into_pending_products(const cuda::PairEpilogue& ep, const cuda::SignatureHash& sig,
                                             const char* op) {
  KILN_CHECK(pending_products_, "cuda: no held products to take {}", op);
  record_held_products(ep, &sig, op);
}

bool CudaBackend::fuse_glu_into_products(const Tensor& gate, const Tensor& up, const cuda::GluArgs& a,
                                         const cuda::SignatureHash& sig) {
  using namespace cuda_fused;
  if (!pending_products_) return false;
  const bool half = pending_products_->half;
  if (!half && (!pending_products_->int8_over_f32 || options_.int8_glu_epilogue == 0)) return false;
  cuda::PairEpilogue ep;
  ep.kind = cuda::PairEpilogueKind::Glu;
  ep.glu.kind = a.kind, ep.glu.alpha = a.alpha, ep.glu.limit = a.limit;
  ep.glu.out = a.out, ep.glu.out_stride = a.out_stride;
  // The int8 launch writes the activation's int8 copy where glu() would (the launch reads x
  // in f32, never the scratch the copy goes to).
  if (!half) {
    ep.glu.stages = options_.int8_glu_epilogue;  // 1 or 2 copy stages per warp
    if (cuda::glu_can_quantize(a)) ep.glu.q8 = q8_for_next_matmul(a.n, a.rows, &ep.glu.q8_row_bytes);
  }
  // The activation over gate's or up's own rows (what the models do), so that every token's
  // row is its pair's own place; the kernel checks token 0's layout again.
  const bool in_place = (a.out == a.gate && a.out_stride == a.gate_stride) ||
                        (a.out == a.up && a.out_stride == a.up_stride);
  const Tensor* outs[] = {&gate, &up};
  if (!in_place || !pending_products_take(outs, ep)) return false;
  cuda::SignatureHash fused = sig;
  fused.pod(ep.glu.q8), fused.pod(ep.glu.stages);
  fuse_into_pending_products(ep, fused, "gate_up_glu");
  if (!half) remember_q8(a.out, a.n, a.rows, a.out_stride, ep.glu.q8);
  return true;
}

const float* CudaBackend::rope_table_for(const cuda::RopeArgs& rope, uint64_t key) {
  RopeTable* entry = nullptr;
  for (RopeTable& t : rope_tables_)
    if (t.key == key) entry = &t;
  if (!entry) {
    rope_tables_.push_back({key, nullptr, 0, false});
    entry = &rope_tables_.back();
  }
  // Rows for a decode batch, or for every token of a prefill pass (rope_store_rows). A
  // smaller table is kept alive: captured decode graphs may still write it.
  const int64_t rows = rope.n_tokens > cuda_fused::kMaxTokens ? rope.n_tokens : cuda_fused::kMaxTokens;
  if (entry->rows < rows) {
    if (entry->buffer) retired_rope_tables_.push_back(std::move(entry->buffer));
    entry->buffer = allocate(size_t(rows) * size_t(rope.n_rot) * sizeof(float));
    entry->rows = rows, entry->current = false;
  }
  auto* table = static_cast<float*>(entry->buffer->data());
  if (!entry->current) {
    // Straight to the graph, ahead of the held products (record() would record them first):
    // the kernel reads only the positions and writes only the table, which nothing reads yet.
    cuda::SignatureHash h;
    h.pod(key), h.pod(table), h.pod(rope.n_tokens);
    graphs_->add(h, rope.n_tokens, [=](cudaStream_t s) { return cuda::rope_table(rope, table, s); }, "rope_table");
    entry->current = true;
  }
  return table;
}

void CudaBackend::matmul_parts(const Tensor& x, std::span<const MatmulPart> parts) {
  using namespace cuda_fused;
  if (x.ne[1] > kMaxTokens && matmul_parts_prefill(x, parts)) return;
  if (!grouped_fits(options_, x, parts)) return Backend::matmul_parts(x, parts);
  record_grouped(x, parts, nullptr);
}

void CudaBackend::matmul_add(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& out, Tensor& residual) {
  using namespace cuda_fused;
  const MatmulPart part{&w, &bias, &out};
  const bool fits = grouped_fits(options_, x, std::span(&part, 1)) && packed_f32(residual) &&
                    residual.ne[0] == out.ne[0] && residual.ne[1] == out.ne[1] && residual.nb[1] == out.nb[1] &&
                    !overlaps(residual.as<float>(), span_floats(residual), out.as<float>(), span_floats(out)) &&
                    !overlaps(residual.as<float>(), span_floats(residual), x.as<float>(), span_floats(x));
  if (!fits) {
    matmul(x, w, bias, out);
    return defer_add(out, residual);
  }
  record_grouped(x, std::span(&part, 1), &residual);
}

// One launch per weight type and token over x: f16 / bf16 weights take x as it is; int8
// weights reuse the int8 copy an earlier op left of x (rmsnorm, glu, a product over the same
// x), else quantize x inside each launch (always, next to f16 / bf16 launches).
void CudaBackend::record_grouped(const Tensor& x, std::span<const MatmulPart> parts, Tensor* residual) {
  using namespace cuda_fused;
  const int64_t K = x.ne[0], T = x.ne[1];
  TypedLaunches launches = launches_by_type(parts);
  float* accumulate = residual ? residual->as<float>() : nullptr;
  KILN_CHECK(!accumulate || parts.size() == 1, "cuda matmul_add: {} parts, one expected", parts.size());
  launches.at[0].g.mv[0].accumulate = accumulate;
  const size_t per_token = q8_row_bytes(K);
  auto* q8 = static_cast<uint8_t*>(scratch(q8_scratch_, per_token * kMaxTokens));
  const int64_t xs = int64_t(x.nb[1] / 4);
  const float* xp = x.as<float>();
  const QuantizedInput input{xp, K, T, xs, q8};
  const bool half = any_half(launches);
  const bool reuse = !half && quantized_input_ == input;
  cuda::F32Input f32;
  f32.x = xp;
  bool from_f32 = !reuse, from_q8 = !half;
  for (size_t i = 0; i < launches.n; ++i) {
    const TypedLaunch& l = launches.at[i];
    const auto mv = l.g.view(l.g.mv);
    from_f32 = from_f32 && f32_parts_fit(l.type, K, l.w_row, mv, f32);
    from_q8 = from_q8 && cuda::matvec_parts_fit(l.type, K, l.w_row, mv, cuda::q8_vector_in(q8, K));
  }
  if (!from_f32 && !from_q8) {
    // Alignment or width the grouped kernel does not take: the plain ops.
    if (!accumulate) return Backend::matmul_parts(x, parts);
    matmul(x, *parts[0].w, parts[0].bias ? *parts[0].bias : Tensor{}, *parts[0].out);
    return defer_add(*parts[0].out, *residual);
  }
  cuda::SignatureHash h;
  h.pod(Op::Matmul), h.pod(parts.size()), h.pod(reuse), h.pod(from_f32), h.pod(accumulate);
  hash_tensor(h, x);
  hash_parts(h, parts);
  ProductsLaunch launch = [=](cudaStream_t s, const cuda::PairEpilogue& ep) {
    for (int64_t t = 0; t < T; ++t) {
      const cuda::Q8Vector xq = cuda::q8_vector_in(q8 + size_t(t) * per_token, K);
      if (!from_f32 && !reuse)
        if (cuda::Status st = cuda::quantize_q8(xp + t * xs, K, xq, s); !st.ok()) return st;
      const cuda::PairEpilogue token_ep = epilogue_for_token(ep, t);  // one launch only (deferred ones)
      for (size_t i = 0; i < launches.n; ++i) {
        const TypedLaunch& l = launches.at[i];
        const auto row = l.g.token(t);
        cuda::F32Input in;
        in.x = xp + t * xs;
        const cuda::Status st = from_f32 ? f32_parts(l.type, K, l.w_row, l.g.view(row), in, s, token_ep)
                                         : cuda::matvec_q8_parts(l.type, K, l.w_row, l.g.view(row), xq, s, token_ep);
        if (!st.ok()) return st;
      }
    }
    return cuda::Status();
  };
  // The int8 copy of x stays valid for the next product over x (no output overlaps x), but
  // only where it was written to the scratch.
  const QuantizedInput after = from_f32 ? QuantizedInput{} : input;
  // Held back where the next op may join the launch's epilogue (one launch: one weight type).
  if (!accumulate && parts.size() >= 2 && launches.n == 1 && (!half || options_.half_epilogues != 0))
    return defer_products(h, T, parts, K, std::move(launch), after, "matmul_parts", half ? &f32 : nullptr,
                          !half && from_f32);
  // A residual add of one token over int8 x: an MoE front after it may fold into it.
  if (accumulate && T == 1 && launches.n == 1 && !half && !from_f32 && options_.fold_moe_front) {
    defer_products(h, T, parts, K, std::move(launch), after, "matmul_add");
    pending_products_->accumulate = accumulate;
    return;
  }
  record(h, T, [launch](cudaStream_t s) { return launch(s, cuda::PairEpilogue{}); }, "matmul_parts");
  quantized_input_ = after;
}

void CudaBackend::rmsnorm_matmul_parts(const Tensor& x, const Tensor& norm_weight, float eps, Tensor& normed,
                                       std::span<const MatmulPart> parts) {
  using namespace cuda_fused;
  const int64_t K = x.ne[0], T = x.ne[1];
  bool fits = grouped_fits(options_, normed, parts) && packed_f32(x) && packed_f32(normed) && normed.ne[0] == K &&
              normed.ne[1] == T && x.nb[1] % 16 == 0 && packed_f32(norm_weight) && norm_weight.elements() == K &&
              !overlaps(normed.as<float>(), span_floats(normed), x.as<float>(), span_floats(x));
  for (const MatmulPart& p : parts)
    fits = fits && !overlaps(p.out->as<float>(), span_floats(*p.out), x.as<float>(), span_floats(x));
  const TypedLaunches launches = fits ? launches_by_type(parts) : TypedLaunches{};
  cuda::F32Input in;
  in.x = x.as<float>(), in.norm_weight = norm_weight.as<float>(), in.eps = eps, in.normed = normed.as<float>();
  for (size_t i = 0; i < launches.n; ++i) {
    const TypedLaunch& l = launches.at[i];
    fits = fits && f32_parts_fit(l.type, K, l.w_row, l.g.view(l.g.mv), in);
  }
  if (!fits) return Backend::rmsnorm_matmul_parts(x, norm_weight, eps, normed, parts);
  // Two types the two-format kernel reads (q4_K with q6_K): one launch for all parts.
  const GroupedParts all = grouped_parts(parts);
  const PartFormats formats = part_formats(parts);
  const size_t n_parts = parts.size();
  const bool mixed = options_.mixed_parts && launches.n == 2 && !any_interleaved(parts) &&
                     cuda::matvec_mixed_f32_fit(K, all.view(all.mv), std::span(formats.data(), n_parts), in);

  const int64_t xs = int64_t(x.nb[1] / 4), ns = int64_t(normed.nb[1] / 4);
  cuda::SignatureHash h;
  h.pod(Op::RmsNorm), h.pod(parts.size()), h.pod(eps), h.pod(mixed);
  hash_tensor(h, x), hash_tensor(h, norm_weight), hash_tensor(h, normed);
  hash_parts(h, parts);
  ProductsLaunch launch = [=](cudaStream_t s, const cuda::PairEpilogue& ep) {
    for (int64_t t = 0; t < T; ++t) {
      // Every launch normalizes x itself; the first one writes `normed`.
      const cuda::PairEpilogue token_ep = epilogue_for_token(ep, t);  // one launch only (deferred ones)
      if (mixed) {
        cuda::F32Input token_in = in;
        token_in.x += t * xs, token_in.normed += t * ns;
        const auto row = all.token(t);
        const std::span<const cuda::PartFormat> f(formats.data(), n_parts);
        if (cuda::Status st = cuda::matvec_mixed_f32_parts(K, all.view(row), f, token_in, s, token_ep); !st.ok())
          return st;
        continue;
      }
      for (size_t i = 0; i < launches.n; ++i) {
        const TypedLaunch& l = launches.at[i];
        const auto row = l.g.token(t);
        cuda::F32Input token_in = in;
        token_in.x += t * xs;
        token_in.normed = i == 0 ? token_in.normed + t * ns : nullptr;
        if (cuda::Status st = f32_parts(l.type, K, l.w_row, l.g.view(row), token_in, s, token_ep); !st.ok())
          return st;
      }
    }
    return cuda::Status();
  };
  const bool half = any_half(launches);
  if (parts.size() >= 2 && (mixed || (launches.n == 1 && (!half || options_.half_epilogues != 0))))
    return defer_products(h, T, parts, K, std::move(launch), QuantizedInput{}, "rmsnorm_matmul_parts",
                          half && !mixed ? &in : nullptr, !half && !mixed);
  record(h, T, [launch](cudaStream_t s) { return launch(s, cuda::PairEpilogue{}); }, "rmsnorm_matmul_parts");
}

}  // namespace kiln
