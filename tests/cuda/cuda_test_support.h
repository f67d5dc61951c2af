#pragma once
// Helpers of the CUDA kernel tests: skipping without a GPU, device buffers that are poisoned
// before each run, random weights in any block format, and comparisons that print the first
// mismatches with their index and both values.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cuda/decode_layout.h"
#include "backend/cuda/device.h"
#include "backend/cuda/status.h"
#include "core/half.h"
#include "quant/types.h"

namespace kiln::cuda::testing {

// Skips the test, saying why, where no CUDA device is usable (CI, build machines).
#define KILN_REQUIRE_GPU()                                                                  \
  do {                                                                                      \
    std::string kiln_why_;                                                                  \
    if (::kiln::cuda::list_devices(&kiln_why_).empty())                                     \
      GTEST_SKIP() << "no CUDA device (" << kiln_why_ << "): GPU kernel test not run";      \
  } while (0)

#define KILN_CUDA_OK(call) ASSERT_EQ(cudaSuccess, (call)) << #call << ": " << cudaGetErrorString(cudaGetLastError())
#define KILN_STATUS_OK(expr)                                   \
  do {                                                         \
    const ::kiln::cuda::Status kiln_status_ = (expr);          \
    ASSERT_TRUE(kiln_status_.ok()) << kiln_status_.message();  \
  } while (0)

// A device allocation with 16 bytes of slack (kernels may read aligned 16-byte pieces up to
// the next boundary) that frees itself.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (cudaMalloc(&ptr_, bytes + 16) != cudaSuccess) ptr_ = nullptr;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      if (ptr_) cudaFree(ptr_);
      ptr_ = o.ptr_, bytes_ = o.bytes_;
      o.ptr_ = nullptr;
    }
    return *this;
  }
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  template <typename T = void>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }
  bool ok() const { return ptr_ != nullptr; }
  void upload(const void* host, size_t n) const { ASSERT_EQ(cudaSuccess, cudaMemcpy(ptr_, host, n, cudaMemcpyHostToDevice)); }
  // Fills every byte with 0xFF: NaN as f32 / f16 / bf16, -1 as an integer.
  void poison() const { ASSERT_EQ(cudaSuccess, cudaMemset(ptr_, 0xFF, bytes_ + 16)); }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

