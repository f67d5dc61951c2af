// The CUDA backend's fused decode paths against the same products run apart, bit for bit:
//   - matmul_parts (q/k/v or gate/up as one grouped launch, one per weight type when they
//     differ) vs one matmul per weight;
//   - rmsnorm / add_rmsnorm / glu writing the int8 copy of their output for the next matmul
//     vs that matmul quantizing the output itself;
//   - rmsnorm_matmul_parts (the norm computed inside the products' launch) vs the products
//     of the normalized vector it wrote, and that vector vs a double-precision rmsnorm;
//   - matmul_add (the residual add in the product's epilogue) vs matmul, and residual + out;
//   - rope_kv_store (one kernel) vs rope, rope and kv_store: q, k and both caches.
// Both sides use the same int8 activations and the same per-row arithmetic, so any
// difference is a wrong row, part, offset or scale. Outputs are poisoned (NaN) first.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "core/half.h"
#include "fused_ops_fixture.h"

namespace kiln::testing {
namespace {

TEST_F(FusedOps, MatmulPartsMatchSeparateMatmuls) {
  for (GgmlType type : {GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_K}) {
    for (int64_t K : {512, 4096 + 256}) {
      for (int64_t T : {1, 3}) {
        SCOPED_TRACE(std::string(type_name(type)) + " K " + std::to_string(K) + " T " + std::to_string(T));
        Tensor x = random({K, T});
        const Tensor wq = weight(type, K, 200), wk = weight(type, K, 33), wv = weight(type, K, 64);
        const Tensor bias = random({33});
        Tensor q = poisoned(200, T), k = poisoned(33, T), v = poisoned(64, T);
        const Tensor none;
        gpu_->scale(x, 1.0f, x);
        const Backend::MatmulPart parts[] = {{&wq, &none, &q}, {&wk, &bias, &k}, {&wv, nullptr, &v}};
        gpu_->matmul_parts(x, parts);
        EXPECT_TRUE(all_equal_bits(host(q), apart(x, wq, none), "q"));
        EXPECT_TRUE(all_equal_bits(host(k), apart(x, wk, bias), "k (with bias)"));
        EXPECT_TRUE(all_equal_bits(host(v), apart(x, wv, none), "v"));
      }
    }
  }
}

// Parts of different weight types (Q4_K_M: q4_K q/k with a q6_K v; also a q6_K part first and
// last around another type) run as one launch per type: x quantized inside each launch, x
// left by rmsnorm with its int8 copy (quantized once for all launches); with the norm inside,
// q4_K with q6_K is one two-format launch (the k part's 33 rows: a task of two rows straddles
// the k / v boundary). 2048 and 4096 columns fit the grouped q6_K kernel.
TEST_F(FusedOps, MixedTypePartsMatchSeparateMatmuls) {
  constexpr float kEps = 1e-5f;
  const GgmlType orders[][3] = {{GgmlType::Q4_K, GgmlType::Q4_K, GgmlType::Q6_K},
                                {GgmlType::Q6_K, GgmlType::Q8_0, GgmlType::Q6_K}};
  for (const auto& types : orders) {
    for (int64_t K : {2048, 4096}) {
      for (int64_t T : {1, 3}) {
        for (int mode = 0; mode < 3; ++mode) {
          const bool after_norm = mode == 1, with_norm = mode == 2;
          SCOPED_TRACE(std::string(type_name(types[0])) + "/" + std::string(type_name(types[1])) + "/" +
                       std::string(type_name(types[2])) +
                       " K " + std::to_string(K) + " T " + std::to_string(T) +
                       (after_norm ? " after rmsnorm" : with_norm ? " norm inside" : ""));
          const std::vector<float> x_host = random_floats(rng_, size_t(K * T), -1.5f, 1.5f);
          const std::vector<float> w_host = random_floats(rng_, size_t(K), 0.5f, 1.5f);
          Tensor x = floats({K, T}, x_host);
          const Tensor norm_w = floats({K}, w_host);
          const Tensor wq = weight(types[0], K, 200), wk = weight(types[1], K, 33), wv = weight(types[2], K, 64);
          const Tensor bias = random({33}), none;
          Tensor normed = poisoned(K, T), q = poisoned(wq.ne[1], T), k = poisoned(33, T), v = poisoned(64, T);
          const Backend::MatmulPart parts[] = {{&wq, &none, &q}, {&wk, &bias, &k}, {&wv, nullptr, &v}};
          if (with_norm) {
            gpu_->rmsnorm_matmul_parts(x, norm_w, kEps, normed, parts);
          } else {
            if (after_norm) gpu_->rmsnorm(x, Tensor{}, kEps, x);
            else gpu_->scale(x, 1.0f, x);
            gpu_->matmul_parts(x, parts);
          }
          Tensor& input = with_norm ? normed : x;
          if (with_norm) {
            std::vector<double> want(size_t(K * T));
            for (int64_t t = 0; t < T; ++t) {
              double sum_sq = 0;
              for (int64_t i = 0; i < K; ++i) sum_sq += double(x_host[size_t(t * K + i)]) * x_host[size_t(t * K + i)];
              const double inv = 1.0 / std::sqrt(sum_sq / double(K) + kEps);
              for (int64_t i = 0; i < K; ++i)
                want[size_t(t * K + i)] = x_host[size_t(t * K + i)] * inv * w_host[size_t(i)];
            }
            EXPECT_TRUE(all_close(host(normed), want, 2e-6, 0.0, "normed vs double rmsnorm"));
          }
          EXPECT_TRUE(all_equal_bits(host(q), apart(input, wq, none), "q"));
          EXPECT_TRUE(all_equal_bits(host(k), apart(input, wk, bias), "k (with bias)"));
          EXPECT_TRUE(all_equal_bits(host(v), apart(input, wv, none), "v"));
        }
      }
    }
  }
}

TEST_F(FusedOps, NormAndGluInt8CopyMatchesQuantizingAgain) {
  for (int64_t T : {1, 2}) {
    SCOPED_TRACE("T " + std::to_string(T));
    const int64_t D = 4096, F = 1024 + 128;
    const Tensor norm_w = random({D});
    const Tensor w_in = weight(GgmlType::Q4_0, D, 300), w_down = weight(GgmlType::Q8_0, F, 96);
    const Tensor none;

    Tensor x = random({D, T}), cur = poisoned(D, T), y = poisoned(300, T);
    gpu_->rmsnorm(x, norm_w, 1e-5f, cur);
    gpu_->matmul(cur, w_in, none, y);
    EXPECT_TRUE(all_equal_bits(host(y), apart(cur, w_in, none), "rmsnorm -> matmul"));

    Tensor residual = random({D, T}), y2 = poisoned(300, T);
    gpu_->add_rmsnorm(x, residual, norm_w, 1e-5f, cur);
    gpu_->matmul(cur, w_in, none, y2);
    EXPECT_TRUE(all_equal_bits(host(y2), apart(cur, w_in, none), "add_rmsnorm -> matmul"));

    Tensor gate = random({F, T}), up = random({F, T}), down = poisoned(96, T);
    gpu_->glu(gate, up, GluParams{Activation::Silu}, gate);
    gpu_->matmul(gate, w_down, none, down);
    EXPECT_TRUE(all_equal_bits(host(down), apart(gate, w_down, none), "glu -> matmul"));
  }
}

TEST_F(FusedOps, NormInsideProductsMatchesProductsOfTheNormedVector) {
  constexpr float kEps = 1e-5f;
  for (GgmlType type : {GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_K}) {
    // 8448 columns: wider than the in-kernel norm takes, so the composed ops run.
    for (int64_t K : {512, 4096, 8448}) {
      for (int64_t T : {1, 3}) {
        SCOPED_TRACE(std::string(type_name(type)) + " K " + std::to_string(K) + " T " + std::to_string(T));
        const std::vector<float> x_host = random_floats(rng_, size_t(K * T), -1.5f, 1.5f);
        const std::vector<float> w_host = random_floats(rng_, size_t(K), 0.5f, 1.5f);
        const Tensor x = floats({K, T}, x_host), norm_w = floats({K}, w_host);
        // At K 4096 more row pairs than resident warps: several tasks per warp (as gate/up).
        const Tensor wq = weight(type, K, K == 4096 ? 6600 : 200), wk = weight(type, K, 33), wv = weight(type, K, 64);
        const Tensor bias = random({33}), none;
        Tensor normed = poisoned(K, T), q = poisoned(wq.ne[1], T), k = poisoned(33, T), v = poisoned(64, T);
        const Backend::MatmulPart parts[] = {{&wq, &none, &q}, {&wk, &bias, &k}, {&wv, nullptr, &v}};
        gpu_->rmsnorm_matmul_parts(x, norm_w, kEps, normed, parts);

        const std::vector<double> want = double_rmsnorm(x_host, w_host, K, T, kEps);
        // f32: rsqrt (2 ulp), two rounded products, a sum of K squares in another order.
        EXPECT_TRUE(all_close(host(normed), want, 2e-6, 0.0, "normed vs double rmsnorm"));
        EXPECT_TRUE(all_equal_bits(host(q), apart(normed, wq, none), "q"));
        EXPECT_TRUE(all_equal_bits(host(k), apart(normed, wk, bias), "k (with bias)"));
        EXPECT_TRUE(all_equal_bits(host(v), apart(normed, wv, none), "v"));
      }
    }
  }
}

TEST_F(FusedOps, MatmulAddWritesTheProductAndAddsItToTheResidual) {
  const int64_t K = 4096, N = 300;
  // f16 weights: the 16-bit float grouped kernel, in matmul_add and in matmul alike.
  for (GgmlType type : {GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::F16}) {
    for (int64_t T : {1, 3}) {
      // x fresh (quantized inside the product), or left by rmsnorm with its int8 copy.
      for (bool after_norm : {false, true}) {
        SCOPED_TRACE(std::string(type_name(type)) + " T " + std::to_string(T) + (after_norm ? " after rmsnorm" : ""));
        Tensor x = random({K, T});
        if (after_norm) gpu_->rmsnorm(x, Tensor{}, 1e-5f, x);
        const Tensor w = weight(type, K, N), bias = random({N});
        const std::vector<float> residual_host = random_floats(rng_, size_t(N * T), -3.0f, 3.0f);
        Tensor residual = floats({N, T}, residual_host), out = poisoned(N, T), normed = poisoned(N, T);
        gpu_->matmul_add(x, w, bias, out, residual);
        // A norm of the residual right after (where the add may still be pending and be
        // taken into the norm's kernel): it must see the sum.
        const std::vector<float> norm_w_host = random_floats(rng_, size_t(N), 0.5f, 1.5f);
        const Tensor norm_w = floats({N}, norm_w_host);
        gpu_->rmsnorm(residual, norm_w, 1e-5f, normed);
        const std::vector<float> got_out = host(out), got_residual = host(residual);
        EXPECT_TRUE(all_equal_bits(got_out, apart(x, w, bias), "out"));
        std::vector<float> want_residual(residual_host.size());
        for (size_t i = 0; i < want_residual.size(); ++i) want_residual[i] = residual_host[i] + got_out[i];
        EXPECT_TRUE(all_equal_bits(got_residual, want_residual, "residual"));
        const std::vector<double> want_normed = double_rmsnorm(got_residual, norm_w_host, N, T, 1e-5);
        EXPECT_TRUE(all_close(host(normed), want_normed, 2e-6, 0.0, "rmsnorm of the residual"));
      }
    }
  }
}

struct RopeCase {
  int head_dim, n_rot, n_head, n_kv, tokens;
  RopeStyle style;
  bool yarn;
};

TEST_F(FusedOps, RopeKvStoreMatchesRopeRopeAndKvStore) {
  // Up to 8 tokens: decode's rope_store; 20 and 13: prefill's rope_store_rows (the angles
  // from the pass's table, computed as rope's: the same bits).
  const RopeCase cases[] = {{128, 128, 32, 8, 1, RopeStyle::Normal, false},
                            {64, 32, 6, 2, 3, RopeStyle::Neox, false},
                            {128, 128, 8, 2, 2, RopeStyle::Neox, true},
                            {128, 128, 32, 8, 20, RopeStyle::Normal, false},
                            {64, 32, 6, 2, 13, RopeStyle::Neox, true}};
  const int64_t n_slots = 40;
  for (GgmlType cache_type : {GgmlType::F32, GgmlType::F16}) {
    for (const RopeCase& c : cases) {
      SCOPED_TRACE(std::string(type_name(cache_type)) + " head_dim " + std::to_string(c.head_dim) + " n_rot " +
                   std::to_string(c.n_rot) + " heads " + std::to_string(c.n_head) + "/" + std::to_string(c.n_kv) +
                   " T " + std::to_string(c.tokens) + (c.yarn ? " yarn" : ""));
      const int64_t T = c.tokens, q_width = int64_t(c.n_head) * c.head_dim, kv_width = int64_t(c.n_kv) * c.head_dim;
      RopeParams rope;
      rope.style = c.style;
      rope.n_rot = c.n_rot;
      rope.freq_base = 500000.0f;
      if (c.yarn) rope.freq_scale = 0.25f, rope.yarn.ext_factor = 1.0f, rope.yarn.n_ctx_orig = 4096;
      std::vector<int32_t> positions(static_cast<size_t>(T)), slots(static_cast<size_t>(T));
      for (int64_t t = 0; t < T; ++t)
        positions[size_t(t)] = int32_t(1000 * t + 17), slots[size_t(t)] = int32_t((37 + 7 * t) % n_slots);
      const std::vector<float> q_host = random_floats(rng_, size_t(q_width * T), -2.0f, 2.0f);
      const std::vector<float> k_host = random_floats(rng_, size_t(kv_width * T), -2.0f, 2.0f);
      const std::vector<float> v_host = random_floats(rng_, size_t(kv_width * T), -2.0f, 2.0f);

      // Two copies of every input and cache: one for each path.
      struct Side {
        Tensor q, k, v, pos, slot;
        KvLayer cache;
      } side[2];
      for (Side& d : side) {
        d.q = floats({q_width, T}, q_host);
        d.k = floats({kv_width, T}, k_host);
        d.v = floats({kv_width, T}, v_host);
        for (Tensor* t : {&d.pos, &d.slot}) {
          buffers_.push_back(gpu_->allocate(size_t(T) * 4));
          *t = buffers_.back()->view(GgmlType::I32, {T});
        }
        gpu_->upload(positions.data(), d.pos, size_t(T) * 4);
        gpu_->upload(slots.data(), d.slot, size_t(T) * 4);
        for (Tensor* t : {&d.cache.k, &d.cache.v}) *t = nan_cache(cache_type, kv_width, n_slots);
        d.cache.block_size = 8;
      }
      auto heads = [&](Tensor& rows, int n) { return rows.reshape({c.head_dim, n, T}); };
      Tensor q0 = heads(side[0].q, c.n_head), k0 = heads(side[0].k, c.n_kv);
      gpu_->rope_kv_store(q0, k0, side[0].v, side[0].pos, rope, side[0].cache, side[0].slot);
      Tensor q1 = heads(side[1].q, c.n_head), k1 = heads(side[1].k, c.n_kv);
      gpu_->Backend::rope_kv_store(q1, k1, side[1].v, side[1].pos, rope, side[1].cache, side[1].slot);

      EXPECT_TRUE(all_equal_bits(host(side[0].q), host(side[1].q), "q"));
      EXPECT_TRUE(all_equal_bits(host(side[0].k), host(side[1].k), "k"));
      for (int which = 0; which < 2; ++which) {
        const Tensor& a = which ? side[0].cache.v : side[0].cache.k;
        const Tensor& b = which ? side[1].cache.v : side[1].cache.k;
        std::vector<uint8_t> got(a.bytes()), want(b.bytes());
        gpu_->download(a, got.data(), got.size());
        gpu_->download(b, want.data(), want.size());
        size_t differ = 0;
        for (size_t i = 0; i < got.size(); ++i) differ += got[i] != want[i];
        EXPECT_EQ(differ, 0u) << (which ? "value" : "key") << " cache: " << differ << " bytes differ";
      }
    }
  }
}

// Decode attention leaves the int8 copy of its output (written where the output is: a
// one-range block, or where the ranges merge) for the next product: the product over it must equal the product
// that quantizes the output afresh, bit for bit.
TEST_F(FusedOps, AttentionInt8CopyMatchesQuantizingAgain) {
  const int n_head = 8, n_kv = 2, head_dim = 128, block = 16;
  // {200, 149}: one range per head in blocks of 512 threads; {300, 149}: 10 ranges merged in
  // a cluster (sm_90); {2500, 149}: in the second kernel (ranges too long for a cluster).
  for (const int32_t longest : {200, 300, 2500}) {
    SCOPED_TRACE("longest position " + std::to_string(longest));
    const std::vector<int32_t> positions = {longest, 149};
    const int max_blocks = (longest + block) / block;
    const int64_t T = int64_t(positions.size()), width = int64_t(n_kv) * head_dim;
    const int64_t n_slots = int64_t(max_blocks) * block * T;
    std::vector<int32_t> tables(size_t(max_blocks * T)), rows, slots;
    for (size_t i = 0; i < tables.size(); ++i) tables[i] = int32_t((i * 7 + 3) % tables.size());  // scattered
    for (int64_t t = 0; t < T; ++t) {
      rows.push_back(int32_t(t));
      const int p = positions[size_t(t)];
      slots.push_back(tables[size_t(t * max_blocks + p / block)] * block + p % block);
    }
    for (GgmlType cache_type : {GgmlType::F32, GgmlType::F16}) {
      SCOPED_TRACE(std::string(type_name(cache_type)) + " cache");
      KvLayer cache;
      cache.block_size = block;
      cache.k = nan_cache(cache_type, width, n_slots), cache.v = nan_cache(cache_type, width, n_slots);
      // Every slot gets values (kv_store rounds them for an f16 cache).
      std::vector<int32_t> every_slot(static_cast<size_t>(n_slots));
      for (int64_t i = 0; i < n_slots; ++i) every_slot[size_t(i)] = int32_t(i);
      gpu_->kv_store(random({width, n_slots}), random({width, n_slots}), cache, ints(every_slot));
      BatchIndex batch{ints(positions), ints(rows), ints(slots), Tensor{}, positions[0]};
      buffers_.push_back(gpu_->allocate(tables.size() * 4));
      batch.block_tables = buffers_.back()->view(GgmlType::I32, {max_blocks, T});
      gpu_->upload(tables.data(), batch.block_tables, tables.size() * 4);
      AttentionParams p;
      p.n_head = n_head, p.n_head_kv = n_kv, p.head_dim_k = head_dim, p.head_dim_v = head_dim;
      p.scale = 0.09f;
      Tensor q = random({int64_t(n_head) * head_dim, T}), out = poisoned(int64_t(n_head) * head_dim, T);
      const Tensor w = weight(GgmlType::Q4_0, int64_t(n_head) * head_dim, 96), none;
      Tensor y = poisoned(96, T);
      gpu_->attention(q, cache, batch, p, out);
      gpu_->matmul(out, w, none, y);
      EXPECT_TRUE(all_equal_bits(host(y), apart(out, w, none), "attention -> matmul"));
    }
  }
}

// q/k head norms with the rope and the cache store (one rope_store launch) vs rmsnorm on the
// heads then rope_kv_store. The norm's sum of squares is added in another order, so the
// values agree to a few ulp, not bit for bit.
TEST_F(FusedOps, NormRopeKvStoreMatchesHeadNormsThenRopeKvStore) {
  struct Case {
    int head_dim, n_head, n_kv, tokens;
    bool q_norm, k_norm;
  };
  // 21 and 12 tokens: prefill's rope_store_rows.
  const Case cases[] = {{128, 32, 4, 1, true, true},   {64, 6, 2, 3, true, false}, {256, 4, 1, 2, false, true},
                        {128, 32, 4, 21, true, true}, {64, 6, 2, 12, true, false}};
  const int64_t n_slots = 24;
  for (GgmlType cache_type : {GgmlType::F32, GgmlType::F16}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(type_name(cache_type)) + " head_dim " + std::to_string(c.head_dim) + " heads " +
                   std::to_string(c.n_head) + "/" + std::to_string(c.n_kv) + " T " + std::to_string(c.tokens));
      const int64_t T = c.tokens, q_width = int64_t(c.n_head) * c.head_dim, kv_width = int64_t(c.n_kv) * c.head_dim;
      RopeParams rope;
      rope.n_rot = c.head_dim;
      rope.style = RopeStyle::Neox;
      rope.freq_base = 1000000.0f;
      std::vector<int32_t> positions, slots;
      for (int64_t t = 0; t < T; ++t)
        positions.push_back(int32_t(300 * t + 5)), slots.push_back(int32_t((20 + 5 * t) % n_slots));
      const std::vector<float> q_host = random_floats(rng_, size_t(q_width * T), -2.0f, 2.0f);
      const std::vector<float> k_host = random_floats(rng_, size_t(kv_width * T), -2.0f, 2.0f);
      const std::vector<float> v_host = random_floats(rng_, size_t(kv_width * T), -2.0f, 2.0f);
      const Tensor qn = c.q_norm ? random({c.head_dim}) : Tensor{}, kn = c.k_norm ? random({c.head_dim}) : Tensor{};
      std::vector<float> q_out[2], k_out[2], cache_k[2], cache_v[2];
      for (int side = 0; side < 2; ++side) {
        Tensor q = floats({q_width, T}, q_host), k = floats({kv_width, T}, k_host), v = floats({kv_width, T}, v_host);
        const Tensor pos = ints(positions), slot = ints(slots);
        KvLayer cache;
        cache.block_size = 8;
        const size_t elem = cache_type == GgmlType::F16 ? 2 : 4;
        for (Tensor* t : {&cache.k, &cache.v}) {
          buffers_.push_back(gpu_->allocate(size_t(kv_width * n_slots) * elem));
          *t = buffers_.back()->view(cache_type, {kv_width, n_slots});
        }
        Tensor qh = q.reshape({c.head_dim, c.n_head, T}), kh = k.reshape({c.head_dim, c.n_kv, T});
        if (side == 0)
          gpu_->norm_rope_kv_store(qh, kh, v, qn, kn, 1e-6f, pos, rope, cache, slot);
        else
          gpu_->Backend::norm_rope_kv_store(qh, kh, v, qn, kn, 1e-6f, pos, rope, cache, slot);
        q_out[side] = host(q), k_out[side] = host(k);
        for (int which = 0; which < 2; ++which) {
          const Tensor& ct = which ? cache.v : cache.k;
          std::vector<uint8_t> raw(ct.bytes());
          gpu_->download(ct, raw.data(), raw.size());
          std::vector<float>& dst = which ? cache_v[side] : cache_k[side];
          for (int64_t t = 0; t < T; ++t)
            for (int64_t i = 0; i < kv_width; ++i) {
              const size_t at = size_t(slots[size_t(t)] * kv_width + i);
              uint16_t h = 0;
              if (elem == 2) std::memcpy(&h, raw.data() + 2 * at, 2);
              float f = 0;
              if (elem == 4) std::memcpy(&f, raw.data() + 4 * at, 4);
              dst.push_back(elem == 2 ? f16_to_f32(h) : f);
            }
        }
      }
      auto as_double = [](const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); };
      EXPECT_TRUE(all_close(q_out[0], as_double(q_out[1]), 2e-6, 1e-7, "q"));
      EXPECT_TRUE(all_close(k_out[0], as_double(k_out[1]), 2e-6, 1e-7, "k"));
      const double cache_rel = cache_type == GgmlType::F16 ? 1e-3 : 2e-6;  // one f16 step either way
      EXPECT_TRUE(all_close(cache_k[0], as_double(cache_k[1]), cache_rel, 1e-7, "key cache"));
      EXPECT_TRUE(all_equal_bits(cache_v[0], cache_v[1], "value cache"));
    }
  }
}

}  // namespace
}  // namespace kiln::testing
