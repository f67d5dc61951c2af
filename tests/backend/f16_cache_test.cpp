// The CPU backend's f16 KV cache:
//   - the f16 row kernels (narrowing, widening, dot) at every SIMD level the processor has,
//     against core/half.h's scalar conversions (bit equality) and a double dot product;
//   - kv_store into an f16 cache stores exactly f32_to_f16 of every element;
//   - attention over the f16 cache against a double-precision reference computed from the
//     f16-rounded inputs (K, V and Q: the op rounds the query to f16 for the q.k products),
//     on random shapes: grouped-query heads, sliding window, sinks, soft-cap, several
//     sequences over shuffled blocks. What remains is f32 rounding of the sums and exp:
//     |out - ref| <= 2e-5 * sum_j p_j |v_j| + 1e-6 per element (p_j the reference weights).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/f16_rows.h"
#include "core/half.h"
#include "dense_attention_reference.h"

namespace kiln {
namespace {

float round_f16(float x) { return f16_to_f32(f32_to_f16(x)); }

std::vector<float> random_vector(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

TEST(F16Rows, KernelsMatchTheScalarConversionsAtEveryLevel) {
  std::mt19937 rng(5);
  // Awkward lengths (tails of every size) and values across the f16 range: subnormals,
  // rounding ties, the largest finite half, overflow to infinity, NaN.
  std::vector<float> x = random_vector(1000, rng, 3.0f);
  const float specials[] = {0.0f, -0.0f, 1e-7f, -3e-6f, 6.1e-5f, 1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 65504.0f,
                            65519.0f, 65520.0f, -1e6f, std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN()};
  std::copy(std::begin(specials), std::end(specials), x.begin() + 100);
  for (const cpu::F16RowKernels& k : cpu::f16_row_kernels_here()) {
    const std::string_view level = k.level;
    for (int64_t n : {1, 7, 8, 15, 16, 17, 31, 33, 64, 130, 1000}) {
      const int64_t off = n < 1000 ? 95 : 0;  // the specials lie in 100..112
      std::vector<uint16_t> h(static_cast<size_t>(n));
      k.narrow(x.data() + off, h.data(), n);
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(h[size_t(i)], f32_to_f16(x[size_t(off + i)]))
            << "level " << level << " n " << n << " narrow [" << i << "] of " << x[size_t(off + i)];
      std::vector<float> back(static_cast<size_t>(n));
      k.widen(h.data(), back.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        const float want = f16_to_f32(h[size_t(i)]);
        ASSERT_TRUE(back[size_t(i)] == want || (std::isnan(want) && std::isnan(back[size_t(i)])))
            << "level " << level << " n " << n << " widen [" << i << "]: " << back[size_t(i)] << " vs " << want;
      }
      // The dot product of finite rows: within f32 summation error of the double sum.
      std::vector<float> a = random_vector(size_t(n), rng), b = random_vector(size_t(n), rng);
      k.narrow(a.data(), h.data(), n);
      double want = 0, mag = 0;
      for (int64_t i = 0; i < n; ++i) {
        want += double(f16_to_f32(h[size_t(i)])) * b[size_t(i)];
        mag += std::abs(double(f16_to_f32(h[size_t(i)])) * b[size_t(i)]);
      }
      const float got = k.dot(h.data(), b.data(), n);
      EXPECT_NEAR(got, want, 1e-6 * mag + 1e-7) << "level " << level << " dot of " << n;
    }
  }
}

struct RandomShape {
  int n_kv, group, dk, dv, block, window;
  float softcap;
  bool sinks;
  std::vector<int> lengths;  // tokens of each sequence
};

RandomShape random_shape(std::mt19937& rng) {
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  RandomShape s;
  s.n_kv = pick(1, 3);
  s.group = std::vector<int>{1, 2, 3, 4}[size_t(pick(0, 3))];
  s.dk = pick(1, 140);
  s.dv = pick(0, 1) ? s.dk : pick(1, 90);
  s.block = std::vector<int>{1, 3, 4, 16}[size_t(pick(0, 3))];
  s.window = pick(0, 2) == 0 ? pick(1, 20) : 0;
  s.softcap = pick(0, 2) == 0 ? 2.0f + float(pick(0, 40)) : 0.0f;
  s.sinks = pick(0, 1) == 1;
  for (int i = 0, n = pick(1, 3); i < n; ++i) s.lengths.push_back(pick(1, 90));
  return s;
}

// All tokens of all sequences in one batch (interleaved), stored into the f16 cache and
// attended to; the op against the definition in double over the rounded inputs.
TEST(F16Cache, AttentionMatchesTheDefinitionOverRoundedInputs) {
  CpuBackend be(2);
  std::mt19937 rng(20261130);
  for (int trial = 0; trial < 24; ++trial) {
    const RandomShape c = random_shape(rng);
    const int n_head = c.n_kv * c.group, n_seq = int(c.lengths.size());
    SCOPED_TRACE(::testing::Message() << "trial " << trial << ": heads " << n_head << "/" << c.n_kv << " dk " << c.dk
                                      << " dv " << c.dv << " block " << c.block << " window " << c.window
                                      << " softcap " << c.softcap << " sinks " << c.sinks << " sequences " << n_seq);
    const int longest = *std::max_element(c.lengths.begin(), c.lengths.end());
    const int max_blocks = (longest + c.block - 1) / c.block;
    std::vector<int32_t> tables(size_t(n_seq * max_blocks));
    std::iota(tables.begin(), tables.end(), 0);
    std::shuffle(tables.begin(), tables.end(), rng);
    std::vector<int32_t> pos, seq, slots;
    for (int p = 0; p < longest; ++p)
      for (int s = 0; s < n_seq; ++s)
        if (p < c.lengths[size_t(s)]) {
          pos.push_back(p), seq.push_back(s);
          slots.push_back(tables[size_t(s * max_blocks + p / c.block)] * c.block + p % c.block);
        }
    const int64_t T = int64_t(pos.size()), n_slots = int64_t(n_seq) * max_blocks * c.block;
    const int64_t kw = int64_t(c.n_kv) * c.dk, vw = int64_t(c.n_kv) * c.dv;
    const float scale = 1.0f / std::sqrt(float(c.dk));
    std::vector<float> q = random_vector(size_t(T * n_head * c.dk), rng, 1.5f), k = random_vector(size_t(T * kw), rng),
                       v = random_vector(size_t(T * vw), rng), sinks = random_vector(size_t(n_head), rng, 2.0f);
    std::vector<uint16_t> kc(size_t(kw * n_slots)), vc(size_t(vw * n_slots));
    std::vector<float> out(size_t(T * n_head * c.dv));
    auto f32 = [](auto& data, std::initializer_list<int64_t> shape) {
      return Tensor::contiguous(GgmlType::F32, shape, data.data());
    };
    auto i32 = [](auto& data, std::initializer_list<int64_t> shape) {
      return Tensor::contiguous(GgmlType::I32, shape, data.data());
    };
    KvLayer cache{Tensor::contiguous(GgmlType::F16, {kw, n_slots}, kc.data()),
                  Tensor::contiguous(GgmlType::F16, {vw, n_slots}, vc.data()), c.block};
    BatchIndex index{i32(pos, {T}), i32(seq, {T}), i32(slots, {T}), i32(tables, {max_blocks, n_seq}), longest - 1};
    be.kv_store(f32(k, {kw, T}), f32(v, {vw, T}), cache, index.slots);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t i = 0; i < kw; ++i)
        ASSERT_EQ(kc[size_t(slots[size_t(t)] * kw + i)], f32_to_f16(k[size_t(t * kw + i)])) << "k token " << t;
      for (int64_t i = 0; i < vw; ++i)
        ASSERT_EQ(vc[size_t(slots[size_t(t)] * vw + i)], f32_to_f16(v[size_t(t * vw + i)])) << "v token " << t;
    }
    Tensor tsinks = f32(sinks, {n_head});
    AttentionParams p{n_head, c.n_kv, c.dk, c.dv, scale, c.softcap, c.window, c.sinks ? &tsinks : nullptr};
    Tensor tout = f32(out, {n_head * c.dv, T});
    be.attention(f32(q, {n_head * c.dk, T}), cache, index, p, tout);

    const testing::DenseAttentionShape shape{n_head, c.n_kv, c.dk, c.dv, scale, c.softcap, c.window};
    const testing::DenseAttention ref =
        testing::dense_attention(q, k, v, pos, seq, shape, c.sinks ? sinks.data() : nullptr, round_f16);
    size_t bad = 0;
    for (int64_t t = 0; t < T; ++t)
      for (int h = 0; h < n_head; ++h)
        for (int d = 0; d < c.dv; ++d) {
          const size_t i = size_t((t * n_head + h) * c.dv + d);
          const double want = ref.out[i], tol = 2e-5 * ref.magnitude[i] + 1e-6;
          const float got = out[i];
          if (!(std::abs(got - want) <= tol) && bad++ < 5)
            ADD_FAILURE() << "token " << t << " head " << h << " dim " << d << ": got " << got << ", expected " << want
                          << " (tolerance " << tol << ")";
        }
  }
}

// kv_store and attention refuse a cache whose k and v types differ, or a type other than
// f32 / f16, naming the op.
TEST(F16Cache, MixedOrUnsupportedCacheTypesAreRefused) {
  CpuBackend be(1);
  std::vector<float> k(8), v(8), kc32(32);
  std::vector<uint16_t> kc16(32), vc16(32);
  std::vector<int32_t> slot = {0};
  auto f32 = [](std::vector<float>& d, std::initializer_list<int64_t> s) {
    return Tensor::contiguous(GgmlType::F32, s, d.data());
  };
  KvLayer mixed{f32(kc32, {8, 4}), Tensor::contiguous(GgmlType::F16, {8, 4}, vc16.data()), 4};
  KvLayer bf16{Tensor::contiguous(GgmlType::BF16, {8, 4}, kc16.data()),
               Tensor::contiguous(GgmlType::BF16, {8, 4}, vc16.data()), 4};
  const Tensor slots = Tensor::contiguous(GgmlType::I32, {1}, slot.data());
  for (KvLayer* cache : {&mixed, &bf16}) {
    try {
      be.kv_store(f32(k, {8, 1}), f32(v, {8, 1}), *cache, slots);
      ADD_FAILURE() << "no exception";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("kv_store"), std::string::npos) << e.what();
    }
  }
  EXPECT_FALSE(be.supports(Op::Attention, std::vector<GgmlType>{GgmlType::F16}).has_value());
  EXPECT_TRUE(be.supports(Op::Attention, std::vector<GgmlType>{GgmlType::BF16}).has_value());
}

}  // namespace
}  // namespace kiln
