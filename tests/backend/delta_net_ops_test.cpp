// GatedDeltaNet ops of the CPU backend against naive double-precision references written
// straight from the equations (backend/backend.h), and the chunked form of the delta rule
// against the recurrent one at awkward lengths.
//
// Tolerances: the ops compute in double from f32 inputs and round once to f32, so they
// match the references to a few f32 ulps; the bound is 1e-5 relative to each tensor's
// largest magnitude (stated per test).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"

namespace kiln::testing {
namespace {

Tensor view(std::vector<float>& v, std::initializer_list<int64_t> shape) {
  return Tensor::contiguous(GgmlType::F32, shape, v.data());
}
Tensor view_i32(std::vector<int32_t>& v) {
  return Tensor::contiguous(GgmlType::I32, {int64_t(v.size())}, v.data());
}

std::vector<float> random_vector(size_t n, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Every element within `rel` of the largest reference magnitude; prints the first misses.
void expect_close(const std::vector<float>& got, const std::vector<double>& want, double rel, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 1e-30;
  for (double w : want) scale = std::max(scale, std::abs(w));
  int misses = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::abs(double(got[i]) - want[i]) <= rel * scale) continue;
    if (++misses <= 5) ADD_FAILURE() << what << " [" << i << "]: got " << got[i] << ", want " << want[i];
  }
  EXPECT_EQ(misses, 0) << what << ": " << misses << " of " << got.size() << " elements off by more than " << rel
                       << " x " << scale;
}

std::vector<double> to_double(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

// A batch index for tokens of given sequences and positions.
struct TestBatch {
  std::vector<int32_t> positions, seq_rows;
  BatchIndex index() {
    BatchIndex b;
    b.positions = view_i32(positions);
    b.seq_rows = view_i32(seq_rows);
    return b;
  }
};

TestBatch one_sequence(int32_t seq, int32_t first_position, int64_t n) {
  TestBatch b;
  for (int64_t i = 0; i < n; ++i) b.positions.push_back(first_position + int32_t(i)), b.seq_rows.push_back(seq);
  return b;
}

// ---- causal convolution -------------------------------------------------------------

TEST(CausalConvSilu, MatchesReferenceAcrossCalls) {
  CpuBackend backend(2);
  std::mt19937 rng(7);
  const int64_t C = 37, K = 4, T = 19;
  std::vector<float> x = random_vector(size_t(C * T), rng, -2, 2);
  std::vector<float> w = random_vector(size_t(K * C), rng);
  std::vector<float> state(size_t((K - 1) * C * 2), 123.0f);  // garbage: position 0 must ignore it
  std::vector<float> out(size_t(C * T));

  // Reference: zero-padded causal convolution over the whole sequence, then SiLU.
  std::vector<double> want(size_t(C * T));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c) {
      double acc = 0;
      for (int64_t j = 0; j < K; ++j) {
        const int64_t src = t - (K - 1) + j;
        if (src >= 0) acc += double(w[size_t(c * K + j)]) * x[size_t(src * C + c)];
      }
      want[size_t(t * C + c)] = acc / (1.0 + std::exp(-acc));
    }

  // Run as a prefill of 11 tokens, two decode steps and a chunk of 6, on sequence row 1.
  Tensor weight = view(w, {K, C});
  Tensor st = view(state, {K - 1, C, 2});
  for (auto [begin, count] : {std::pair<int64_t, int64_t>{0, 11}, {11, 1}, {12, 1}, {13, 6}}) {
    TestBatch b = one_sequence(1, int32_t(begin), count);
    Tensor xs = Tensor::contiguous(GgmlType::F32, {C, count}, x.data() + begin * C);
    Tensor os = Tensor::contiguous(GgmlType::F32, {C, count}, out.data() + begin * C);
    backend.causal_conv_silu(xs, weight, st, b.index(), os);
  }
  expect_close(out, want, 1e-6, "conv output");
  // Sequence row 0 was never touched.
  for (int64_t i = 0; i < (K - 1) * C; ++i) ASSERT_EQ(state[size_t(i)], 123.0f) << "state row 0 [" << i << "]";
}

TEST(CausalConvSilu, StridedInputRows) {
  CpuBackend backend(1);
  std::mt19937 rng(8);
  const int64_t C = 5, K = 3, T = 4, stride = 9;
  std::vector<float> wide = random_vector(size_t(stride * T), rng);
  std::vector<float> packed(size_t(C * T));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c) packed[size_t(t * C + c)] = wide[size_t(t * stride + 2 + c)];
  std::vector<float> w = random_vector(size_t(K * C), rng);
  std::vector<float> s1(size_t((K - 1) * C)), s2(size_t((K - 1) * C)), o1(size_t(C * T)), o2(size_t(C * T));
  TestBatch b = one_sequence(0, 0, T);
  Tensor strided = Tensor::contiguous(GgmlType::F32, {stride, T}, wide.data());
  strided.ne[0] = C;
  strided.data = wide.data() + 2;
  Tensor weight = view(w, {K, C}), st1 = view(s1, {K - 1, C, 1}), st2 = view(s2, {K - 1, C, 1});
  Tensor out1 = view(o1, {C, T}), out2 = view(o2, {C, T});
  backend.causal_conv_silu(view(packed, {C, T}), weight, st1, b.index(), out1);
  backend.causal_conv_silu(strided, weight, st2, b.index(), out2);
  expect_close(o2, to_double(o1), 0, "strided vs packed");
}

