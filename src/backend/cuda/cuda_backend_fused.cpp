// The CUDA backend's fused products: several weights over one input (q/k/v, gate/up) as one
// grouped-matvec launch in decode. Anything the fused path does not take (prefill, exact
// mode, weight types other than q4_0 / q8_0, mixed types or widths) runs as separate
// matmul() calls, exactly as the composed fallback of backend.h does.
#include <array>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/matvec_grouped.h"

namespace kiln {

namespace cuda_fused {

constexpr int64_t kMaxTokens = 8;  // as cuda_backend_ops.cpp's kMatvecMaxTokens

size_t q8_row_bytes(int64_t cols) { return (cuda::matvec_scratch_bytes(GgmlType::Q4_0, cols) + 255) / 256 * 256; }

void hash_tensor(cuda::SignatureHash& h, const Tensor& x) {
  h.pod(x.dtype), h.pod(x.data), h.bytes(x.ne, sizeof(x.ne)), h.bytes(x.nb, sizeof(x.nb));
}

bool packed_f32(const Tensor& t) {
  return !t.empty() && t.dtype == GgmlType::F32 && t.nb[0] == sizeof(float) && t.device == Device::Cuda &&
         t.ne[2] == 1 && t.ne[3] == 1;
}

bool overlaps(const float* a, int64_t a_floats, const float* b, int64_t b_floats) {
  return a < b + b_floats && b < a + a_floats;
}

}  // namespace cuda_fused

void CudaBackend::matmul_parts(const Tensor& x, std::span<const MatmulPart> parts) {
  using namespace cuda_fused;
  const int64_t K = x.ne[0], T = x.ne[1];
  if (T > kMaxTokens && matmul_parts_prefill(x, parts)) return;
  bool fused = !options_.exact && options_.fused && !parts.empty() && parts.size() <= size_t(cuda::kMaxMatvecParts) &&
               packed_f32(x) && T <= kMaxTokens;
  const GgmlType type = fused ? parts[0].w->dtype : GgmlType::F32;
  fused = fused && (type == GgmlType::Q4_0 || type == GgmlType::Q8_0 || type == GgmlType::Q4_K);
  for (const MatmulPart& p : parts) {
    if (!fused) break;
    KILN_CHECK(p.w && p.out, "cuda matmul_parts: a part lacks its weight or output");
    const Tensor& w = *p.w;
    const Tensor& out = *p.out;
    const Tensor bias = p.bias ? *p.bias : Tensor{};
    fused = w.dtype == type && w.device == Device::Cuda && w.ne[0] == K && w.ne[2] == 1 && w.ne[3] == 1 &&
            w.nb[1] == parts[0].w->nb[1] && packed_f32(out) && out.ne[0] == w.ne[1] && out.ne[1] == T &&
            (bias.empty() || (packed_f32(bias) && bias.elements() == w.ne[1])) &&
            !overlaps(out.as<float>(), (T - 1) * int64_t(out.nb[1] / 4) + out.ne[0], x.as<float>(),
                      (T - 1) * int64_t(x.nb[1] / 4) + K);
  }
  if (!fused) return Backend::matmul_parts(x, parts);

  const size_t per_token = q8_row_bytes(K);
  auto* q8 = static_cast<uint8_t*>(scratch(q8_scratch_, per_token * kMaxTokens));
  std::array<cuda::MatvecPart, cuda::kMaxMatvecParts> mv{};
  std::array<int64_t, cuda::kMaxMatvecParts> y_stride{};
  const size_t n = parts.size();
  for (size_t i = 0; i < n; ++i) {
    mv[i].w = parts[i].w->data;
    mv[i].rows = parts[i].w->ne[1];
    mv[i].add = parts[i].bias && !parts[i].bias->empty() ? parts[i].bias->as<float>() : nullptr;
    mv[i].y = parts[i].out->as<float>();
    y_stride[i] = int64_t(parts[i].out->nb[1] / 4);
  }
  const int64_t w_row = int64_t(parts[0].w->nb[1]), xs = int64_t(x.nb[1] / 4);
  if (!cuda::matvec_parts_fit(type, K, w_row, std::span(mv.data(), n), cuda::q8_vector_in(q8, K)))
    return Backend::matmul_parts(x, parts);

  const float* xp = x.as<float>();
  const QuantizedInput input{xp, K, T, xs, q8};
  const bool reuse = quantized_input_ == input;
  cuda::SignatureHash h;
  h.pod(Op::Matmul), h.pod(n), h.pod(reuse);
  hash_tensor(h, x);
  for (const MatmulPart& p : parts) {
    hash_tensor(h, *p.w), hash_tensor(h, *p.out);
    if (p.bias) hash_tensor(h, *p.bias);
  }
  record(h, T, [=](cudaStream_t s) {
    for (int64_t t = 0; t < T; ++t) {
      const cuda::Q8Vector xq = cuda::q8_vector_in(q8 + size_t(t) * per_token, K);
      if (!reuse)
        if (cuda::Status st = cuda::quantize_q8(xp + t * xs, K, xq, s); !st.ok()) return st;
      std::array<cuda::MatvecPart, cuda::kMaxMatvecParts> row = mv;
      for (size_t i = 0; i < n; ++i) row[i].y += t * y_stride[i];
      if (cuda::Status st = cuda::matvec_q8_parts(type, K, w_row, std::span(row.data(), n), xq, s); !st.ok())
        return st;
    }
    return cuda::Status();
  }, "matmul_parts");
  quantized_input_ = input;  // no output overlaps x (checked above)
}

}  // namespace kiln