template <typename T>
DeviceBuffer to_device(const std::vector<T>& host) {
  DeviceBuffer b(host.size() * sizeof(T));
  if (b.ok() && !host.empty()) cudaMemcpy(b.as(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  return b;
}

template <typename T>
std::vector<T> to_host(const DeviceBuffer& b, size_t count) {
  std::vector<T> host(count);
  if (cudaDeviceSynchronize() != cudaSuccess) ADD_FAILURE() << "kernel failed: " << cudaGetErrorString(cudaGetLastError());
  if (cudaMemcpy(host.data(), b.as(), count * sizeof(T), cudaMemcpyDeviceToHost) != cudaSuccess)
    ADD_FAILURE() << "copy back failed";
  return host;
}

// The bytes of one token's row of an activation's int8 copy, as the backend sizes it (the
// values, then 16-byte aligned scales), rounded to 256.
inline int64_t q8_row_bytes(int64_t n) { return ((n + 15) / 16 * 16 + n / 32 * 8 + 255) / 256 * 256; }

inline std::vector<float> random_floats(std::mt19937_64& rng, size_t n, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Random blocks of `type`: every quant byte random, every scale field a finite value of
// moderate size (random bytes there would give infinities and NaNs).
inline std::vector<uint8_t> random_rows(std::mt19937_64& rng, GgmlType type, int64_t rows, int64_t cols,
                                        int64_t row_bytes_stride) {
  const TypeTraits& t = traits(type);
  const int64_t row_bytes = cols / t.block_size * t.type_size;
  std::vector<uint8_t> data(size_t(rows * row_bytes_stride + 16), 0xAB);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.002f, 0.03f), unit(-1.0f, 1.0f), sign(-1.0f, 1.0f);
  auto put_half = [](uint8_t* p, float v) {
    const uint16_t h = f32_to_f16(v);
    std::memcpy(p, &h, 2);
  };
  std::vector<int> half_fields;
  switch (type) {
    case GgmlType::Q4_0: case GgmlType::Q5_0: case GgmlType::Q8_0: case GgmlType::IQ4_NL: case GgmlType::IQ4_XS:
      half_fields = {0}; break;
    case GgmlType::Q4_1: case GgmlType::Q5_1: case GgmlType::Q4_K: case GgmlType::Q5_K: half_fields = {0, 2}; break;
    case GgmlType::Q2_K: half_fields = {80, 82}; break;
    case GgmlType::Q3_K: half_fields = {108}; break;
    case GgmlType::Q6_K: half_fields = {208}; break;
    default: break;
  }
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = data.data() + r * row_bytes_stride;
    if (type == GgmlType::F32 || type == GgmlType::F16 || type == GgmlType::BF16) {
      for (int64_t i = 0; i < cols; ++i) {
        const float v = unit(rng);
        if (type == GgmlType::F32) std::memcpy(row + 4 * i, &v, 4);
        const uint16_t h = type == GgmlType::F16 ? f32_to_f16(v) : f32_to_bf16(v);
        if (type != GgmlType::F32) std::memcpy(row + 2 * i, &h, 2);
      }
      continue;
    }
    for (int64_t i = 0; i < row_bytes; ++i) row[i] = uint8_t(byte(rng));
    for (int64_t b = 0; b < cols / t.block_size; ++b) {
      uint8_t* block = row + b * t.type_size;
      for (int off : half_fields) put_half(block + off, scale(rng) * (sign(rng) < 0 ? -1.0f : 1.0f));
      if (type == GgmlType::MXFP4) block[0] = uint8_t(118 + byte(rng) % 16);  // 2^-10 .. 2^5
    }
  }
  return data;
}

// rows x cols weights of `type` (host, block layout, packed rows) on the device, permuted into the
// interleaved layout and registered (decode_layout.h; unregister_interleaved when done).
inline DeviceBuffer to_device_interleaved(GgmlType type, const std::vector<uint8_t>& host, int64_t rows, int64_t cols) {
  DeviceBuffer w = to_device(host);
  const Status s = interleave_in_place(type, w.as(), rows, cols, nullptr);
  EXPECT_TRUE(s.ok()) << s.message();
  register_interleaved(w.as(), size_t(rows * (cols / traits(type).block_size) * traits(type).type_size));
  return w;
}

// The CPU mirror of quantize_q8_kernel: the same f32 operations, so the same bytes.
struct HostQ8 {
  std::vector<int8_t> qs;
  std::vector<float> d, s;
};
inline HostQ8 quantize_q8_host(const std::vector<float>& x) {
  HostQ8 q;
  q.qs.resize(x.size());
  for (size_t b = 0; b < x.size() / 32; ++b) {
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[32 * b + i]));
    const float d = amax / 127.0f;
    const float id = d == 0.0f ? 0.0f : 1.0f / d;
    int sum = 0;
    for (int i = 0; i < 32; ++i) {
      const int v = int(std::round(x[32 * b + i] * id));
      q.qs[32 * b + i] = int8_t(v);
      sum += v;
    }
    q.d.push_back(d);
    q.s.push_back(d * float(sum));
  }
  return q;
}

