// The f16 KV cache on the GPU against the CPU backend's f16 cache, on random inputs:
//   - kv_store writes the same halves (both round to nearest even): bit equality;
//   - attention over them agrees within f32 rounding. Both round the query to f16 as well,
//     so the inputs are identical and only the order of the f32 sums and expf differ:
//     |gpu - cpu| <= 1e-5 |cpu| + 1e-6 per element (the bound of the f32 cache in
//     backend_ops_test.cpp).
// Head sizes the library kernel takes (64, 128; contexts that need one key range and several
// merged ranges) and sizes only the general kernel takes (48/40, 40); grouped-query heads,
// sliding window, soft-cap, sinks; two sequences over interleaved, shuffled blocks of 8.
// Slots never written hold NaN, so reading one fails the comparison. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "cuda_test_support.h"
#include "twin_tensors.h"

namespace kiln::testing {
namespace {

using cuda::testing::all_close;
using cuda::testing::random_floats;

struct CacheCase {
  int dk, dv, n_head, n_kv;
  float softcap;
  int window;
  bool sinks;
  int length0, length1;  // tokens stored for sequence 0 and 1
  int queries;           // attention for the last `queries` positions of each sequence
};

std::string describe(const CacheCase& c) {
  return "dk " + std::to_string(c.dk) + " dv " + std::to_string(c.dv) + " heads " + std::to_string(c.n_head) + "/" +
         std::to_string(c.n_kv) + " softcap " + std::to_string(c.softcap) + " window " + std::to_string(c.window) +
         (c.sinks ? " sinks" : "") + " lengths " + std::to_string(c.length0) + "/" + std::to_string(c.length1);
}

void PrintTo(const CacheCase& c, std::ostream* os) { *os << describe(c); }

class F16Cache : public ::testing::TestWithParam<CacheCase> {
 protected:
  void SetUp() override {
    std::string why;
    if (cuda::list_devices(&why).empty()) GTEST_SKIP() << "no CUDA device (" << why << "): GPU test not run";
    CudaOptions o;
    o.graphs = false;
    gpu_ = std::make_unique<CudaBackend>(o);
  }

  template <typename T>
  Twin make(GgmlType type, std::initializer_list<int64_t> shape, const std::vector<T>& data) {
    return make_twin(cpu_, *gpu_, type, shape, data);
  }

  template <typename T>
  std::pair<std::vector<T>, std::vector<T>> download(const Twin& t) {
    const size_t n = size_t(t.cpu.bytes() / sizeof(T));
    std::vector<T> on_gpu(n), on_cpu(n);
    gpu_->download(t.gpu, on_gpu.data(), n * sizeof(T));
    cpu_.download(t.cpu, on_cpu.data(), n * sizeof(T));
    return {on_gpu, on_cpu};
  }

