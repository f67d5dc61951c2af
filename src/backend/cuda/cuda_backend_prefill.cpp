// The CUDA backend's prefill products over several weights (q/k/v, gate/up): one rounding of
// the input, one dequantization slab, then the products (gemm.h, gemm_parts). Decode batches
// and exact mode never come here.
//
// Side streams: gemm_parts can run the parts side by side, but on an H200 (llama3-8b F16,
// pp512) four lanes measured 31,949 t/s against 33,046 with one (docs/perf-notes.md,
// round 4), so one lane is the default; KILN_CUDA_PREFILL_LANES=n asks for n.
#include <array>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/gemm.h"

namespace kiln {

namespace cuda_prefill {

constexpr int64_t kMinTokens = 9;                   // fewer rows go to the decode paths
constexpr size_t kSlabBytes = size_t(256) << 20;    // as the single matmul's slab
constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // cuBLAS workspace of each side lane

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("cuda backend: {}: {}", what, cudaGetErrorString(e));
}

bool packed_rows(const Tensor& t) {
  return !t.empty() && t.dtype == GgmlType::F32 && t.nb[0] == sizeof(float) && t.device == Device::Cuda &&
         t.ne[2] == 1 && t.ne[3] == 1;
}

void hash_tensor(cuda::SignatureHash& h, const Tensor& x) {
  h.pod(x.dtype), h.pod(x.data), h.bytes(x.ne, sizeof(x.ne)), h.bytes(x.nb, sizeof(x.nb));
}

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

bool CudaBackend::matmul_parts_prefill(const Tensor& x, std::span<const MatmulPart> parts) {
  using namespace cuda_prefill;
  // KILN_CUDA_PREFILL_PARTS=0: parts one by one (to measure what this saves);
  // KILN_CUDA_PREFILL_LANES=n: n streams (1: all products on the pass's stream).
  static const bool enabled = [] {
    const char* env = std::getenv("KILN_CUDA_PREFILL_PARTS");
    return !(env && std::string(env) == "0");
  }();
  static const int lane_count = [] {
    const char* env = std::getenv("KILN_CUDA_PREFILL_LANES");
    const int n = env ? std::atoi(env) : 1;
    return n < 1 ? 1 : n > cuda::kMaxGemmLanes ? cuda::kMaxGemmLanes : n;
  }();
  // KILN_CUDA_PREFILL_MIXED_PARTS=0: quantized parts of different types (Q4_K_M's q4_K q/k
  // and q6_K v) run as separate products, each rounding x again.
  static const bool mixed_enabled = [] {
    const char* env = std::getenv("KILN_CUDA_PREFILL_MIXED_PARTS");
    return !(env && std::string(env) == "0");
  }();
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
  if (type != GgmlType::F16 && type != GgmlType::BF16) {  // quantized: every part's rows in one bf16 slab
    size_t slab = 0;
    for (const cuda::GemmPart& p : gp) slab += size_t(p.n) * size_t(K) * 2;
    if (slab > kSlabBytes) return false;  // too large: one part at a time, in slabs
  }
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
  h.pod(Op::Matmul), h.pod(n), h.pod(true);
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

}  // namespace kiln
