#pragma once
// One random routed-MoE problem for the CUDA MoE tests (moe_test.cpp, moe_down_walk_test.cpp):
// expert weights of any type in their GGUF layout and dequantized, activations, routing, and
// a double-precision reference output with two error scales (see the bounds at the top of
// moe_test.cpp): `scale` S for the exact paths, `fast_tol` for the int8 / bf16 fast paths.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/moe.h"
#include "cuda_test_support.h"
#include "moe_glu_reference.h"
#include "quant/quant.h"

namespace kiln::cuda::testing {

struct MoeCase {
  GgmlType gate_up, down;
  int64_t n_embd, n_ff, n_expert, n_used;
  bool gpt_oss;  // biases and the clamped SwiGLU
};

inline std::string describe(const MoeCase& c, int64_t T) {
  return std::string(type_name(c.gate_up)) + "/" + std::string(type_name(c.down)) + " embd " +
         std::to_string(c.n_embd) + " ff " + std::to_string(c.n_ff) + " experts " + std::to_string(c.n_expert) +
         " used " + std::to_string(c.n_used) + (c.gpt_oss ? " swiglu_oai+bias" : " silu") + " T " + std::to_string(T);
}

// Host data of one problem: weight bytes as stored, their dequantized values, activations,
// routing, and the reference output with its error scale.
struct Problem {
  MoeCase c;
  int64_t T = 0;
  std::vector<uint8_t> gate, up, down;      // stacked, GGUF layout
  std::vector<float> gate_f, up_f, down_f;  // dequantized [expert][row][col]
  std::vector<float> gate_b, up_b, down_b;  // [expert][rows] or empty
  std::vector<float> x, w;                  // [T][n_embd], [T][n_used]
  std::vector<int32_t> ids;                 // [T][n_used]
  std::vector<double> ref, scale, fast_tol; // [T][n_embd]
};

inline std::vector<uint8_t> weight_bytes(std::mt19937_64& rng, GgmlType type, int64_t rows, int64_t cols) {
  const TypeTraits& t = traits(type);
  const int64_t row_bytes = cols / t.block_size * t.type_size;
  std::vector<uint8_t> b = random_rows(rng, type, rows, cols, row_bytes);
  b.resize(size_t(rows * row_bytes));
  if (type == GgmlType::MXFP4)  // scales 2^-10 .. 2^-4 (as trained weights), not the helper's 2^-10 .. 2^5
    for (int64_t i = 0; i < rows * row_bytes; i += t.type_size) b[size_t(i)] = uint8_t(117 + rng() % 7);
  return b;
}

inline std::vector<float> dequantized(GgmlType type, const std::vector<uint8_t>& bytes, int64_t rows, int64_t cols) {
  const TypeTraits& t = traits(type);
  const int64_t row_bytes = cols / t.block_size * t.type_size;
  std::vector<float> f(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r) dequantize_row_reference(type, bytes.data() + r * row_bytes, f.data() + r * cols, cols);
  return f;
}

// Half a step of int8 block quantization, per element of a row of n, for blocks of up to
// 256 (the GPU quantizes blocks of 32; the CPU backend's q8_K takes 256: the larger bound).
inline std::vector<double> int8_step(const double* v, int64_t n) {
  constexpr int64_t kBlock = 256;
  std::vector<double> q(static_cast<size_t>(n), 0.0);
  for (int64_t b = 0; b < n; b += kBlock) {
    double m = 0;
    for (int64_t i = b; i < std::min(n, b + kBlock); ++i) m = std::max(m, std::fabs(v[i]));
    for (int64_t i = b; i < std::min(n, b + kBlock); ++i) q[size_t(i)] = m / 254.0;
  }
  return q;
}

inline Problem make_problem(std::mt19937_64& rng, const MoeCase& c, int64_t T) {
  Problem p;
  p.c = c, p.T = T;
  const int64_t E = c.n_expert, D = c.n_embd, F = c.n_ff, K = c.n_used;
  p.gate = weight_bytes(rng, c.gate_up, E * F, D);
  p.up = weight_bytes(rng, c.gate_up, E * F, D);
  p.down = weight_bytes(rng, c.down, E * D, F);
  p.gate_f = dequantized(c.gate_up, p.gate, E * F, D);
  p.up_f = dequantized(c.gate_up, p.up, E * F, D);
  p.down_f = dequantized(c.down, p.down, E * D, F);
  if (c.gpt_oss) {
    p.gate_b = random_floats(rng, size_t(E * F), -0.5f, 0.5f);
    p.up_b = random_floats(rng, size_t(E * F), -0.5f, 0.5f);
    p.down_b = random_floats(rng, size_t(E * D), -0.5f, 0.5f);
  }
  p.x = random_floats(rng, size_t(T * D), -1.0f, 1.0f);
  p.w = random_floats(rng, size_t(T * K), 0.05f, 1.0f);
  std::vector<int32_t> order(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {  // k distinct experts per token, in random order
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    for (int64_t j = 0; j < K; ++j) p.ids.push_back(order[size_t(j)]);
  }
  p.ref.assign(size_t(T * D), 0.0), p.scale.assign(size_t(T * D), 0.0), p.fast_tol.assign(size_t(T * D), 0.0);
  const double r8 = std::ldexp(1.0, -8), r9 = std::ldexp(1.0, -9);
  std::vector<double> h(static_cast<size_t>(F)), dh(static_cast<size_t>(F));
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> xt(p.x.begin() + t * D, p.x.begin() + (t + 1) * D);
    const std::vector<double> xq = int8_step(xt.data(), D);
    for (int64_t j = 0; j < K; ++j) {
      const int64_t e = p.ids[size_t(t * K + j)];
      const double wt = p.w[size_t(t * K + j)];
      for (int64_t f = 0; f < F; ++f) {
        double g = 0, u = 0, dg = 0, du = 0;
        const float* gr = &p.gate_f[size_t((e * F + f) * D)];
        const float* ur = &p.up_f[size_t((e * F + f) * D)];
        for (int64_t d = 0; d < D; ++d) {
          g += double(gr[d]) * xt[size_t(d)], u += double(ur[d]) * xt[size_t(d)];
          dg += std::fabs(double(gr[d])) * (r8 * std::fabs(xt[size_t(d)]) + xq[size_t(d)]);
          du += std::fabs(double(ur[d])) * (r8 * std::fabs(xt[size_t(d)]) + xq[size_t(d)]);
        }
        if (c.gpt_oss) g += p.gate_b[size_t(e * F + f)], u += p.up_b[size_t(e * F + f)];
        h[size_t(f)] = moe_glu_reference(c.gpt_oss, g, u);
        const auto [sg, su] = moe_glu_slopes(c.gpt_oss, g, u);
        dh[size_t(f)] = sg * dg + su * du;
      }
      const std::vector<double> hq = int8_step(h.data(), F);
      for (int64_t f = 0; f < F; ++f) dh[size_t(f)] += r9 * std::fabs(h[size_t(f)]) + hq[size_t(f)];
      for (int64_t d = 0; d < D; ++d) {
        const float* dr = &p.down_f[size_t((e * D + d) * F)];
        double y = 0, s = 0, err = 0;
        for (int64_t f = 0; f < F; ++f) {
          y += double(dr[f]) * h[size_t(f)], s += std::fabs(double(dr[f]) * h[size_t(f)]);
          err += std::fabs(double(dr[f])) * dh[size_t(f)];
        }
        if (c.gpt_oss) y += p.down_b[size_t(e * D + d)], s += std::fabs(p.down_b[size_t(e * D + d)]);
        const size_t o = size_t(t * D + d);
        p.ref[o] += wt * y;
        p.scale[o] += wt * s;
        p.fast_tol[o] += 2.0 * wt * (err + r9 * s);
      }
    }
  }
  return p;
}

// A problem's tensors on the device (experts as the problem holds them, GGUF blocks) and the
// arguments of moe_ffn_matvec / moe_ffn_gemm for them; the output, residual, scratch and ticket
// buffers for a test to fill (the tickets zeroed).
struct ProblemOnDevice {
  DeviceBuffer gate, up, down, gate_b, up_b, down_b, x, w, ids, out, residual, scratch, tickets;
  MoeFfnArgs a;

