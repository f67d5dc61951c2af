#include "backend/cuda/graph.h"

#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/error.h"

namespace kiln::cuda {

namespace {
constexpr size_t kMaxGraphs = 256;  // distinct graphs kept (step shapes x pieces); more: start over

// KILN_CUDA_GRAPH_PIECES=N (N > 0): flush a pass in graphs of N ops, so that the GPU starts
// on the first layers while the host records the rest. Off by default: on an H200 with
// pieces of 96 ops, 8B q4_0 decode ran 297 t/s against 312 with one graph per step (the
// launches and gaps between pieces cost more than the overlap saved; docs/perf-notes.md).
size_t piece_ops() {
  static const size_t n = [] {
    const char* env = std::getenv("KILN_CUDA_GRAPH_PIECES");
    const long v = env ? std::strtol(env, nullptr, 10) : 0;
    return v > 0 ? size_t(v) : SIZE_MAX;
  }();
  return n;
}
}

StepGraphs::~StepGraphs() {
  for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
}

void StepGraphs::add(const SignatureHash& signature, int64_t tokens, Launch launch, const char* op) {
  if (!enabled_) {
    throw_if_error(launch(stream_));
    return;
  }
  hash_.pod(signature.value);
  widest_ = std::max(widest_, tokens);
  ops_.push_back({std::move(launch), op});
  if (ops_.size() >= piece_ops()) flush();
}

void StepGraphs::clear() {
  ops_.clear();
  hash_ = SignatureHash{};
  widest_ = 0;
}

void StepGraphs::run_eagerly() {
  ++eager_;
  for (Recorded& r : ops_) {
    const Status s = r.launch(stream_);
    if (!s.ok()) {
      clear();
      fail("cuda backend: op {}: {}", r.op, s.message());
    }
  }
  clear();
}

void StepGraphs::flush() {
  if (ops_.empty()) return;
  if (widest_ > max_tokens_) return run_eagerly();
  hash_.pod(ops_.size());
  const uint64_t key = hash_.value;
  auto found = graphs_.find(key);
  if (found == graphs_.end()) {
    if (graphs_.size() >= kMaxGraphs) {
      for (auto& [k, exec] : graphs_) cudaGraphExecDestroy(exec);
      graphs_.clear();
    }
    // Relaxed mode: the kernel launchers may set function attributes while we capture.
    cudaError_t e = cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed);
    if (e != cudaSuccess) {
      clear();
      fail("cuda backend: cannot begin graph capture: {}", cudaGetErrorString(e));
    }
    Status failed;
    const char* failed_op = nullptr;
    for (Recorded& r : ops_) {
      Status s = r.launch(stream_);
      if (!s.ok()) {
        failed = std::move(s);
        failed_op = r.op;
        break;
      }
    }
    cudaGraph_t graph = nullptr;
    e = cudaStreamEndCapture(stream_, &graph);
    if (failed_op) {
      if (graph) cudaGraphDestroy(graph);
      clear();
      fail("cuda backend: op {} (while capturing a step graph): {}", failed_op, failed.message());
    }
    if (e != cudaSuccess) {
      clear();
      fail("cuda backend: graph capture failed: {}", cudaGetErrorString(e));
    }
    cudaGraphExec_t exec = nullptr;
    e = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    if (e != cudaSuccess) {
      clear();
      fail("cuda backend: cannot instantiate the step graph of {} ops: {}", ops_.size(), cudaGetErrorString(e));
    }
    found = graphs_.emplace(key, exec).first;
    ++captures_;
  } else {
    ++replays_;
  }
  const cudaError_t e = cudaGraphLaunch(found->second, stream_);
  clear();
  if (e != cudaSuccess) fail("cuda backend: graph launch failed: {}", cudaGetErrorString(e));
}

int attention_bucket(int needed, int limit) {
  int b = 256;
  while (b < needed) b *= 2;
  return std::max(needed, std::min(b, limit));
}

}  // namespace kiln::cuda
