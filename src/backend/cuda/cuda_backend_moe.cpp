// The CUDA backend's mixture-of-experts layer:
//   - the front (norm, router, routing) as one kernel in decode (ops_extra.h's
//     moe_norm_route), or, for one token over experts in the row-tile layout, folded into the
//     attention output product before it and the experts' kernels after it (no launch:
//     PendingFront, moe.h's MoeFoldedFront);
//   - the FFN: argument checks on the host, then the routed kernels of moe.h (indexed matvecs
//     for a few tokens and in exact mode, grouped GEMMs for many), recorded like every other
//     op so that decode passes replay as graphs.
#include <initializer_list>
#include <string>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_backend_checks.h"
#include "backend/cuda/env_switch.h"
#include "backend/cuda/moe.h"
#include "backend/cuda/ops_extra.h"
#include "backend/cuda/router_logits.h"
#include "backend/cuda/router_transpose.h"

namespace kiln {

namespace {

// Up to this many tokens the indexed matvecs run (int8 dot products, each pair's expert rows
// read once); above, the grouped GEMMs (each expert's rows read once per 64 of its tokens).
constexpr int64_t kMoeMatvecMaxTokens = 16;

void require_moe_f32(const Tensor& t, const char* what) {
  KILN_CHECK(!t.empty(), "cuda moe_ffn: {} is missing", what);
  KILN_CHECK(t.dtype == GgmlType::F32 && t.nb[0] == sizeof(float), "cuda moe_ffn: {} ({} {}) must be f32 with packed rows",
             what, t.name, t.describe());
  KILN_CHECK(t.device == Device::Cuda, "cuda moe_ffn: {} ({}) is not in device memory", what, t.name);
}

// Rows evenly spaced (dims 1..3 flatten to one stride): the stride in elements of 4 bytes.
int64_t moe_row_stride(const Tensor& t, const char* what) {
  const bool even = (t.ne[2] <= 1 || t.nb[2] == t.nb[1] * size_t(t.ne[1])) &&
                    (t.ne[3] <= 1 || t.nb[3] == t.nb[2] * size_t(t.ne[2]));
  KILN_CHECK(even && t.nb[1] % 4 == 0, "cuda moe_ffn: {} ({} {}) rows are not evenly spaced", what, t.name,
             t.describe());
  return int64_t(t.nb[1] / 4);
}

cuda::ExpertMatrix expert_matrix(const Tensor& w, const Tensor& bias, int64_t rows, int64_t n_expert,
                                 const char* what) {
  KILN_CHECK(w.device == Device::Cuda, "cuda moe_ffn: {} experts ({}) are not in device memory", what, w.name);
  KILN_CHECK(w.ne[3] == 1, "cuda moe_ffn: {} experts ({} {}) must be 3-D", what, w.name, w.describe());
  cuda::ExpertMatrix m;
  m.type = w.dtype, m.data = w.data;
  m.row_bytes = int64_t(w.nb[1]), m.expert_bytes = int64_t(w.nb[2]);
  if (!bias.empty()) {
    require_moe_f32(bias, what);
    KILN_CHECK(bias.ne[0] == rows && bias.ne[1] == n_expert, "cuda moe_ffn: {} bias {} {} is not [{}, {}]", what,
               bias.name, bias.describe(), rows, n_expert);
    m.bias = bias.as<float>(), m.bias_stride = int64_t(bias.nb[1] / 4);
  }
  return m;
}

Tensor bias_of_expert(const Tensor& stacked, int64_t expert) {
  if (stacked.empty()) return {};
  return Tensor::contiguous(GgmlType::F32, {stacked.ne[0]}, stacked.row_ptr(expert), Device::Cuda, stacked.name);
}

}  // namespace

void CudaBackend::rmsnorm_moe_route(const Tensor& x, const Tensor& norm_weight, float eps, Tensor& normed,
                                    const Tensor& router, const Tensor& router_bias, const MoeRouteParams& params,
                                    Tensor& logits, Tensor& ids, Tensor& weights) {
  using cuda_ops::require_f32;
  const int64_t T = x.rows(), n_embd = x.ne[0];
  // One kernel for a decode batch in fast mode, with an f32 router and packed rows; the
  // three ops otherwise (and while an add of x is pending: rmsnorm takes it in).
  const bool packed = x.dtype == GgmlType::F32 && x.nb[0] == 4 && normed.dtype == GgmlType::F32 && normed.nb[0] == 4 &&
                      x.device == Device::Cuda && normed.device == Device::Cuda && cuda_ops::even_stride(x) >= 0 &&
                      cuda_ops::even_stride(normed) >= 0 && normed.ne[0] == n_embd && normed.rows() == T;
  const bool fused_here = !options_.exact && options_.fused && !pending_add_ && packed && T <= kMoeRouteMaxTokens &&
                          router.dtype == GgmlType::F32 && router.device == Device::Cuda && router.ne[0] == n_embd &&
                          router.ne[2] == 1 && router.ne[3] == 1 && router.nb[1] % 16 == 0 &&
                          logits.ne[0] == router.ne[1] && logits.rows() == T &&
                          (router_bias.empty() || (router_bias.dtype == GgmlType::F32 &&
                                                   router_bias.device == Device::Cuda &&
                                                   router_bias.elements() == router.ne[1])) &&
                          (norm_weight.empty() || (norm_weight.dtype == GgmlType::F32 &&
                                                   norm_weight.device == Device::Cuda &&
                                                   norm_weight.elements() == n_embd));
  cuda::MoeNormRouteArgs a;
  if (fused_here) {
    a.x = x.as<float>(), a.x_stride = cuda_ops::even_stride(x), a.n_embd = n_embd;
    a.normed = normed.as<float>(), a.normed_stride = cuda_ops::even_stride(normed);
    // normed must not overlap x: the blocks read x while others write their share of normed.
    const float* x_end = a.x + (T - 1) * a.x_stride + n_embd;
    const float* n_end = a.normed + (T - 1) * a.normed_stride + n_embd;
    const bool apart = x_end <= a.normed || n_end <= a.x;
    a.norm_weight = norm_weight.empty() ? nullptr : norm_weight.as<float>(), a.eps = eps;
    a.router = router.as<float>(), a.router_stride = int64_t(router.nb[1] / 4);
    a.router_bias = router_bias.empty() ? nullptr : router_bias.as<float>();
    a.route = cuda_ops::moe_route_args(logits, params, ids, weights, "rmsnorm_moe_route");
    a.logits = logits.as<float>();
    a.tickets = static_cast<unsigned*>(route_tickets_.data);
    // normed's int8 copy for the experts' gate / up (MoeFfnArgs::x_q8), unless
    // KILN_CUDA_MOE_X_IN_FRONT=0 (read once) leaves it to a launch of its own there.
    static const bool x_apart = cuda::env_is("KILN_CUDA_MOE_X_IN_FRONT", "0");
    if (!x_apart && n_embd % 32 == 0) a.q8 = q8_for_next_matmul(n_embd, T, &a.q8_row_bytes);
    if (apart && cuda::moe_norm_route_fits(a)) {
      cuda_ops::Sig sig(Op::MoeRoute);
      sig.t(x).t(norm_weight).v(eps).t(normed).t(router).t(router_bias).t(logits).t(ids).t(weights);
      sig.v(params.n_used).v(params.gating).v(params.normalize).v(params.scale).v(a.route.selection_bias);
      sig.v(a.q8);
      const PendingFront front{a, sig.h, router};
      // Held where the product before (the attention output, one token) adds into x and can
      // take the router sums: the experts after may fold the front in (record_moe_ffn).
      int64_t held_cols = 0;
      const bool foldable = options_.fold_moe_front && T == 1 && a.norm_weight && !a.router_bias &&
                            !a.route.selection_bias && a.route.n_expert <= cuda::kRouterSumsMaxExperts &&
                            held_residual_add(&held_cols) == a.x && held_cols <= cuda::kRouterSumsMaxCols;
      if (foldable)
        pending_front_ = front;
      else
        record_front(front);
      return;
    }
  }
  // Prefill with KILN_CUDA_PREFILL_ROUTER=1: the norm (taking a pending residual add), the
  // router's logits in f32 by router_logits, the routing. Off by default: on the H200 it has
  // not yet beaten cuBLAS's SGEMM (23.4 us against 20.3 per Qwen3-30B-A3B layer at T = 512,
  // docs/perf-notes-moe.md), so prefill runs the three plain ops.
  if (!options_.exact && T > kMoeRouteMaxTokens && prefill_router_enabled()) {
    rmsnorm(x, norm_weight, eps, normed);
    if (record_router_logits(normed, router, router_bias, logits)) return moe_route(logits, params, ids, weights);
    matmul(normed, router, router_bias, logits);
    return moe_route(logits, params, ids, weights);
  }
  Backend::rmsnorm_moe_route(x, norm_weight, eps, normed, router, router_bias, params, logits, ids, weights);
}

void CudaBackend::record_front(const PendingFront& held) {
  const cuda::MoeNormRouteArgs a = held.args;
  const int64_t T = a.route.n_tokens;
  record(held.sig, T, [=](cudaStream_t s) { return cuda::moe_norm_route(a, s); }, "rmsnorm_moe_route");
  remember_q8(a.normed, a.n_embd, T, a.normed_stride, a.q8);
}

bool CudaBackend::fold_pending_front(cuda::MoeFfnArgs& a) {
  const PendingFront& held = *pending_front_;
  const cuda::MoeNormRouteArgs& n = held.args;
  if (a.x != n.normed || a.ids != n.route.ids || a.weights != n.route.weights) return false;
  FoldedRouter& router = folded_router(held.router);
  double* sums = static_cast<double*>(router.sums->data());
  // One MoE layer a pass: no other fold's product would set its sums back to zero.
  if (sums == last_router_sums_) return false;
  cuda::MoeFfnArgs folded = a;
  cuda::MoeFoldedFront& f = folded.front;
  f.sums = sums;
  f.x = n.x, f.norm_weight = n.norm_weight, f.eps = n.eps, f.router_bias = n.router_bias, f.route = n.route;
  folded.x_q8 = nullptr;
  if (!cuda::moe_folded_front_fits(folded)) return false;
  cuda::PairEpilogue ep;
  ep.kind = cuda::PairEpilogueKind::RouterSums;
  ep.router.router_t = transposed_router(router, held.router);
  ep.router.norm_weight = n.norm_weight, ep.router.sums = sums, ep.router.n_expert = int(n.route.n_expert);
  ep.router.zero = last_router_sums_;
  cuda::SignatureHash sig;
  sig.pod(ep.router.router_t), sig.pod(ep.router.norm_weight), sig.pod(ep.router.sums), sig.pod(ep.router.zero);
  sig.pod(ep.router.n_expert);
  pending_front_.reset();
  fuse_into_pending_products(ep, sig, "matmul_add_router_sums");
  last_router_sums_ = sums;
  a = folded;
  return true;
}

CudaBackend::FoldedRouter& CudaBackend::folded_router(const Tensor& router) {
  for (FoldedRouter& r : folded_routers_)
    if (r.data == router.data) return r;
  FoldedRouter& r = folded_routers_.emplace_back();
  r.data = router.data;
  r.sums = allocate(size_t(cuda::kRouterSumsMaxExperts) * sizeof(double));  // zeroed
  return r;
}

const float* CudaBackend::transposed_router(FoldedRouter& record, const Tensor& router) {
  if (!record.transposed) {
    const int64_t n_embd = router.ne[0], n_expert = router.ne[1];
    record.transposed = allocate(size_t(n_embd * n_expert) * sizeof(float));
    // On the stream now, outside any graph: the decode graphs that read it run after it.
    if (const cuda::Status s = cuda::transpose_router(router.as<float>(), int64_t(router.nb[1] / 4), n_expert, n_embd,
                                                      static_cast<float*>(record.transposed->data()), stream_);
        !s.ok())
      fail("cuda backend: the transposed router of {}: {}", router.name, s.message());
  }
  return static_cast<const float*>(record.transposed->data());
}

// KILN_CUDA_PREFILL_ROUTER=1: the prefill router product by router_logits (default: cuBLAS).
bool CudaBackend::prefill_router_enabled() {
  static const bool enabled = cuda::env_is("KILN_CUDA_PREFILL_ROUTER", "1");
  return enabled;
}

bool CudaBackend::record_router_logits(const Tensor& x, const Tensor& router, const Tensor& bias, Tensor& logits) {
  const bool f32_rows = router.dtype == GgmlType::F32 && router.device == Device::Cuda && router.ne[2] == 1 &&
                        router.ne[3] == 1 && x.dtype == GgmlType::F32 && x.nb[0] == 4 && x.device == Device::Cuda &&
                        logits.dtype == GgmlType::F32 && logits.nb[0] == 4 && logits.device == Device::Cuda &&
                        cuda_ops::even_stride(x) >= 0 && cuda_ops::even_stride(logits) >= 0 &&
                        router.ne[0] == x.ne[0] && logits.ne[0] == router.ne[1] && logits.rows() == x.rows() &&
                        router.nb[1] % 4 == 0 &&
                        (bias.empty() || (bias.dtype == GgmlType::F32 && bias.device == Device::Cuda &&
                                          bias.elements() == router.ne[1]));
  if (!f32_rows) return false;
  cuda::RouterLogitsArgs a;
  a.x = x.as<float>(), a.x_stride = cuda_ops::even_stride(x);
  a.router = router.as<float>(), a.router_stride = int64_t(router.nb[1] / 4);
  a.bias = bias.empty() ? nullptr : bias.as<float>();
  a.logits = logits.as<float>(), a.logits_stride = cuda_ops::even_stride(logits);
  a.n_tokens = x.rows(), a.n_expert = router.ne[1], a.k = x.ne[0];
  // KILN_CUDA_ROUTER_PLACEMENT=0 / 1 / 2: the default cluster policy / spread (the default,
  // fastest measured) / one block per SM (see router_logits.h). The same bits whichever.
  static const cuda::RouterPlacement placement = [] {
    const int v = cuda::env_int("KILN_CUDA_ROUTER_PLACEMENT", 1);
    return v == 0 ? cuda::RouterPlacement::Default : v == 1 ? cuda::RouterPlacement::Spread
                                                            : cuda::RouterPlacement::OnePerSm;
  }();
  a.placement = placement;
  if (!cuda::router_logits_refusal(a).empty()) return false;
  cuda_ops::Sig sig(Op::Matmul);
  sig.t(x).t(router).t(bias).t(logits);
  sig.v(a.placement);
  record(sig.h, a.n_tokens, [=](cudaStream_t s) { return cuda::router_logits(a, s); }, "router_logits");
  return true;
}

void CudaBackend::moe_ffn(const Tensor& x, const ExpertWeights& ex, const Tensor& ids, const Tensor& weights,
                          const GluParams& act, Tensor& out) {
  record_moe_ffn(x, ex, ids, weights, act, out, nullptr);
}

void CudaBackend::moe_ffn_add(const Tensor& x, const ExpertWeights& ex, const Tensor& ids, const Tensor& weights,
                              const GluParams& act, Tensor& out, Tensor& residual) {
  if (!record_moe_ffn(x, ex, ids, weights, act, out, &residual)) add(residual, out, residual);
}

// The routed experts' launches; with `residual`, the add folded into the decode kernels
// where they run (true), else left to the caller (false).
bool CudaBackend::record_moe_ffn(const Tensor& x, const ExpertWeights& ex, const Tensor& ids, const Tensor& weights,
                                 const GluParams& act, Tensor& out, Tensor* residual) {
  require_moe_f32(x, "x");
  require_moe_f32(out, "out");
  require_moe_f32(weights, "weights");
  KILN_CHECK(x.data != out.data, "cuda moe_ffn: out must not alias x");
  const int64_t n_embd = x.ne[0], T = x.rows(), n_used = ids.ne[0];
  const int64_t n_expert = ex.gate.ne[2], n_ff = ex.gate.ne[1];
  KILN_CHECK(ex.gate.ne[0] == n_embd && ex.up.ne[0] == n_embd && ex.up.ne[1] == n_ff && ex.up.ne[2] == n_expert &&
                 ex.down.ne[0] == n_ff && ex.down.ne[1] == n_embd && ex.down.ne[2] == n_expert,
             "cuda moe_ffn: experts gate {} up {} down {} do not fit rows of {}", ex.gate.describe(), ex.up.describe(),
             ex.down.describe(), n_embd);
  KILN_CHECK(ids.dtype == GgmlType::I32 && ids.device == Device::Cuda && ids.rows() == T && weights.ne[0] == n_used &&
                 weights.rows() == T && out.ne[0] == n_embd && out.rows() == T,
             "cuda moe_ffn: ids {} / weights {} / out {} do not fit {} tokens", ids.describe(), weights.describe(),
             out.describe(), T);
  if (ex.gate.dtype != ex.up.dtype || !cuda::moe_supports(ex.gate.dtype, ex.down.dtype)) {
    KILN_CHECK(!has_expert_tiles(ex.gate) && !has_expert_tiles(ex.up) && !has_expert_tiles(ex.down),
               "cuda moe_ffn: experts {} / {} / {} of types {} / {} / {} are in the row-tile layout, which only the "
               "routed kernels read (KILN_CUDA_EXPERT_TILES=0 keeps the block layout)",
               ex.gate.name, ex.up.name, ex.down.name, type_name(ex.gate.dtype), type_name(ex.up.dtype),
               type_name(ex.down.dtype));
    moe_ffn_all_experts(x, ex, ids, weights, act, out);
    return false;
  }

  cuda::MoeFfnArgs a;
  a.gate = expert_matrix(ex.gate, ex.gate_bias, n_ff, n_expert, "gate");
  a.up = expert_matrix(ex.up, ex.up_bias, n_ff, n_expert, "up");
  a.down = expert_matrix(ex.down, ex.down_bias, n_embd, n_expert, "down");
  a.gate.row_tiles = has_expert_tiles(ex.gate), a.up.row_tiles = has_expert_tiles(ex.up);
  a.down.row_tiles = has_expert_tiles(ex.down);
  a.n_embd = n_embd, a.n_ff = n_ff, a.n_expert = n_expert, a.n_used = n_used, a.n_tokens = T;
  a.x = x.as<float>(), a.x_stride = moe_row_stride(x, "x");
  a.ids = ids.as<int32_t>(), a.ids_stride = moe_row_stride(ids, "ids");
  a.weights = weights.as<float>(), a.weights_stride = moe_row_stride(weights, "weights");
  a.out = out.as<float>(), a.out_stride = moe_row_stride(out, "out");
  a.act = cuda_ops::glu_kind(act.act);
  a.alpha = act.alpha, a.limit = act.limit;

  const bool exact = options_.exact;
  // f32 experts (test models) keep f32 products at every batch size, as the dense f32 path does.
  const bool f32_experts = ex.gate.dtype == GgmlType::F32 || ex.down.dtype == GgmlType::F32;
  const bool grouped = !exact && !f32_experts && T > kMoeMatvecMaxTokens && cuda::moe_gemm_fits(a);
  const bool fold = residual && residual->dtype == GgmlType::F32 && residual->device == Device::Cuda &&
                    residual->ne[0] == n_embd && residual->rows() == T && residual->data != x.data &&
                    residual->data != out.data;
  if (fold) a.residual = residual->as<float>(), a.residual_stride = moe_row_stride(*residual, "residual");
  // h's int8 copy made inside the gate / up launch; KILN_CUDA_MOE_H_IN_GATE_UP=0 (read once)
  // keeps the launch of its own.
  static const bool h_apart = cuda::env_is("KILN_CUDA_MOE_H_IN_GATE_UP", "0");
  if (!grouped && !h_apart) a.h_tickets = moe_h_tickets(cuda::moe_h_ticket_count(a));
  // The front held behind the attention output product folds into it and these kernels, or
  // is recorded now (after that product), as it would have been.
  const bool folded = pending_front_ && !grouped && !exact && fold_pending_front(a);
  if (pending_front_) flush_pending();
  // x's int8 copy where the op before made one (the front, rmsnorm_moe_route).
  if (!folded && !grouped && !exact && quantized_input_.q8 &&
      quantized_input_ == QuantizedInput{a.x, n_embd, T, a.x_stride, quantized_input_.q8}) {
    a.x_q8 = static_cast<const uint8_t*>(quantized_input_.q8);
    a.x_q8_row_bytes = int64_t(cuda_ops::q8_row_bytes(n_embd));
  }
  const size_t need = grouped ? cuda::moe_gemm_scratch_bytes(a) : cuda::moe_matvec_scratch_bytes(a, exact);
  void* sp = scratch(moe_scratch_, need);
  cuda::SignatureHash sig;
  sig.pod(Op::MoeFfn);
  for (const Tensor* t : std::initializer_list<const Tensor*>{&x, &ex.gate, &ex.up, &ex.down, &ex.gate_bias, &ex.up_bias, &ex.down_bias, &ids, &weights, &out}) {
    sig.pod(t->dtype), sig.pod(t->data), sig.bytes(t->ne, sizeof(t->ne)), sig.bytes(t->nb, sizeof(t->nb));
  }
  sig.pod(act.act), sig.pod(act.alpha), sig.pod(act.limit), sig.pod(sp), sig.pod(grouped), sig.pod(a.residual);
  sig.pod(a.h_tickets), sig.pod(a.x_q8), sig.pod(a.front.sums), sig.pod(a.front.x);
  if (grouped)
    record(sig, T, [=](cudaStream_t s) { return cuda::moe_ffn_gemm(a, sp, need, s); }, "moe_ffn");
  else
    record(sig, T, [=](cudaStream_t s) { return cuda::moe_ffn_matvec(a, exact, sp, need, s); }, "moe_ffn");
  return fold;
}

// Every expert runs on every token (dense), and the combine keeps each token's routed
// experts with their weights: n_expert / n_used times the routed cost, kept for expert
// types the routed kernels refuse.
void CudaBackend::moe_ffn_all_experts(const Tensor& x, const ExpertWeights& ex, const Tensor& ids,
                                      const Tensor& weights, const GluParams& act, Tensor& out) {
  const int64_t n_embd = x.ne[0], T = x.rows(), n_used = ids.ne[0];
  const int64_t n_expert = ex.gate.ne[2], n_ff = ex.gate.ne[1];
  const size_t floats = size_t(2 * n_ff + n_embd) * size_t(T);
  auto* base = static_cast<float*>(scratch(moe_scratch_, floats * sizeof(float)));
  Tensor gate = Tensor::contiguous(GgmlType::F32, {n_ff, T}, base, Device::Cuda, "moe_gate");
  Tensor up = Tensor::contiguous(GgmlType::F32, {n_ff, T}, base + n_ff * T, Device::Cuda, "moe_up");
  Tensor y = Tensor::contiguous(GgmlType::F32, {n_embd, T}, base + 2 * n_ff * T, Device::Cuda, "moe_y");
  for (int64_t e = 0; e < n_expert; ++e) {
    matmul(x, ex.gate.matrix(e), bias_of_expert(ex.gate_bias, e), gate);
    matmul(x, ex.up.matrix(e), bias_of_expert(ex.up_bias, e), up);
    glu(gate, up, act, gate);
    matmul(gate, ex.down.matrix(e), bias_of_expert(ex.down_bias, e), y);
    cuda::MoeCombineArgs c;
    c.y = y.as<float>(), c.y_stride = n_embd;
    c.ids = ids.as<int32_t>(), c.ids_stride = int64_t(ids.nb[1] / 4);
    c.weights = weights.as<float>(), c.weights_stride = int64_t(weights.nb[1] / 4);
    c.n_used = int(n_used), c.expert = int(e), c.accumulate = e > 0;
    c.out = out.as<float>(), c.out_stride = moe_row_stride(out, "out");
    c.n_tokens = T, c.n = n_embd;
    cuda::SignatureHash sig;
    sig.pod(Op::MoeFfn), sig.pod(y.data), sig.pod(ids.data), sig.pod(weights.data), sig.pod(out.data), sig.pod(e);
    record(sig, T, [=](cudaStream_t s) { return cuda::moe_combine(c, s); }, "moe_ffn");
  }
}

}  // namespace kiln