  explicit ProblemOnDevice(const Problem& p)
      : gate(to_device(p.gate)), up(to_device(p.up)), down(to_device(p.down)), gate_b(to_device(p.gate_b)),
        up_b(to_device(p.up_b)), down_b(to_device(p.down_b)), x(to_device(p.x)), w(to_device(p.w)),
        ids(to_device(p.ids)), out(size_t(p.T * p.c.n_embd) * sizeof(float)) {
    const MoeCase& c = p.c;
    auto matrix = [&](ExpertMatrix& m, GgmlType type, const DeviceBuffer& data, int64_t rows, int64_t cols,
                      const DeviceBuffer& bias) {
      m.type = type, m.data = data.as();
      m.row_bytes = cols / traits(type).block_size * traits(type).type_size, m.expert_bytes = m.row_bytes * rows;
      m.bias = c.gpt_oss ? bias.as<float>() : nullptr, m.bias_stride = rows;
    };
    matrix(a.gate, c.gate_up, gate, c.n_ff, c.n_embd, gate_b);
    matrix(a.up, c.gate_up, up, c.n_ff, c.n_embd, up_b);
    matrix(a.down, c.down, down, c.n_embd, c.n_ff, down_b);
    a.n_embd = c.n_embd, a.n_ff = c.n_ff, a.n_expert = c.n_expert, a.n_used = c.n_used, a.n_tokens = p.T;
    a.x = x.as<float>(), a.x_stride = c.n_embd;
    a.ids = ids.as<int32_t>(), a.ids_stride = c.n_used;
    a.weights = w.as<float>(), a.weights_stride = c.n_used;
    a.out = out.as<float>(), a.out_stride = c.n_embd;
    a.act = c.gpt_oss ? GluKind::SwigluOai : GluKind::Silu;
    tickets = DeviceBuffer(size_t(moe_h_ticket_count(a)) * sizeof(unsigned));
    EXPECT_EQ(cudaMemset(tickets.as(), 0, tickets.bytes()), cudaSuccess);
  }
};

// A fast path's output against the problem's reference: its bound (moe_test.cpp's top: int8 /
// bf16 rounding carried to the output) + 1e-4 S + 1e-5.
inline ::testing::AssertionResult near_reference(const std::vector<float>& got, const Problem& p,
                                                 const std::string& what) {
  std::vector<double> tol(p.ref.size());
  for (size_t i = 0; i < tol.size(); ++i) tol[i] = p.fast_tol[i] + 1e-4 * p.scale[i] + 1e-5;
  return all_close(got, p.ref, tol, what);
}

// Two fast paths that compute every term alike and differ only in the order of their f32
// sums: within 1e-5 S + 1e-6 (S = sum_j w_j (sum_k |down[i][k] h_k| + |bias_i|); sums of at
// most a few hundred terms reordered move by ~(terms per lane + 5) 2^-24 S).
inline ::testing::AssertionResult same_but_order(const std::vector<float>& got, const std::vector<float>& other,
                                                 const Problem& p, const std::string& what) {
  const std::vector<double> want(other.begin(), other.end());
  std::vector<double> tol(p.scale.size());
  for (size_t i = 0; i < tol.size(); ++i) tol[i] = 1e-5 * p.scale[i] + 1e-6;
  return all_close(got, want, tol, what);
}

}  // namespace kiln::cuda::testing