// The int8 copy a kernel left of n f32 values (the row at `row`: n int8 values, then from the
// next 16-byte boundary one (d, d * sum) pair per block of 32, matvec.h's Q8Vector) must be
// quantize_q8_host's bytes of `values`.
inline void expect_q8_copy_of(const float* values, int64_t n, const uint8_t* row, const std::string& what) {
  const HostQ8 want = quantize_q8_host(std::vector<float>(values, values + n));
  const int8_t* qs = reinterpret_cast<const int8_t*>(row);
  const float* ds = reinterpret_cast<const float*>(row + (n + 15) / 16 * 16);
  int bad = 0;
  for (int64_t i = 0; i < n; ++i)
    if (qs[i] != want.qs[size_t(i)] && bad++ < 4)
      ADD_FAILURE() << what << ": int8 value " << i << " is " << int(qs[i]) << ", want " << int(want.qs[size_t(i)]);
  for (int64_t b = 0; b < n / 32; ++b)
    if ((ds[2 * b] != want.d[size_t(b)] || ds[2 * b + 1] != want.s[size_t(b)]) && bad++ < 4)
      ADD_FAILURE() << what << ": block " << b << " scales (" << ds[2 * b] << ", " << ds[2 * b + 1] << "), want ("
                    << want.d[size_t(b)] << ", " << want.s[size_t(b)] << ")";
  EXPECT_EQ(bad, 0) << what << ": int8 copy differs in " << bad << " places";
}

// got[i] within tol[i] of ref[i] for every i; NaN (an unwritten, poisoned element) never
// passes. On failure: how many, and the first mismatches with index and both values.
// rmsnorm of T rows of K in double: x / sqrt(mean(x^2) + eps) * w.
inline std::vector<double> double_rmsnorm(const std::vector<float>& x, const std::vector<float>& w, int64_t K,
                                          int64_t T, double eps) {
  std::vector<double> out(size_t(K * T));
  for (int64_t t = 0; t < T; ++t) {
    double sum_sq = 0;
    for (int64_t i = 0; i < K; ++i) sum_sq += double(x[size_t(t * K + i)]) * x[size_t(t * K + i)];
    const double inv = 1.0 / std::sqrt(sum_sq / double(K) + eps);
    for (int64_t i = 0; i < K; ++i) out[size_t(t * K + i)] = x[size_t(t * K + i)] * inv * w[size_t(i)];
  }
  return out;
}

inline ::testing::AssertionResult all_close(const std::vector<float>& got, const std::vector<double>& ref,
                                            const std::vector<double>& tol, const std::string& what) {
  if (got.size() != ref.size()) return ::testing::AssertionFailure() << what << ": size " << got.size() << " vs " << ref.size();
  size_t bad = 0;
  double worst = 0;
  std::ostringstream first;
  for (size_t i = 0; i < got.size(); ++i) {
    const double diff = std::fabs(double(got[i]) - ref[i]);
    if (!(diff <= tol[i])) {  // catches NaN
      if (bad < 8)
        first << "\n  [" << i << "] got " << got[i] << " want " << ref[i] << " (|diff| " << diff << " > tol "
              << tol[i] << (std::isnan(got[i]) ? ", NaN: not written?" : "") << ")";
      ++bad;
    }
    if (tol[i] > 0 && diff / tol[i] > worst) worst = diff / tol[i];
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << bad << " of " << got.size()
                                       << " elements outside tolerance (worst " << worst << " x tol):" << first.str();
}

inline ::testing::AssertionResult all_close(const std::vector<float>& got, const std::vector<double>& ref, double rel,
                                            double abs, const std::string& what) {
  std::vector<double> tol(ref.size());
  for (size_t i = 0; i < ref.size(); ++i) tol[i] = rel * std::fabs(ref[i]) + abs;
  return all_close(got, ref, tol, what);
}

// Bit-for-bit equality of two float arrays (NaN equal to NaN).
inline ::testing::AssertionResult all_equal_bits(const std::vector<float>& got, const std::vector<float>& ref,
                                                 const std::string& what) {
  if (got.size() != ref.size()) return ::testing::AssertionFailure() << what << ": size " << got.size() << " vs " << ref.size();
  size_t bad = 0;
  std::ostringstream first;
  for (size_t i = 0; i < got.size(); ++i) {
    uint32_t a, b;
    std::memcpy(&a, &got[i], 4);
    std::memcpy(&b, &ref[i], 4);
    if (a != b && !(std::isnan(got[i]) && std::isnan(ref[i]))) {
      if (bad < 8) first << "\n  [" << i << "] got " << got[i] << " want " << ref[i];
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << bad << " of " << got.size() << " elements differ:" << first.str();
}

}  // namespace kiln::cuda::testing
