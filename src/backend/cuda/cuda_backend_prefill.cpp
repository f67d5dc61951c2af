// The CUDA backend's prefill products over several weights (q/k/v, gate/up): one rounding of
// the input, one dequantization slab, then the products (gemm.h, gemm_parts). Decode batches
// and exact mode never come here.
//
// Side streams: gemm_parts can run the parts side by side, but on an H200 (llama3-8b F16,
// pp512) four lanes measured 31,949 t/s against 33,046 with one (docs/perf-notes.md,
// round 4), so one lane is the default; KILN_CUDA_PREFILL_LANES=n asks for n.
//
// Joined parts: prefill batches ask the model for q/k/v (and gate/up) as column ranges of one
// buffer (prefers_joined_parts); with the weights loaded side by side (weights_side_by_side)
// or dequantized into one slab, gemm_parts then runs them as one product (Llama-3-8B q/k/v:
// 6144 rows instead of 4096 + 1024 + 1024). KILN_CUDA_PREFILL_JOIN=0 keeps separate outputs
// and one product per part (CudaOptions::joined_parts).
//
// glu_matmul_add (the down projection after the FFN's glu): the glu kernel writes the
// product's rounded input (glu_half.h) and gemm() reads it (GemmArgs::x_half), so the f32
// activation is never written (CudaOptions::glu_half_input). Likewise the norm before q/k/v
// and gate/up, and the attention before o, write their output's rounded copy for the product
// after them where it takes it (CudaBackend::PendingHalfSource, CudaOptions::half_copies).
#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_backend_checks.h"
#include "backend/cuda/env_switch.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/glu_half.h"

namespace kiln {

namespace cuda_prefill {

constexpr int64_t kMinTokens = 9;                   // fewer rows go to the decode paths
using cuda_ops::kSlabBytes;                         // the single matmul's slab
constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // cuBLAS workspace of each side lane

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("cuda backend: {}: {}", what, cudaGetErrorString(e));
}

bool packed_rows(const Tensor& t) {
  return !t.empty() && t.dtype == GgmlType::F32 && t.nb[0] == sizeof(float) && t.device == Device::Cuda &&
         t.ne[2] == 1 && t.ne[3] == 1;
}

using cuda_ops::hash_tensor;

}  // namespace cuda_prefill

// Side streams, their cuBLAS handles and the fork / join events (made on first use).
struct CudaBackend::PrefillLanes {
  cuda::GemmLanes lanes;
  ~PrefillLanes() {
    for (int i = 1; i < lanes.count; ++i) {
      if (lanes.blas[i]) cublasDestroy(lanes.blas[i]);
      if (lanes.join[i]) cudaEventDestroy(lanes.join[i]);
      if (lanes.stream[i]) cudaStreamDestroy(lanes.stream[i]);
    }
    if (lanes.fork) cudaEventDestroy(lanes.fork);
  }
};

bool CudaBackend::holds_half_sources(int64_t tokens) const {
  return options_.half_copies && !options_.exact && tokens >= cuda_prefill::kMinTokens;
}

void CudaBackend::hold_half_source(PendingHalfSource held) {
  flush_pending();  // whatever was held before goes first
  pending_half_source_ = std::move(held);
  quantized_input_ = {};  // the held launch writes its output
}

const void* CudaBackend::record_half_source_for(const float* x, int64_t cols, int64_t rows, int64_t stride,
                                                GgmlType weight_type) {
  if (!pending_half_source_) return nullptr;
  PendingHalfSource h = std::move(*pending_half_source_);
  pending_half_source_.reset();  // record() finds none held
  const bool copies = x && h.out == x && h.cols == cols && h.rows == rows && h.stride == stride &&
                      weight_type != GgmlType::F32 && cuda::gemm_supports(weight_type);
  void* half = copies ? scratch(half_copy_scratch_, size_t(rows) * size_t(cols) * 2) : nullptr;
  const bool bf16 = weight_type != GgmlType::F16;  // gemm() rounds x to bf16 for bf16 and quantized weights
  cuda::SignatureHash sig = h.sig;
  sig.pod(half), sig.pod(bf16);
  record(sig, h.tokens, [launch = std::move(h.launch), half, bf16](cudaStream_t s) { return launch(s, half, bf16); },
         h.op);
  if (half) ++half_copies_taken_;
  return half;
}

bool CudaBackend::prefers_joined_parts(int64_t tokens) const {
  return !options_.exact && options_.joined_parts && tokens >= cuda_prefill::kMinTokens;
}

