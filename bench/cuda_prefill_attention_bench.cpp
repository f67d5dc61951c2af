// Prefill attention alone (a plain program, not a test): kernel versions 6 and 8 side by side
// at prompt shapes of Llama-3-8B (32 query heads over 8 kv heads) and Qwen3-30B-A3B (32 over
// 4), head size 128, a paged f16 cache of 16-key blocks in shuffled order. Each figure is
// the median over 15 replays of a CUDA graph of 20 launches, per launch. Q, the cache and the
// output stay in L2 between launches, as they are in a real pass (written by the previous
// ops). The rate counts the causal work only: 4 * head_dim FLOP per (query, visible key,
// head). Also prints the largest difference of each version's outputs from v6's.
//
//   bench_cuda_prefill_attention_bench [--profile VERSION]
//     --profile: two plain launches of that version at the first shape (for ncu), no timing
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/prefill_attention.h"
#include "cuda_bench_util.h"

namespace {

using namespace kiln;
using namespace kiln::cuda;
using namespace kiln::bench;

struct Shape {
  const char* name;
  int n_tokens, first_position, n_head, n_head_kv;
  GgmlType cache;
  int window = 0;
};

struct DeviceMemory {
  void* p = nullptr;
  explicit DeviceMemory(size_t bytes) { check(cudaMalloc(&p, bytes + 16), "cudaMalloc"); }
  ~DeviceMemory() { cudaFree(p); }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
};

void run(const Shape& sh, cudaStream_t stream, int profile_version) {
  constexpr int D = 128, kBlock = 16;
  const int n_keys = sh.first_position + sh.n_tokens, n_blocks = (n_keys + kBlock - 1) / kBlock;
  std::mt19937 rng(7);
  std::vector<int32_t> table(static_cast<size_t>(n_blocks));
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);
  const int64_t slot_stride = int64_t(sh.n_head_kv) * D, n_slots = int64_t(n_blocks) * kBlock;
  Rng r{3};
  std::vector<uint8_t> k = random_weights(sh.cache, n_slots, slot_stride, r), v = random_weights(sh.cache, n_slots, slot_stride, r);
  std::vector<float> q(size_t(sh.n_tokens) * sh.n_head * D);
  for (float& x : q) x = r.uniform();
  const int32_t seq_row = 0;
  DeviceMemory k_d(k.size()), v_d(v.size()), q_d(q.size() * 4), t_d(table.size() * 4), s_d(4);
  check(cudaMemcpy(k_d.p, k.data(), k.size(), cudaMemcpyHostToDevice), "upload k");
  check(cudaMemcpy(v_d.p, v.data(), v.size(), cudaMemcpyHostToDevice), "upload v");
  check(cudaMemcpy(q_d.p, q.data(), q.size() * 4, cudaMemcpyHostToDevice), "upload q");
  check(cudaMemcpy(t_d.p, table.data(), table.size() * 4, cudaMemcpyHostToDevice), "upload table");
  check(cudaMemcpy(s_d.p, &seq_row, 4, cudaMemcpyHostToDevice), "upload seq row");

  PrefillAttentionArgs a;
  a.q = static_cast<const float*>(q_d.p), a.q_stride = int64_t(sh.n_head) * D;
  a.k_cache = k_d.p, a.v_cache = v_d.p, a.k_slot_stride = a.v_slot_stride = slot_stride;
  a.cache_type = sh.cache;
  a.block_tables = static_cast<const int32_t*>(t_d.p), a.block_table_stride = n_blocks;
  a.seq_rows = static_cast<const int32_t*>(s_d.p), a.block_size = kBlock;
  a.first_position = sh.first_position, a.n_tokens = sh.n_tokens;
  a.n_head = sh.n_head, a.n_head_kv = sh.n_head_kv, a.head_dim = D;
  a.scale = 1.0f / std::sqrt(float(D)), a.sliding_window = sh.window;
  a.out_stride = int64_t(sh.n_head) * D;

  double visible = 0;  // (query, key) pairs
  for (int t = 0; t < sh.n_tokens; ++t) {
    const int pos = sh.first_position + t;
    visible += sh.window > 0 ? std::min(pos + 1, sh.window) : pos + 1;
  }
  const double flop = 4.0 * D * visible * sh.n_head;

  DeviceMemory out_d(q.size() * 4);
  if (profile_version > 0) {
    a.version = profile_version;
    a.out = static_cast<float*>(out_d.p);
    for (int i = 0; i < 2; ++i) check(prefill_attention(a, stream), "prefill_attention");
    check(cudaStreamSynchronize(stream), "profile launches");
    std::printf("%s: v%d launched twice\n", sh.name, profile_version);
    return;
  }
  constexpr int kVersions = 2;
  const int versions[kVersions] = {6, 8};
  double us[kVersions];
  std::vector<float> out[kVersions];
  for (int i = 0; i < kVersions; ++i) {
    a.version = versions[i];
    a.out = static_cast<float*>(out_d.p);
    check(cudaMemset(a.out, 0xFF, q.size() * 4), "poison out");
    us[i] = time_graph(stream, 20, 15, [&](int) { check(prefill_attention(a, stream), "prefill_attention"); });
    out[i].resize(q.size());
    check(cudaMemcpy(out[i].data(), a.out, q.size() * 4, cudaMemcpyDeviceToHost), "download out");
  }
  std::printf("%-26s", sh.name);
  for (int i = 0; i < kVersions; ++i) {
    std::printf(" | v%d %7.2f us %6.1f TFLOP/s", versions[i], us[i], flop / us[i] * 1e-6);
    if (i == 0) continue;
    double max_diff = 0, max_ref = 0;
    size_t bad = 0;
    for (size_t j = 0; j < q.size(); ++j) {
      if (!std::isfinite(out[i][j]) || !std::isfinite(out[0][j])) ++bad;
      max_diff = std::max(max_diff, double(std::fabs(out[i][j] - out[0][j])));
      max_ref = std::max(max_ref, double(std::fabs(out[0][j])));
    }
    std::printf(" diff %.1e/%.1e%s", max_diff, max_ref, bad ? " NON-FINITE" : "");
  }
  std::printf("\n");
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const int profile_version = argc == 3 && std::string(argv[1]) == "--profile" ? std::atoi(argv[2]) : 0;
  cudaStream_t stream;
  check(cudaStreamCreate(&stream), "stream");
  const Shape shapes[] = {
      {"llama3-8b T=512", 512, 0, 32, 8, GgmlType::F16},
      {"qwen3-30b-a3b T=512", 512, 0, 32, 4, GgmlType::F16},
      {"llama3-8b T=128", 128, 0, 32, 8, GgmlType::F16},
      {"llama3-8b T=2048", 2048, 0, 32, 8, GgmlType::F16},
      {"llama3-8b T=512 after 1536", 512, 1536, 32, 8, GgmlType::F16},
      {"llama3-8b T=512 window 256", 512, 0, 32, 8, GgmlType::F16, 256},
      {"llama3-8b T=512 f32 cache", 512, 0, 32, 8, GgmlType::F32},
  };
  for (const Shape& sh : shapes) {
    run(sh, stream, profile_version);
    if (profile_version > 0) break;
  }
  cudaStreamDestroy(stream);
  return 0;
}
