// Timed algorithm choice for the prefill products through cuBLASLt (see gemm_lt.h).
#include "backend/cuda/gemm_lt.h"

#include <cublasLt.h>

#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cuda/env_switch.h"

namespace kiln::cuda {
namespace {

constexpr int kCandidates = 8;
constexpr int kTimedRuns = 3;

// The largest power of two (up to 256) that divides the address: part of the key, since
// an algorithm may need aligned operands.
uint32_t alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && a % align != 0) align /= 2;
  return align;
}

// The mode is part of the key: a plan chosen under one mode is never used under another.
using Key = std::tuple<int, int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, uint32_t, uint32_t, uint32_t>;

Key key_of(const LtProduct& p, int mode) {
  return Key{mode, int(p.type), p.rows, p.t, p.k, p.ldw, p.ldx, p.ldy, alignment(p.w), alignment(p.x), alignment(p.y)};
}

// A shape's descriptors and the algorithm chosen for it (usable = false: cublasGemmEx, which
// was the fastest, or nothing could be timed).
struct Plan {
  bool usable = false;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  size_t workspace = 0;
};

struct Registry {
  std::mutex mutex;
  // KILN_CUDA_GEMM_TUNE (see gemm_lt.h), read once; set_gemm_tuning_mode changes it.
  int mode = env_int("KILN_CUDA_GEMM_TUNE", 0);
  cublasLtHandle_t handle = nullptr;
  bool handle_failed = false;
  std::map<Key, Plan> plans;
};

Registry& registry() {
  static Registry r;  // process lifetime: plans are never freed
  return r;
}

bool ok(cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS; }

// Descriptors of the product: D = op(A) B with A = W (k x rows, transposed), B = X (k x t).
bool describe(const LtProduct& p, Plan& plan) {
  const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
  return ok(cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F)) &&
         ok(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a))) &&
         ok(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b))) &&
         ok(cublasLtMatrixLayoutCreate(&plan.a, p.type, uint64_t(p.k), uint64_t(p.rows), p.ldw)) &&
         ok(cublasLtMatrixLayoutCreate(&plan.b, p.type, uint64_t(p.k), uint64_t(p.t), p.ldx)) &&
         ok(cublasLtMatrixLayoutCreate(&plan.c, CUDA_R_32F, uint64_t(p.rows), uint64_t(p.t), p.ldy));
}

cublasStatus_t launch(cublasLtHandle_t handle, const Plan& plan, const cublasLtMatmulAlgo_t& algo, const LtProduct& p,
                      void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  const float alpha = 1.0f, beta = 0.0f;
  return cublasLtMatmul(handle, plan.desc, &alpha, p.w, plan.a, p.x, plan.b, &beta, p.y, plan.c, p.y, plan.c, &algo,
                        workspace, workspace_bytes, stream);
}

// The product's rows x t outputs, packed, copied to the host (false: the copy failed).
bool read_output(const LtProduct& p, std::vector<float>& out, cudaStream_t stream) {
  out.resize(size_t(p.rows) * size_t(p.t));
  return cudaMemcpy2DAsync(out.data(), size_t(p.rows) * 4, p.y, size_t(p.ldy) * 4, size_t(p.rows) * 4, size_t(p.t),
                           cudaMemcpyDeviceToHost, stream) == cudaSuccess &&
         cudaStreamSynchronize(stream) == cudaSuccess;
}

// The heuristic's candidates for the product, best first (at most kCandidates); 0 where none.
int candidates(cublasLtHandle_t handle, const LtProduct& p, const Plan& plan, size_t workspace_bytes,
               cublasLtMatmulHeuristicResult_t (&found)[kCandidates]) {
  cublasLtMatmulPreference_t pref = nullptr;
  if (!ok(cublasLtMatmulPreferenceCreate(&pref))) return 0;
  const uint64_t ws = workspace_bytes;
  const uint32_t align_a = alignment(p.w), align_b = alignment(p.x), align_c = alignment(p.y);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof(align_a));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof(align_b));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c, sizeof(align_c));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c, sizeof(align_c));
  int n_found = 0;
  const bool listed = ok(cublasLtMatmulAlgoGetHeuristic(handle, plan.desc, plan.a, plan.b, plan.c, plan.c, pref,
                                                        kCandidates, found, &n_found));
  cublasLtMatmulPreferenceDestroy(pref);
  return listed ? n_found : 0;
}

// Whether candidate `c` can run with this workspace.
bool runnable(const cublasLtMatmulHeuristicResult_t& c, size_t workspace_bytes) {
  return ok(c.state) && c.workspaceSize <= workspace_bytes;
}

