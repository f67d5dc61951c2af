// The timed cuBLASLt choice (backend/cuda/gemm_lt.h) never changes a product's bits: whatever
// the timing keeps, the output equals cublasGemmEx's (cuBLAS's own algorithm), bit for bit, on
// the first (timed) use of a shape and on later (planned) ones. Split-k candidates round
// differently, and for small token counts they are often the fastest, so a choice among all
// candidates (mode 2) fails this. Each product is also checked against a
// double-precision reference on sampled outputs (error bound: f32 accumulation of rounded
// inputs, 1e-4 * sum |w x|).
#include <cmath>
#include <cstdlib>
#include <cstring>

#include <cublas_v2.h>

#include "backend/cuda/gemm_lt.h"
#include "cuda_test_support.h"

namespace kiln::cuda {
namespace {

using namespace kiln::cuda::testing;

struct LtCase {
  cudaDataType_t type;
  int64_t rows, t, k;
};

uint16_t to_half_bits(cudaDataType_t type, float v) { return type == CUDA_R_16F ? f32_to_f16(v) : f32_to_bf16(v); }
float from_half_bits(cudaDataType_t type, uint16_t v) { return type == CUDA_R_16F ? f16_to_f32(v) : bf16_to_f32(v); }

TEST(CudaGemmLt, TimedChoiceKeepsGemmExBits) {
  KILN_REQUIRE_GPU();
  // The timed path in mode 1 (off by default), whatever KILN_CUDA_GEMM_TUNE says; the mode
  // the process had comes back at the end. KILN_CUDA_GEMM_TUNE_TEST_MODE=2 gives the property
  // up (any candidate): the test then fails where a candidate of other bits is the fastest.
  const char* asked = std::getenv("KILN_CUDA_GEMM_TUNE_TEST_MODE");
  struct RestoreMode {
    int mode = gemm_tuning_mode();
    ~RestoreMode() { set_gemm_tuning_mode(mode); }
  } restore;
  set_gemm_tuning_mode(asked && std::strcmp(asked, "2") == 0 ? 2 : 1);
  cublasHandle_t blas = nullptr;
  ASSERT_EQ(CUBLAS_STATUS_SUCCESS, cublasCreate(&blas));
  struct Destroy {
    cublasHandle_t h;
    ~Destroy() { cublasDestroy(h); }
  } destroy{blas};
  const LtCase cases[] = {
      {CUDA_R_16BF, 4096, 12, 4096},  // few tokens, long k: split-k candidates
      {CUDA_R_16F, 1024, 29, 2048},
      {CUDA_R_16BF, 2048, 9, 6144},
      {CUDA_R_16BF, 4096, 512, 4096},
  };
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (const LtCase& c : cases) {
    SCOPED_TRACE("rows " + std::to_string(c.rows) + ", t " + std::to_string(c.t) + ", k " + std::to_string(c.k));
    std::vector<uint16_t> w(size_t(c.rows * c.k)), x(size_t(c.t * c.k));
    for (uint16_t& v : w) v = to_half_bits(c.type, dist(rng));
    for (uint16_t& v : x) v = to_half_bits(c.type, dist(rng));
    const DeviceBuffer w_d = to_device(w), x_d = to_device(x), ws(kLtWorkspaceBytes);
    const size_t n_out = size_t(c.rows * c.t);
    const DeviceBuffer timed(n_out * 4), gemm_ex(n_out * 4), planned(n_out * 4);
    ASSERT_TRUE(w_d.ok() && x_d.ok() && ws.ok() && timed.ok() && gemm_ex.ok() && planned.ok());

    LtProduct p;
    p.type = c.type, p.rows = c.rows, p.t = c.t, p.k = c.k;
    p.w = w_d.as(), p.ldw = c.k, p.x = x_d.as(), p.ldx = c.k, p.ldy = c.rows;
    Status status;
    // Where lt_product declines, cublasGemmEx was the fastest and the caller runs it.
    const auto run = [&](float* y) {
      p.y = y;
      if (!lt_product(p, blas, ws.as(), kLtWorkspaceBytes, nullptr, &status))
        ASSERT_EQ(CUBLAS_STATUS_SUCCESS, gemm_ex_product(blas, p));
      ASSERT_TRUE(status.ok()) << status.message();
    };
    run(timed.as<float>());
    if (HasFatalFailure()) return;
    run(planned.as<float>());
    if (HasFatalFailure()) return;
    p.y = gemm_ex.as<float>();
    ASSERT_EQ(CUBLAS_STATUS_SUCCESS, gemm_ex_product(blas, p));
    const std::vector<float> y_timed = to_host<float>(timed, n_out), y_planned = to_host<float>(planned, n_out),
                             y_gemm_ex = to_host<float>(gemm_ex, n_out);
    size_t differing = 0, first_differing = n_out;
    for (size_t i = 0; i < n_out; ++i) {
      const bool same =
          std::memcmp(&y_timed[i], &y_gemm_ex[i], 4) == 0 && std::memcmp(&y_planned[i], &y_gemm_ex[i], 4) == 0;
      if (!same && differing++ == 0) first_differing = i;
    }
    EXPECT_EQ(0u, differing) << "outputs whose bits differ from cublasGemmEx's; first at "
                             << first_differing << ": timed " << y_timed[first_differing] << ", planned "
                             << y_planned[first_differing] << ", cublasGemmEx " << y_gemm_ex[first_differing];

    // The product itself, on 97 sampled outputs.
    for (size_t s = 0; s < 97; ++s) {
      const size_t i = (s * 7919) % n_out;
      const int64_t row = int64_t(i) % c.rows, col = int64_t(i) / c.rows;
      double ref = 0, bound = 0;
      for (int64_t kk = 0; kk < c.k; ++kk) {
        const double v = double(from_half_bits(c.type, w[size_t(row * c.k + kk)])) *
                         double(from_half_bits(c.type, x[size_t(col * c.k + kk)]));
        ref += v, bound += std::fabs(v);
      }
      ASSERT_NEAR(ref, y_gemm_ex[i], 1e-4 * bound) << "output " << row << ", token " << col;
    }
  }
}

}  // namespace
}  // namespace kiln::cuda
