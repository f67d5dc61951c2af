#pragma once
// What the CUDA benchmark programs share: exit-on-error checks, a fast generator for
// hundreds of MB of random weights, random weight rows of any type with finite scales (as
// the tests make them), the median of timing samples and the graph-replay timer.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include "backend/cuda/status.h"
#include "core/half.h"
#include "quant/types.h"

namespace kiln::bench {

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "bench: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}
inline void check(const cuda::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "bench: %s: %s\n", what, s.message().c_str());
    std::exit(1);
  }
}

struct Rng {  // splitmix64: fast enough to fill hundreds of MB
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  float uniform() { return float(next() >> 40) / float(1 << 24) * 2.0f - 1.0f; }
};

// Random weights of `type`: random quant bytes, finite scales (as the tests make them).
inline std::vector<uint8_t> random_weights(GgmlType type, int64_t rows, int64_t cols, Rng& rng) {
  const TypeTraits& t = traits(type);
  const int64_t row_bytes = cols / t.block_size * t.type_size;
  std::vector<uint8_t> w(size_t(rows * row_bytes));
  if (!t.is_quantized) {
    for (size_t i = 0; i < w.size() / t.type_size; ++i) {
      const float v = rng.uniform();
      if (type == GgmlType::F32) std::memcpy(&w[4 * i], &v, 4);
      const uint16_t h = type == GgmlType::F16 ? f32_to_f16(v) : f32_to_bf16(v);
      if (type != GgmlType::F32) std::memcpy(&w[2 * i], &h, 2);
    }
    return w;
  }
  for (size_t i = 0; i + 8 <= w.size(); i += 8) {
    const uint64_t r = rng.next();
    std::memcpy(&w[i], &r, 8);
  }
  std::vector<int> fields;
  switch (type) {
    case GgmlType::Q4_1: case GgmlType::Q5_1: case GgmlType::Q4_K: case GgmlType::Q5_K: fields = {0, 2}; break;
    case GgmlType::Q2_K: fields = {80, 82}; break;
    case GgmlType::Q3_K: fields = {108}; break;
    case GgmlType::Q6_K: fields = {208}; break;
    case GgmlType::MXFP4: break;
    default: fields = {0};
  }
  for (size_t b = 0; b < w.size() / t.type_size; ++b) {
    uint8_t* block = &w[b * t.type_size];
    for (int off : fields) {
      const uint16_t h = f32_to_f16(0.01f * rng.uniform());
      std::memcpy(block + off, &h, 2);
    }
    if (type == GgmlType::MXFP4) block[0] = uint8_t(118 + rng.next() % 16);
  }
  return w;
}

inline float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Microseconds per call: `batch` calls of launch(i) captured into a graph, replayed 3 times
// to warm up, then `samples` times between events; the median replay over batch.
inline double time_graph(cudaStream_t s, int batch, int samples, const std::function<void(int)>& launch) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  check(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "begin capture");
  for (int i = 0; i < batch; ++i) launch(i);
  check(cudaStreamEndCapture(s, &graph), "end capture");
  check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int i = 0; i < 3; ++i) check(cudaGraphLaunch(exec, s), "graph launch");
  std::vector<float> ms;
  for (int i = 0; i < samples; ++i) {
    cudaEventRecord(a, s);
    check(cudaGraphLaunch(exec, s), "graph launch");
    cudaEventRecord(b, s);
    check(cudaEventSynchronize(b), "replay");
    float t = 0;
    cudaEventElapsedTime(&t, a, b);
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return double(median(ms)) * 1000.0 / batch;
}

}  // namespace kiln::bench