  std::mt19937_64 rng_{20261130};
  CpuBackend cpu_{2};
  std::unique_ptr<CudaBackend> gpu_;
};

TEST_P(F16Cache, StoreAndAttentionMatchTheCpu) {
  const CacheCase c = GetParam();
  SCOPED_TRACE(describe(c));
  const int block = 8, n_rows = 2;
  const int lengths[2] = {c.length0, c.length1};
  const int max_blocks = (std::max(c.length0, c.length1) + block - 1) / block;
  const int64_t n_slots = int64_t(n_rows) * max_blocks * block;
  // Physical blocks of both sequences, shuffled.
  std::vector<int32_t> tables(size_t(n_rows * max_blocks));
  std::iota(tables.begin(), tables.end(), 0);
  std::shuffle(tables.begin(), tables.end(), rng_);
  auto slot_of = [&](int s, int p) { return tables[size_t(s * max_blocks + p / block)] * block + p % block; };

  // Store every token of both sequences, interleaved.
  std::vector<int32_t> store_slots;
  for (int p = 0; p < std::max(c.length0, c.length1); ++p)
    for (int s = 0; s < n_rows; ++s)
      if (p < lengths[s]) store_slots.push_back(slot_of(s, p));
  const int64_t T_store = int64_t(store_slots.size());
  const int64_t k_width = int64_t(c.n_kv) * c.dk, v_width = int64_t(c.n_kv) * c.dv;
  Twin k = make(GgmlType::F32, {k_width, T_store}, random_floats(rng_, size_t(k_width * T_store)));
  Twin v = make(GgmlType::F32, {v_width, T_store}, random_floats(rng_, size_t(v_width * T_store)));
  Twin slots = make(GgmlType::I32, {T_store}, store_slots);
  const uint16_t nan_half = 0x7e00;
  Twin ck = make(GgmlType::F16, {k_width, n_slots}, std::vector<uint16_t>(size_t(k_width * n_slots), nan_half));
  Twin cv = make(GgmlType::F16, {v_width, n_slots}, std::vector<uint16_t>(size_t(v_width * n_slots), nan_half));
  KvLayer cache_cpu{ck.cpu, cv.cpu, block}, cache_gpu{ck.gpu, cv.gpu, block};
  cpu_.kv_store(k.cpu, v.cpu, cache_cpu, slots.cpu);
  gpu_->kv_store(k.gpu, v.gpu, cache_gpu, slots.gpu);
  for (const Twin* t : {&ck, &cv}) {
    const auto [on_gpu, on_cpu] = download<uint16_t>(*t);
    size_t differ = 0, first = 0;
    for (size_t i = 0; i < on_gpu.size(); ++i)
      if (on_gpu[i] != on_cpu[i] && differ++ == 0) first = i;
    EXPECT_EQ(differ, 0u) << (t == &ck ? "cache k" : "cache v") << ": first difference at " << first << ": gpu 0x"
                          << std::hex << on_gpu[first] << " cpu 0x" << on_cpu[first];
  }

  // Attention for the last positions of each sequence, interleaved.
  std::vector<int32_t> pos, seq, query_slots;
  for (int i = c.queries; i > 0; --i)
    for (int s = 0; s < n_rows; ++s) {
      const int p = lengths[s] - i;
      if (p < 0) continue;
      pos.push_back(p), seq.push_back(s), query_slots.push_back(slot_of(s, p));
    }
  const int64_t T = int64_t(pos.size());
  Twin q = make(GgmlType::F32, {int64_t(c.n_head) * c.dk, T}, random_floats(rng_, size_t(c.n_head * c.dk * T)));
  Twin tp = make(GgmlType::I32, {T}, pos), ts = make(GgmlType::I32, {T}, seq), tsl = make(GgmlType::I32, {T}, query_slots);
  Twin tb = make(GgmlType::I32, {max_blocks, n_rows}, tables);
  Twin sinks = make(GgmlType::F32, {c.n_head}, random_floats(rng_, size_t(c.n_head), -2.0f, 3.0f));
  Twin out = make(GgmlType::F32, {int64_t(c.n_head) * c.dv, T}, std::vector<float>(size_t(c.n_head * c.dv * T), NAN));
  const int max_position = *std::max_element(pos.begin(), pos.end());
  BatchIndex bc{tp.cpu, ts.cpu, tsl.cpu, tb.cpu, max_position}, bg{tp.gpu, ts.gpu, tsl.gpu, tb.gpu, max_position};
  AttentionParams p;
  p.n_head = c.n_head, p.n_head_kv = c.n_kv, p.head_dim_k = c.dk, p.head_dim_v = c.dv;
  p.scale = 1.0f / std::sqrt(float(c.dk)), p.softcap = c.softcap, p.sliding_window = c.window;
  AttentionParams pc = p, pg = p;
  if (c.sinks) pc.sinks = &sinks.cpu, pg.sinks = &sinks.gpu;
  cpu_.attention(q.cpu, cache_cpu, bc, pc, out.cpu);
  gpu_->attention(q.gpu, cache_gpu, bg, pg, out.gpu);
  const auto [got, want] = download<float>(out);
  EXPECT_TRUE(all_close(got, std::vector<double>(want.begin(), want.end()), 1e-5, 1e-6, "attention"));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, F16Cache,
    ::testing::Values(CacheCase{64, 64, 8, 2, 0.0f, 0, false, 37, 29, 3},      // library kernel, 4 heads per kv head
                      CacheCase{128, 128, 6, 2, 30.0f, 0, true, 700, 333, 1},  // several key ranges merged
                      CacheCase{64, 64, 12, 4, 0.0f, 19, false, 150, 61, 5},   // 3 heads per kv head, window
                      CacheCase{48, 40, 6, 3, 0.0f, 0, true, 23, 11, 4},       // general kernel, dk != dv
                      CacheCase{40, 40, 4, 4, 20.0f, 7, false, 90, 5, 2}),     // general kernel, window, softcap
    [](const auto& info) {
      const CacheCase& c = info.param;
      return "dk" + std::to_string(c.dk) + "_dv" + std::to_string(c.dv) + "_heads" + std::to_string(c.n_head) + "_" +
             std::to_string(c.n_kv) + "_keys" + std::to_string(c.length0);
    });

}  // namespace
}  // namespace kiln::testing