bool CudaBackend::matmul_parts_prefill(const Tensor& x, std::span<const MatmulPart> parts) {
  using namespace cuda_prefill;
  // KILN_CUDA_PREFILL_PARTS=0: parts one by one (to measure what this saves);
  // KILN_CUDA_PREFILL_LANES=n: n streams (1: all products on the pass's stream).
  static const bool enabled = !cuda::env_is("KILN_CUDA_PREFILL_PARTS", "0");
  static const int lane_count = std::clamp(cuda::env_int("KILN_CUDA_PREFILL_LANES", 1), 1, cuda::kMaxGemmLanes);
  // KILN_CUDA_PREFILL_MIXED_PARTS=0: quantized parts of different types (Q4_K_M's q4_K q/k
  // and q6_K v) run as separate products, each rounding x again.
  static const bool mixed_enabled = !cuda::env_is("KILN_CUDA_PREFILL_MIXED_PARTS", "0");
  const int64_t K = x.ne[0], T = x.ne[1];
  if (!enabled || options_.exact || T < kMinTokens || parts.size() < 2 ||
      parts.size() > size_t(cuda::kMaxGemmLanes) || !packed_rows(x))
    return false;
  const Tensor& w0 = *parts[0].w;
  const GgmlType type = w0.dtype;
  if (type == GgmlType::F32 || !cuda::gemm_supports(type)) return false;
  auto quantized = [](GgmlType t) { return t != GgmlType::F32 && t != GgmlType::F16 && t != GgmlType::BF16; };
  for (const MatmulPart& p : parts) {
    KILN_CHECK(p.w && p.out, "cuda matmul_parts: a part lacks its weight or output");
    const Tensor& w = *p.w;
    const Tensor& out = *p.out;
    const bool same = w.dtype == type && w.nb[1] == w0.nb[1];
    const bool mixes = mixed_enabled && quantized(type) && quantized(w.dtype) && cuda::gemm_supports(w.dtype);
    if (!(same || mixes) || w.device != Device::Cuda || w.ne[0] != K || w.ne[2] != 1 || w.ne[3] != 1 ||
        !packed_rows(out) || out.ne[0] != w.ne[1] || out.ne[1] != T)
      return false;
  }

  std::vector<cuda::GemmPart> gp;
  for (const MatmulPart& p : parts) {
    cuda::GemmPart g{p.w->data, p.w->ne[1], p.out->as<float>(), int64_t(p.out->nb[1] / 4)};
    if (p.w->dtype != type || p.w->nb[1] != w0.nb[1]) g.own_row_bytes = int64_t(p.w->nb[1]), g.own_type = p.w->dtype;
    gp.push_back(g);
  }
  cuda::GemmPartsArgs a;
  a.type = type, a.w_row_bytes = int64_t(w0.nb[1]), a.k = K;
  a.x = x.as<float>(), a.x_stride = int64_t(x.nb[1] / 4), a.t = T;
  a.parts = gp;
  a.join = options_.joined_parts;
  if (type != GgmlType::F16 && type != GgmlType::BF16) {  // quantized: every part's rows in one bf16 slab
    size_t slab = 0;
    for (const cuda::GemmPart& p : gp) slab += size_t(p.n) * size_t(K) * 2;
    if (slab > kSlabBytes) return false;  // too large: one part at a time, in slabs
  }
  a.x_half = record_half_source_for(a.x, K, T, a.x_stride, type);
  const size_t need = cuda::gemm_parts_scratch_bytes(a);

  if (!prefill_lanes_) {
    prefill_lanes_ = std::make_shared<PrefillLanes>();
    cuda::GemmLanes& l = prefill_lanes_->lanes;
    l.count = lane_count;
    l.blas[0] = blas_;
    check(cudaEventCreateWithFlags(&l.fork, cudaEventDisableTiming), "cudaEventCreate (prefill fork)");
    for (int i = 1; i < l.count; ++i) {
      check(cudaStreamCreateWithFlags(&l.stream[i], cudaStreamNonBlocking), "cudaStreamCreate (prefill lane)");
      check(cudaEventCreateWithFlags(&l.join[i], cudaEventDisableTiming), "cudaEventCreate (prefill join)");
      if (cublasCreate(&l.blas[i]) != CUBLAS_STATUS_SUCCESS) fail("cuda backend: cublasCreate failed (prefill lane)");
      Scratch workspace;
      void* ws = scratch(workspace, kWorkspaceBytes);
      cublasSetWorkspace(l.blas[i], ws, kWorkspaceBytes);
    }
  }
  void* sp = scratch(matmul_scratch_, need);
  const cuda::GemmLanes lanes_template = prefill_lanes_->lanes;
  const size_t n = gp.size();
  std::array<cuda::GemmPart, cuda::kMaxGemmLanes> parts_copy{};
  for (size_t i = 0; i < n; ++i) parts_copy[i] = gp[i];

  cuda::SignatureHash h;
  h.pod(Op::Matmul), h.pod(n), h.pod(true), h.pod(a.x_half);
  hash_tensor(h, x);
  for (const MatmulPart& p : parts) hash_tensor(h, *p.w), hash_tensor(h, *p.out);
  record(h, T, [=](cudaStream_t s) {
    cuda::GemmLanes lanes = lanes_template;
    lanes.stream[0] = s;
    cuda::GemmPartsArgs args = a;
    args.parts = std::span<const cuda::GemmPart>(parts_copy.data(), n);
    return cuda::gemm_parts(args, lanes, sp, need);
  }, "matmul_parts");
  for (const MatmulPart& p : parts)
    if (p.bias && !p.bias->empty()) add_bias(*p.bias, *p.out);
  return true;
}

