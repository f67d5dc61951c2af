#pragma once
// The fixture of the CUDA backend's fused-op tests (fused_ops_test.cpp,
// pair_epilogue_test.cpp): a backend without graphs, device tensors made from host data,
// random weights of any type, poisoned (NaN) outputs, and a product run apart from any
// fusion.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "cuda_test_support.h"

namespace kiln::testing {

using cuda::testing::all_close;
using cuda::testing::all_equal_bits;
using cuda::testing::double_rmsnorm;
using cuda::testing::random_floats;
using cuda::testing::random_rows;

class FusedOps : public ::testing::Test {
 protected:
  void SetUp() override {
    KILN_REQUIRE_GPU();
    CudaOptions o;
    o.graphs = false;
    gpu_ = std::make_unique<CudaBackend>(o);
  }
  Tensor floats(std::initializer_list<int64_t> shape, const std::vector<float>& data) {
    buffers_.push_back(gpu_->allocate(data.size() * sizeof(float)));
    Tensor t = buffers_.back()->view(GgmlType::F32, shape);
    gpu_->upload(data.data(), t, data.size() * sizeof(float));
    return t;
  }
  Tensor random(std::initializer_list<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return floats(shape, random_floats(rng_, size_t(n), -1.5f, 1.5f));
  }
  Tensor ints(const std::vector<int32_t>& v) {
    buffers_.push_back(gpu_->allocate(v.size() * 4));
    Tensor t = buffers_.back()->view(GgmlType::I32, {int64_t(v.size())});
    gpu_->upload(v.data(), t, v.size() * 4);
    return t;
  }
  // A cache of n_slots rows of `width` (f32 or f16), every element NaN.
  Tensor nan_cache(GgmlType type, int64_t width, int64_t n_slots) {
    const size_t elem = type == GgmlType::F16 ? 2 : 4;
    buffers_.push_back(gpu_->allocate(size_t(width * n_slots) * elem));
    Tensor t = buffers_.back()->view(type, {width, n_slots});
    std::vector<uint8_t> bytes(size_t(width * n_slots) * elem);
    for (size_t i = 0; i < bytes.size(); i += elem) {
      const uint32_t nan32 = 0x7fc00000u;
      const uint16_t nan16 = 0x7e00u;
      if (elem == 4) std::memcpy(&bytes[i], &nan32, 4);
      else std::memcpy(&bytes[i], &nan16, 2);
    }
    gpu_->upload(bytes.data(), t, bytes.size());
    return t;
  }
  Tensor poisoned(int64_t n, int64_t T) { return floats({n, T}, std::vector<float>(size_t(n * T), NAN)); }
  Tensor weight(GgmlType type, int64_t K, int64_t N) {
    const int64_t row_bytes = K / traits(type).block_size * traits(type).type_size;
    const std::vector<uint8_t> w = random_rows(rng_, type, N, K, row_bytes);
    buffers_.push_back(gpu_->allocate(w.size()));
    Tensor t = buffers_.back()->view(type, {K, N});
    gpu_->upload(w.data(), t, w.size());
    return t;
  }
  std::vector<float> host(const Tensor& t) {
    std::vector<float> v(size_t(t.elements()));
    gpu_->download(t, v.data(), v.size() * sizeof(float));
    return v;
  }
  // The product with a fresh quantization of x: a recorded no-op first forgets any int8 copy.
  std::vector<float> apart(Tensor& x, const Tensor& w, const Tensor& bias) {
    gpu_->scale(x, 1.0f, x);
    Tensor y = poisoned(w.ne[1], x.ne[1]);
    gpu_->matmul(x, w, bias, y);
    return host(y);
  }

  std::mt19937_64 rng_{20251201};
  std::unique_ptr<CudaBackend> gpu_;
  std::vector<std::unique_ptr<Buffer>> buffers_;
};

}  // namespace kiln::testing
