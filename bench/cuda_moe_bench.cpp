// MoE FFN kernel benchmark (a plain program, not a test): the routed kernels of
// backend/cuda/moe.h on Qwen3-30B-A3B's expert shapes (128 experts of 2048 -> 768 -> 2048,
// 8 used), random weights and random routing. Decode (indexed matvecs): the median of
// graph replays of 20 calls, each call with its own routing so that the experts it reads
// are mostly not in L2, with the down product's per-segment and flattened walks in turn
// (MoeDownWalk; 768 columns are 24 slices, so the flattened walk leaves no lane idle).
// Prefill (grouped GEMMs): the median of single calls, with tile engine v4, v6, v7 and v8.
// Prints time, the bytes of the experts the call must read at least once / that time, and
// TFLOP/s of the routed work.
//
//   bench_cuda_moe_bench [gate_up_type down_type]...   (default: q4_K q4_K  q4_K q6_K  q8_0 q8_0)
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "backend/cuda/moe.h"
#include "quant/types.h"
#include "cuda_bench_util.h"

namespace {

using namespace kiln;
using namespace kiln::cuda;
using namespace kiln::bench;

constexpr int64_t kEmbd = 2048, kFf = 768, kExperts = 128, kUsed = 8;

void* device_copy(const void* host, size_t bytes) {
  void* p = nullptr;
  check(cudaMalloc(&p, bytes + 256), "cudaMalloc");
  check(cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice), "upload");
  return p;
}

std::vector<int32_t> random_ids(int64_t T, std::mt19937_64& rng) {
  std::vector<int32_t> ids, order(kExperts);
  for (int64_t t = 0; t < T; ++t) {
    for (int e = 0; e < kExperts; ++e) order[size_t(e)] = e;
    std::shuffle(order.begin(), order.end(), rng);
    ids.insert(ids.end(), order.begin(), order.begin() + kUsed);
  }
  return ids;
}

// Routing concentrated on few experts, as the synthetic models' (whose MoE layers cost ~2/3
// of the uniform case): expert e drawn with weight 2^(-e/3), k distinct per token. At T = 512
// that makes ~87 tiles of 64 pairs, ~53 of them full (uniform: 128, almost none full).
std::vector<int32_t> concentrated_ids(int64_t T, std::mt19937_64& rng) {
  std::vector<int32_t> ids;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> weight(static_cast<size_t>(kExperts));
    for (int e = 0; e < kExperts; ++e) weight[size_t(e)] = std::exp2(-e / 3.0);
    for (int j = 0; j < kUsed; ++j) {
      std::discrete_distribution<int> pick(weight.begin(), weight.end());
      const int e = pick(rng);
      ids.push_back(e);
      weight[size_t(e)] = 0;
    }
  }
  return ids;
}