void CudaBackend::glu_matmul_add(const Tensor& gate, const Tensor& up, const GluParams& p, Tensor& act,
                                 const Tensor& w, const Tensor& bias, Tensor& out, Tensor& residual) {
  using namespace cuda_prefill;
  const int64_t n = gate.ne[0], T = gate.ne[1], N = w.ne[1];
  const GgmlType type = w.dtype;
  auto rows_2d = [](const Tensor& t) { return t.dtype == GgmlType::F32 && t.nb[0] == sizeof(float) && t.ne[2] == 1 &&
                                              t.ne[3] == 1 && t.nb[1] % 16 == 0 && t.device == Device::Cuda; };
  const bool fits = options_.glu_half_input && !options_.exact && T >= kMinTokens && T <= 65535 &&
                    type != GgmlType::F32 && cuda::gemm_supports(type) && w.device == Device::Cuda && w.ne[0] == n &&
                    w.ne[2] == 1 && w.ne[3] == 1 && n % traits(type).block_size == 0 && n % 2 == 0 &&
                    rows_2d(gate) && rows_2d(up) && up.ne[0] == n && up.ne[1] == T && packed_rows(out) &&
                    out.ne[0] == N && out.ne[1] == T && packed_rows(residual) && residual.ne[0] == N &&
                    residual.ne[1] == T && residual.data != out.data;
  if (!fits) return Backend::glu_matmul_add(gate, up, p, act, w, bias, out, residual);

  cuda::GluHalfArgs ga;
  ga.kind = cuda_ops::glu_kind(p.act);
  ga.gate = gate.as<float>(), ga.gate_stride = int64_t(gate.nb[1] / 4);
  ga.up = up.as<float>(), ga.up_stride = int64_t(up.nb[1] / 4);
  ga.rows = T, ga.n = n, ga.alpha = p.alpha, ga.limit = p.limit;
  ga.bf16 = type != GgmlType::F16;  // gemm() rounds x to bf16 for bf16 and quantized weights
  ga.out = scratch(glu_half_scratch_, size_t(T) * size_t(n) * 2);

  cuda::GemmArgs g;
  g.type = type, g.w = w.data, g.w_row_bytes = int64_t(w.nb[1]), g.n = N, g.k = n;
  g.t = T, g.y = out.as<float>(), g.y_stride = int64_t(out.nb[1] / 4), g.x_half = ga.out;
  const bool float_weights = type == GgmlType::F16 || type == GgmlType::BF16;
  const int64_t slab = float_weights ? 0 : std::max<int64_t>(64, int64_t(kSlabBytes / (size_t(n) * 2)) / 64 * 64);
  const size_t need = cuda::gemm_scratch_bytes(g, slab);
  void* sp = scratch(matmul_scratch_, need);
  cublasHandle_t blas = blas_;

  const cuda_ops::Sig sig = cuda_ops::Sig(Op::Glu).t(gate).t(up).t(w).t(out).v(p.act).v(p.alpha).v(p.limit);
  record(sig.h, T, [=](cudaStream_t s) {
    if (cuda::Status st = cuda::glu_to_half(ga, s); !st.ok()) return st;
    return cuda::gemm(g, blas, sp, need, s);
  }, "glu_matmul");
  add_bias(bias, out);
  defer_add(out, residual);
}

}  // namespace kiln
