#pragma once
// What the standalone GPU benchmark programs (bench/cuda_*.cu) share: a piece of GPU work
// captured once as a CUDA graph and timed over replays, and the global-memory counter
// primitives of their barriers between thread blocks.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

namespace kiln::bench {

// Ends the program, naming it, the call and the CUDA error, when `e` is not success.
inline void exit_on_cuda_error(const char* program, cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s: %s\n", program, what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// Median microseconds of one replay of `enqueue`, over `replays` timed replays after 3
// warm-ups: captured as a graph when the runtime allows it (as_graph = true), else launched
// directly between the events. A kernel that traps shows as the "replay finished" error.
inline double median_replay_us(const char* program, cudaStream_t s, const std::function<cudaError_t()>& enqueue,
                               int replays, bool& as_graph) {
  const auto check = [program](cudaError_t e, const char* what) { exit_on_cuda_error(program, e, what); };
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  check(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "begin capture");
  const cudaError_t captured = enqueue();
  const cudaError_t ended = cudaStreamEndCapture(s, &graph);
  as_graph = captured == cudaSuccess && ended == cudaSuccess && cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess;
  if (!as_graph) (void)cudaGetLastError();  // a failed capture leaves no sticky error
  const auto replay = [&] { return as_graph ? cudaGraphLaunch(exec, s) : enqueue(); };
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "event");
  check(cudaEventCreate(&stop), "event");
  for (int i = 0; i < 3; ++i) check(replay(), "warm-up replay");
  std::vector<float> ms;
  for (int i = 0; i < replays; ++i) {
    check(cudaEventRecord(start, s), "event record");
    check(replay(), "replay");
    check(cudaEventRecord(stop, s), "event record");
    check(cudaEventSynchronize(stop), "replay finished (a trap here: a wait timed out)");
    float t = 0;
    check(cudaEventElapsedTime(&t, start, stop), "elapsed");
    ms.push_back(t);
  }
  check(cudaEventDestroy(start), "event");
  check(cudaEventDestroy(stop), "event");
  if (exec) check(cudaGraphExecDestroy(exec), "graph exec destroy");
  if (graph) check(cudaGraphDestroy(graph), "graph destroy");
  std::sort(ms.begin(), ms.end());
  return 1000.0 * ms[ms.size() / 2];
}

// A counter read with acquire order at GPU scope (a barrier's wait)...
__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
// ... and added to with release order (a block's arrival, after its writes).
__device__ __forceinline__ void add_release(unsigned* p, unsigned v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

}  // namespace kiln::bench
