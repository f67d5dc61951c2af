#pragma once
// Step graphs: the CUDA backend records the ops of a pass instead of launching them, and at
// the next host sync point (synchronize, download, an upload too large for a step slot)
// either replays a CUDA graph it captured earlier for the same op sequence or runs the ops
// eagerly. A pass's small uploads are ops of the graph themselves (step_io.h).
//
// Every op contributes a signature (its kind, its tensors' pointers, shapes and strides, its
// parameters) to a running hash. Two passes with the same hash launch the same kernels on
// the same buffers with the same arguments; what changes from step to step (positions,
// slots, block tables, the token) lives in device buffers that the pass's upload ops refresh
// from a step slot (so each step shape has a graph per slot). A pass whose ops touch more
// than `max_tokens` rows (prefill) runs eagerly; so does every pass when graphs are off.
// Decode attention sizes its grid for a context bucket (attention_bucket) rather than the
// exact length, so that one graph serves many steps.
// KILN_CUDA_GRAPH_PIECES=N flushes a pass in graphs of N ops instead (measured slower; off).
// KILN_CUDA_SKIP_OPS=a,b leaves the named ops out (wrong results; for measuring what each
// costs in the chained graph, see graph.cpp).
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/cuda/status.h"

namespace kiln::cuda {

// FNV-1a over raw bytes, folded into a running value.
struct SignatureHash {
  uint64_t value = 1469598103934665603ull;
  // Eight bytes a step (a decode pass hashes ~200 KB of signatures: byte steps cost ~0.3 ms
  // of host time per token), each step's product folded back down so high bits mix too.
  void bytes(const void* data, size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      uint64_t word;
      std::memcpy(&word, p + i, 8);
      value = (value ^ word) * 1099511628211ull;
      value ^= value >> 29;
    }
    for (; i < n; ++i) value = (value ^ p[i]) * 1099511628211ull;
  }
  template <typename T>
  void pod(const T& v) { bytes(&v, sizeof(v)); }
};

class StepGraphs {
 public:
  using Launch = std::function<Status(cudaStream_t)>;

  StepGraphs(cudaStream_t stream, bool enabled, int max_tokens);
  ~StepGraphs();
  StepGraphs(const StepGraphs&) = delete;
  StepGraphs& operator=(const StepGraphs&) = delete;

  bool enabled() const { return enabled_; }
  // Adds one op: `signature` already folded into by the caller; `tokens` = rows it touches.
  void add(const SignatureHash& signature, int64_t tokens, Launch launch, const char* op);
  // Runs what was recorded (replay, capture, or eagerly). Throws kiln::Error naming the op
  // whose launch failed.
  void flush();
  bool pending() const { return !ops_.empty(); }

  // Counters for tests and benchmarks.
  int64_t captures() const { return captures_; }
  int64_t replays() const { return replays_; }
  int64_t eager_passes() const { return eager_; }
  // KILN_CUDA_STEP_TIMING=1: the GPU time of each graph replay is measured with events; the
  // mean and spread are printed to stderr when the graphs are destroyed (the host time per step
  // is the rest of a step), and each capture as it happens.

 private:
  struct Recorded {
    Launch launch;
    const char* op;
  };
  void run_eagerly();
  void clear();

  cudaStream_t stream_;
  bool enabled_;
  int max_tokens_;
  std::vector<Recorded> ops_;
  SignatureHash hash_;
  int64_t widest_ = 0;
  std::unordered_map<uint64_t, cudaGraphExec_t> graphs_;
  int64_t captures_ = 0, replays_ = 0, eager_ = 0;
  // Step timing (off unless asked for): event pairs used in turn around graph launches.
  void timed_launch(cudaGraphExec_t exec);
  void print_replay_times();
  // KILN_CUDA_OP_TIMING=1 (decode passes of one token) or 2 (prefill passes): those passes
  // run eagerly, each op between two events, and the average time of the i-th op is printed
  // at destruction. A profile for finding the slow kernels, not a measure of the step (no
  // graph, no overlap between kernels).
  void run_timed_ops();
  struct OpTime {
    const char* op = nullptr;
    double ms = 0;
    int64_t count = 0;
  };
  int op_timing_ = 0;
  std::vector<OpTime> op_times_;
  struct EventPair {
    cudaEvent_t start = nullptr, end = nullptr;
    bool used = false;
  };
  bool timing_ = false;
  EventPair timers_[4];
  int next_timer_ = 0;
  std::vector<float> replay_ms_;  // GPU time of each timed replay
};

// The context length decode attention is planned for: the next power of two at or above
// `needed` (at least 256), capped at `limit`.
int attention_bucket(int needed, int limit);

}  // namespace kiln::cuda