// ---- gated delta rule -----------------------------------------------------------------

struct DeltaProblem {
  DeltaRuleParams p;
  int64_t T = 0;
  std::vector<float> q, k, v, alpha, beta, ssm_a, dt_bias;

  DeltaProblem(int nk, int nv, int dk, int dv, int64_t tokens, bool tiled, uint32_t seed) : T(tokens) {
    p.n_k_heads = nk, p.n_v_heads = nv, p.head_dim_k = dk, p.head_dim_v = dv, p.tiled_heads = tiled;
    std::mt19937 rng(seed);
    q = random_vector(size_t(nk * dk * T), rng);
    k = random_vector(size_t(nk * dk * T), rng);
    v = random_vector(size_t(nv * dv * T), rng);
    alpha = random_vector(size_t(nv * T), rng, -3, 3);
    beta = random_vector(size_t(nv * T), rng, -3, 3);
    std::vector<float> a_log = random_vector(size_t(nv), rng, -1.5f, 1.5f);
    for (float a : a_log) ssm_a.push_back(-std::exp(a));
    dt_bias = random_vector(size_t(nv), rng, -1, 1);
  }

  // Runs tokens [begin, begin + count) through the op on sequence row `seq`.
  void run(Backend& backend, int64_t begin, int64_t count, std::vector<float>& state, int64_t n_seqs, int seq,
           int chunk_size, std::vector<float>& out) {
    DeltaRuleParams params = p;
    params.chunk_size = chunk_size;
    const int64_t kw = int64_t(p.n_k_heads) * p.head_dim_k, vw = int64_t(p.n_v_heads) * p.head_dim_v;
    auto slice = [&](std::vector<float>& data, int64_t width) {
      return Tensor::contiguous(GgmlType::F32, {width, count}, data.data() + begin * width);
    };
    Tensor tq = slice(q, kw), tk = slice(k, kw), tv = slice(v, vw);
    Tensor ta = Tensor::contiguous(GgmlType::F32, {p.n_v_heads, 1, count}, alpha.data() + begin * p.n_v_heads);
    Tensor tb = Tensor::contiguous(GgmlType::F32, {p.n_v_heads, 1, count}, beta.data() + begin * p.n_v_heads);
    Tensor st = Tensor::contiguous(GgmlType::F32, {p.head_dim_v, p.head_dim_k, p.n_v_heads, n_seqs}, state.data());
    Tensor to = Tensor::contiguous(GgmlType::F32, {vw, count}, out.data() + begin * vw);
    TestBatch b = one_sequence(seq, int32_t(begin), count);
    backend.gated_delta_rule(tq, tk, tv, ta, tb, view(ssm_a, {p.n_v_heads}), view(dt_bias, {p.n_v_heads}), st,
                             b.index(), params, to);
  }