// Times `run` (kTimedRuns launches on `stream`) into *ms; false where a launch or an event
// failed.
template <typename Run>
bool time_runs(Run&& run, cudaStream_t stream, cudaEvent_t start, cudaEvent_t end, float* ms) {
  if (cudaEventRecord(start, stream) != cudaSuccess) return false;
  bool ran = true;
  for (int r = 0; r < kTimedRuns && ran; ++r) ran = ok(run());
  return ran && cudaEventRecord(end, stream) == cudaSuccess && cudaEventSynchronize(end) == cudaSuccess &&
         cudaEventElapsedTime(ms, start, end) == cudaSuccess;
}

// cublasGemmEx, then every candidate of the heuristic whose output has its bits (any, in
// mode 2), timed on the real operands; the fastest cuBLASLt candidate is kept
// where it beats cublasGemmEx (plan.usable), else the plan says to call cublasGemmEx.
void choose(cublasLtHandle_t handle, cublasHandle_t blas, const LtProduct& p, int mode, Plan& plan, void* workspace,
            size_t workspace_bytes, cudaStream_t stream) {
  cudaEvent_t start = nullptr, end = nullptr;
  if (cudaEventCreate(&start) != cudaSuccess || cudaEventCreate(&end) != cudaSuccess) {
    if (start) cudaEventDestroy(start);
    return;
  }
  const bool same_bits = mode != 2;
  std::vector<float> reference, output;
  float best = 0.0f;
  const bool reference_ran = ok(gemm_ex_product(blas, p)) && (!same_bits || read_output(p, reference, stream)) &&
                             time_runs([&] { return gemm_ex_product(blas, p); }, stream, start, end, &best);
  cublasLtMatmulHeuristicResult_t found[kCandidates] = {};
  const int n_found = reference_ran ? candidates(handle, p, plan, workspace_bytes, found) : 0;
  for (int i = 0; i < n_found; ++i) {
    if (!runnable(found[i], workspace_bytes)) continue;
    auto run = [&] { return launch(handle, plan, found[i].algo, p, workspace, workspace_bytes, stream); };
    if (!ok(run())) continue;  // warm-up, its output checked
    if (same_bits && (!read_output(p, output, stream) ||
                      std::memcmp(output.data(), reference.data(), output.size() * sizeof(float)) != 0))
      continue;
    float ms = 0.0f;
    if (time_runs(run, stream, start, end, &ms) && ms < best) {
      best = ms;
      plan.algo = found[i].algo;
      plan.workspace = found[i].workspaceSize;
      plan.usable = true;
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(end);
  cudaGetLastError();  // a failed candidate leaves nothing behind
}

bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  return cudaStreamIsCapturing(stream, &status) != cudaSuccess || status != cudaStreamCaptureStatusNone;
}

}  // namespace

int gemm_tuning_mode() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.mode;
}

void set_gemm_tuning_mode(int mode) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.mode = mode;
}

bool lt_planned(const LtProduct& p) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.mode == 0 || r.plans.count(key_of(p, r.mode)) != 0;
}

cublasStatus_t gemm_ex_product(cublasHandle_t blas, const LtProduct& p) {
  const float alpha = 1.0f, beta = 0.0f;
  return cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, int(p.rows), int(p.t), int(p.k), &alpha, p.w, p.type, int(p.ldw),
                      p.x, p.type, int(p.ldx), &beta, p.y, CUDA_R_32F, int(p.ldy), CUBLAS_COMPUTE_32F,
                      CUBLAS_GEMM_DEFAULT);
}

bool lt_product(const LtProduct& p, cublasHandle_t blas, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                Status* status) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (r.mode == 0) return false;
  if (!r.handle && !r.handle_failed) r.handle_failed = !ok(cublasLtCreate(&r.handle));
  if (r.handle_failed) return false;
  const Key key = key_of(p, r.mode);
  auto it = r.plans.find(key);
  if (it == r.plans.end()) {
    if (capturing(stream)) return false;  // no timing inside a graph capture
    Plan plan;
    if (describe(p, plan)) choose(r.handle, blas, p, r.mode, plan, workspace, workspace_bytes, stream);
    it = r.plans.emplace(key, plan).first;
  }
  const Plan& plan = it->second;
  if (!plan.usable) return false;
  const cublasStatus_t s = launch(r.handle, plan, plan.algo, p, workspace, workspace_bytes, stream);
  if (!ok(s))
    *status = Status::from_cuda(cudaErrorUnknown, std::string("gemm: cublasLtMatmul failed: ") + cublasGetStatusString(s));
  return true;
}

}  // namespace kiln::cuda