void run(GgmlType gate_up, GgmlType down, std::mt19937_64& rng) {
  const TypeTraits &tg = traits(gate_up), &td = traits(down);
  const int64_t g_row = kEmbd / tg.block_size * tg.type_size, d_row = kFf / td.block_size * td.type_size;
  MoeFfnArgs a;
  a.gate.type = a.up.type = gate_up, a.down.type = down;
  a.gate.row_bytes = a.up.row_bytes = g_row, a.down.row_bytes = d_row;
  a.gate.expert_bytes = a.up.expert_bytes = g_row * kFf, a.down.expert_bytes = d_row * kEmbd;
  Rng weights_rng{rng()};
  a.gate.data = device_copy(random_weights(gate_up, kExperts * kFf, kEmbd, weights_rng).data(),
                            size_t(g_row * kFf * kExperts));
  a.up.data = device_copy(random_weights(gate_up, kExperts * kFf, kEmbd, weights_rng).data(),
                          size_t(g_row * kFf * kExperts));
  a.down.data = device_copy(random_weights(down, kExperts * kEmbd, kFf, weights_rng).data(),
                            size_t(d_row * kEmbd * kExperts));
  a.n_embd = kEmbd, a.n_ff = kFf, a.n_expert = kExperts, a.n_used = kUsed;
  const double expert_bytes = double(2 * g_row * kFf + d_row * kEmbd);

  constexpr int64_t kMaxT = 512;
  std::vector<float> x(size_t(kMaxT * kEmbd)), w(size_t(kMaxT * kUsed));
  std::uniform_real_distribution<float> ux(-1.0f, 1.0f), uw(0.05f, 0.3f);
  for (float& v : x) v = ux(rng);
  for (float& v : w) v = uw(rng);
  a.x = static_cast<float*>(device_copy(x.data(), x.size() * 4)), a.x_stride = kEmbd;
  a.weights = static_cast<float*>(device_copy(w.data(), w.size() * 4)), a.weights_stride = kUsed;
  float* out = nullptr;
  check(cudaMalloc(&out, size_t(kMaxT * kEmbd) * 4), "cudaMalloc out");
  a.out = out, a.out_stride = kEmbd, a.ids_stride = kUsed;
  cudaStream_t s;
  check(cudaStreamCreate(&s), "stream");
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0), cudaEventCreate(&e1);
  const std::string name = std::string(type_name(gate_up)) + "/" + std::string(type_name(down));

  // Decode: T tokens, 20 routings in one graph.
  for (const int64_t T : {int64_t(1), int64_t(4)}) {
    a.n_tokens = T;
    constexpr int kBatch = 20;
    std::vector<const int32_t*> ids;
    double touched = 0;
    for (int i = 0; i < kBatch; ++i) {
      const std::vector<int32_t> h = random_ids(T, rng);
      touched += double(std::set<int32_t>(h.begin(), h.end()).size());
      ids.push_back(static_cast<const int32_t*>(device_copy(h.data(), h.size() * 4)));
    }
    const size_t need = moe_matvec_scratch_bytes(a, false);
    void* scratch = nullptr;
    check(cudaMalloc(&scratch, need), "scratch");
    for (const MoeDownWalk walk : {MoeDownWalk::PerSegment, MoeDownWalk::Flat}) {
      const double us = time_graph(s, kBatch, 30, [&](int i) {
        MoeFfnArgs b = a;
        b.ids = ids[size_t(i)];
        b.down_walk = walk;
        check(moe_ffn_matvec(b, false, scratch, need, s), "moe_ffn_matvec");
      });
      const double bytes = touched / kBatch * expert_bytes;
      std::printf("%-10s decode T=%-3lld %-12s %8.1f us  %6.0f GB/s of %.1f MB routed experts (floor %.1f us at 4.2 "
                  "TB/s)\n",
                  name.c_str(), (long long)T, walk == MoeDownWalk::Flat ? "flat" : "per-segment", us,
                  bytes / us * 1e-3, bytes * 1e-6, bytes / 4.2e6);
    }
    cudaFree(scratch);
    for (const int32_t* p : ids) cudaFree(const_cast<int32_t*>(p));
  }

  // Prefill: T tokens, one call per sample.
  for (const auto& [T, concentrated] : {std::pair<int64_t, bool>{64, false}, {512, false}, {512, true}}) {
    a.n_tokens = T;
    const std::vector<int32_t> h = concentrated ? concentrated_ids(T, rng) : random_ids(T, rng);
    const double touched = double(std::set<int32_t>(h.begin(), h.end()).size());
    a.ids = static_cast<const int32_t*>(device_copy(h.data(), h.size() * 4));
    const size_t need = moe_gemm_scratch_bytes(a);
    void* scratch = nullptr;
    check(cudaMalloc(&scratch, need), "scratch");
    for (const int version : {4, 6, 7, 8}) {  // the tile engines (moe_gemm_tile.cuh, moe_gemm_v8.cuh), in turn
      a.gemm_version = version;
      for (int i = 0; i < 3; ++i) check(moe_ffn_gemm(a, scratch, need, s), "moe_ffn_gemm");
      std::vector<float> ms;
      for (int i = 0; i < 20; ++i) {
        cudaEventRecord(e0, s);
        check(moe_ffn_gemm(a, scratch, need, s), "moe_ffn_gemm");
        cudaEventRecord(e1, s);
        check(cudaEventSynchronize(e1), "sync");
        float t = 0;
        cudaEventElapsedTime(&t, e0, e1);
        ms.push_back(t);
      }
      const double us = median(ms) * 1000.0;
      const double flops = 2.0 * double(T * kUsed) * 3.0 * double(kEmbd * kFf);
      const double bytes = touched * expert_bytes;
      std::printf("%-10s prefill v%d T=%-4lld %-12s %8.1f us  %6.1f TFLOP/s  %6.0f GB/s of %.0f MB experts (floors: "
                  "%.1f us FLOP at 790 TFLOP/s, %.1f us bytes)\n",
                  name.c_str(), version, (long long)T, concentrated ? "concentrated" : "uniform", us, flops / us * 1e-6,
                  bytes / us * 1e-3, bytes * 1e-6, flops / 790e6, bytes / 4.2e6);
    }
    a.gemm_version = 0;
    cudaFree(scratch), cudaFree(const_cast<int32_t*>(a.ids));
  }
  cudaFree(const_cast<void*>(a.gate.data)), cudaFree(const_cast<void*>(a.up.data)),
      cudaFree(const_cast<void*>(a.down.data));
  cudaFree(const_cast<float*>(a.x)), cudaFree(const_cast<float*>(a.weights)), cudaFree(out);
  cudaStreamDestroy(s);
}

GgmlType parse_type(const char* name) {
  for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q5_K, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::MXFP4})
    if (type_name(t) == name) return t;
  std::fprintf(stderr, "bench: unknown type %s (q4_K q6_K q5_K q8_0 q4_0 mxfp4)\n", name);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  std::mt19937_64 rng(7);
  if (argc >= 3) {
    for (int i = 1; i + 1 < argc; i += 2) run(parse_type(argv[i]), parse_type(argv[i + 1]), rng);
    return 0;
  }
  run(GgmlType::Q4_K, GgmlType::Q4_K, rng);
  run(GgmlType::Q4_K, GgmlType::Q6_K, rng);
  run(GgmlType::Q8_0, GgmlType::Q8_0, rng);
  return 0;
}