  // The recurrence in double, straight from the equations. Returns outputs; `state_out`
  // receives the final state in the op's layout {dv, dk, nv}.
  std::vector<double> reference(std::vector<double>* state_out = nullptr) const {
    const int nk = p.n_k_heads, nv = p.n_v_heads, dk = p.head_dim_k, dv = p.head_dim_v;
    std::vector<double> out(size_t(nv * dv * T));
    std::vector<double> S(size_t(nv * dk * dv), 0.0);
    for (int64_t t = 0; t < T; ++t)
      for (int h = 0; h < nv; ++h) {
        const int kh = p.tiled_heads ? h % nk : h / (nv / nk);
        std::vector<double> qt(static_cast<size_t>(dk)), kt(static_cast<size_t>(dk));
        double qn = 0, kn = 0;
        for (int i = 0; i < dk; ++i) {
          qt[size_t(i)] = q[size_t(t * nk * dk + kh * dk + i)];
          kt[size_t(i)] = k[size_t(t * nk * dk + kh * dk + i)];
          qn += qt[size_t(i)] * qt[size_t(i)];
          kn += kt[size_t(i)] * kt[size_t(i)];
        }
        for (int i = 0; i < dk; ++i) {
          qt[size_t(i)] /= std::sqrt(qn + 1e-6) * std::sqrt(double(dk));
          kt[size_t(i)] /= std::sqrt(kn + 1e-6);
        }
        const double x = double(alpha[size_t(t * nv + h)]) + dt_bias[size_t(h)];
        const double decay = std::exp(double(ssm_a[size_t(h)]) * std::log1p(std::exp(x)));
        const double b = 1.0 / (1.0 + std::exp(-double(beta[size_t(t * nv + h)])));
        double* Sh = &S[size_t(h * dk * dv)];
        for (int i = 0; i < dk * dv; ++i) Sh[i] *= decay;
        for (int j = 0; j < dv; ++j) {
          double kv = 0;
          for (int i = 0; i < dk; ++i) kv += Sh[i * dv + j] * kt[size_t(i)];
          const double delta = b * (v[size_t(t * nv * dv + h * dv + j)] - kv);
          for (int i = 0; i < dk; ++i) Sh[i * dv + j] += kt[size_t(i)] * delta;
        }
        for (int j = 0; j < dv; ++j) {
          double o = 0;
          for (int i = 0; i < dk; ++i) o += Sh[i * dv + j] * qt[size_t(i)];
          out[size_t(t * nv * dv + h * dv + j)] = o;
        }
      }
    if (state_out) *state_out = S;
    return out;
  }
};

class DeltaRuleLengths : public ::testing::TestWithParam<int64_t> {};

// Chunked (prefill) against recurrent (token by token), and both against the reference.
TEST_P(DeltaRuleLengths, ChunkedMatchesRecurrent) {
  const int64_t T = GetParam();
  CpuBackend backend(2);
  DeltaProblem pr(2, 4, 16, 12, T, /*tiled=*/false, uint32_t(100 + T));
  const size_t state_size = size_t(4 * 16 * 12);
  std::vector<float> s_chunk(state_size, 5.0f), s_rec(state_size, -5.0f);  // garbage: position 0 resets
  std::vector<float> o_chunk(size_t(4 * 12 * T)), o_rec(size_t(4 * 12 * T));
  pr.run(backend, 0, T, s_chunk, 1, 0, 64, o_chunk);
  pr.run(backend, 0, T, s_rec, 1, 0, 0, o_rec);
  expect_close(o_chunk, to_double(o_rec), 1e-5, "chunked vs recurrent output");
  expect_close(s_chunk, to_double(s_rec), 1e-5, "chunked vs recurrent state");

  std::vector<double> ref_state;
  const std::vector<double> ref = pr.reference(&ref_state);
  expect_close(o_chunk, ref, 1e-5, "chunked vs reference output");
  expect_close(s_chunk, ref_state, 1e-5, "chunked vs reference state");
}

INSTANTIATE_TEST_SUITE_P(Awkward, DeltaRuleLengths, ::testing::Values(1, 5, 63, 64, 65, 200));

// Prefill, decode steps and a second prefill chunk continue one state; other sequences'
// rows are untouched; tiled head mapping.
TEST(DeltaRule, StateCarriesAcrossCallsTiledHeads) {
  CpuBackend backend(3);
  const int64_t T = 90;
  DeltaProblem pr(2, 6, 8, 8, T, /*tiled=*/true, 42);
  const size_t per_seq = size_t(6 * 8 * 8);
  std::vector<float> state(per_seq * 3, 0.25f), out(size_t(6 * 8 * T));
  for (auto [begin, count] : {std::pair<int64_t, int64_t>{0, 70}, {70, 1}, {71, 1}, {72, 18}})
    pr.run(backend, begin, count, state, 3, 2, 64, out);
  std::vector<double> ref_state;
  expect_close(out, pr.reference(&ref_state), 1e-5, "output");
  std::vector<float> seq2(state.begin() + long(2 * per_seq), state.end());
  expect_close(seq2, ref_state, 1e-5, "state");
  for (size_t i = 0; i < 2 * per_seq; ++i) ASSERT_EQ(state[i], 0.25f) << "untouched state [" << i << "]";
}

// Two sequences interleaved token by token in one batch (decode of several sequences).
TEST(DeltaRule, InterleavedSequencesInOneBatch) {
  CpuBackend backend(2);
  const int64_t T = 7;
  DeltaProblem a(1, 2, 8, 4, T, false, 1), b(1, 2, 8, 4, T, false, 2);
  // Batch: a0 b0 a1 b1 ... as one tensor set.
  DeltaProblem mixed(1, 2, 8, 4, 2 * T, false, 3);
  auto interleave = [&](std::vector<float>& dst, const std::vector<float>& x, const std::vector<float>& y,
                        int64_t width) {
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < width; ++i) {
        dst[size_t((2 * t) * width + i)] = x[size_t(t * width + i)];
        dst[size_t((2 * t + 1) * width + i)] = y[size_t(t * width + i)];
      }
  };
  interleave(mixed.q, a.q, b.q, 8);
  interleave(mixed.k, a.k, b.k, 8);
  interleave(mixed.v, a.v, b.v, 8);
  interleave(mixed.alpha, a.alpha, b.alpha, 2);
  interleave(mixed.beta, a.beta, b.beta, 2);
  b.ssm_a = a.ssm_a = mixed.ssm_a;
  b.dt_bias = a.dt_bias = mixed.dt_bias;

  std::vector<float> state(size_t(2 * 8 * 4 * 2)), out(size_t(8 * 2 * T));
  TestBatch batch;
  for (int32_t t = 0; t < T; ++t) {
    batch.positions.insert(batch.positions.end(), {t, t});
    batch.seq_rows.insert(batch.seq_rows.end(), {0, 1});
  }
  const int64_t n = 2 * T;
  Tensor st = view(state, {4, 8, 2, 2});
  Tensor ta = Tensor::contiguous(GgmlType::F32, {2, 1, n}, mixed.alpha.data());
  Tensor tb = Tensor::contiguous(GgmlType::F32, {2, 1, n}, mixed.beta.data());
  Tensor to = view(out, {8, n});
  backend.gated_delta_rule(view(mixed.q, {8, n}), view(mixed.k, {8, n}), view(mixed.v, {8, n}), ta, tb,
                           view(mixed.ssm_a, {2}), view(mixed.dt_bias, {2}), st, batch.index(), mixed.p, to);
  const std::vector<double> ra = a.reference(), rb = b.reference();
  std::vector<float> got_a, got_b;
  for (int64_t t = 0; t < T; ++t) {
    got_a.insert(got_a.end(), out.begin() + long(2 * t * 8), out.begin() + long(2 * t * 8 + 8));
    got_b.insert(got_b.end(), out.begin() + long((2 * t + 1) * 8), out.begin() + long((2 * t + 2) * 8));
  }
  expect_close(got_a, ra, 1e-5, "sequence a");
  expect_close(got_b, rb, 1e-5, "sequence b");
}

// ---- gated RMSNorm and sigmoid gate ------------------------------------------------------

TEST(RmsNormGated, MatchesReference) {
  CpuBackend backend(2);
  std::mt19937 rng(3);
  const int64_t n = 33, rows = 7;
  std::vector<float> x = random_vector(size_t(n * rows), rng, -3, 3), z = random_vector(size_t(n * rows), rng, -4, 4);
  std::vector<float> w = random_vector(size_t(n), rng, 0.5f, 1.5f), out(size_t(n * rows));
  std::vector<double> want(out.size());
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += double(x[size_t(r * n + i)]) * x[size_t(r * n + i)];
    const double inv = 1.0 / std::sqrt(ss / double(n) + 1e-6);
    for (int64_t i = 0; i < n; ++i) {
      const double g = z[size_t(r * n + i)];
      want[size_t(r * n + i)] = x[size_t(r * n + i)] * inv * w[size_t(i)] * g / (1.0 + std::exp(-g));
    }
  }
  Tensor to = view(out, {n, rows});
  backend.rmsnorm_gated(view(x, {n, rows}), view(z, {n, rows}), view(w, {n}), 1e-6f, to);
  expect_close(out, want, 1e-6, "rmsnorm_gated");
}

TEST(SigmoidMul, ElementwiseAndPerRow) {
  CpuBackend backend(1);
  std::mt19937 rng(4);
  const int64_t n = 10, rows = 3;
  std::vector<float> x = random_vector(size_t(n * rows), rng, -3, 3), g = random_vector(size_t(n * rows), rng, -5, 5);
  std::vector<float> out(x.size());
  std::vector<double> want(x.size());
  for (size_t i = 0; i < x.size(); ++i) want[i] = x[i] / (1.0 + std::exp(-double(g[i])));
  Tensor to = view(out, {n, rows});
  backend.sigmoid_mul(view(x, {n, rows}), view(g, {n, rows}), to);
  expect_close(out, want, 1e-6, "elementwise");

  std::vector<float> g_row = {0.5f, -1.0f, 2.0f};
  for (size_t i = 0; i < x.size(); ++i) want[i] = x[i] / (1.0 + std::exp(-double(g_row[i / size_t(n)])));
  backend.sigmoid_mul(view(x, {n, rows}), view(g_row, {1, rows}), to);
  expect_close(out, want, 1e-6, "per row");
}

}  // namespace
}  // namespace kiln::testing
