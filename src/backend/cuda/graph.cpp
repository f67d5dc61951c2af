#include "backend/cuda/graph.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "backend/cuda/device.h"
#include "backend/cuda/env_switch.h"
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
    const int v = env_int("KILN_CUDA_GRAPH_PIECES", 0);
    return v > 0 ? size_t(v) : SIZE_MAX;
  }();
  return n;
}

// KILN_CUDA_SKIP_OPS=name[,name...]: ops of those names (as KILN_CUDA_OP_TIMING prints them)
// are not recorded at all. The results are then wrong; what is left is a measurement: the
// GPU time of a step (KILN_CUDA_STEP_TIMING=1) with and without an op is what that op costs
// inside the chained graph, which eager op timing over-counts for small kernels. Do not skip
// ops whose output indexes memory (moe_route, argmax, get_rows' ids).
bool skipped_by_request(const char* op) {
  static const std::string list = [] {
    const char* env = std::getenv("KILN_CUDA_SKIP_OPS");
    if (!env || !*env) return std::string();
    std::fprintf(stderr, "kiln cuda: KILN_CUDA_SKIP_OPS=%s: those ops are not run, results are wrong (timing only)\n",
                 env);
    return "," + std::string(env) + ",";
  }();
  return !list.empty() && list.find("," + std::string(op) + ",") != std::string::npos;
}
}

StepGraphs::StepGraphs(cudaStream_t stream, bool enabled, int max_tokens)
    : stream_(stream), enabled_(enabled), max_tokens_(max_tokens) {
  timing_ = env_is("KILN_CUDA_STEP_TIMING", "1");
  op_timing_ = env_int("KILN_CUDA_OP_TIMING", 0);
  if (timing_)
    for (EventPair& p : timers_) {
      cudaEventCreate(&p.start);
      cudaEventCreate(&p.end);
    }
}

StepGraphs::~StepGraphs() {
  if (timing_) {
    cudaStreamSynchronize(stream_);
    for (EventPair& p : timers_) {
      float ms = 0;
      if (p.used && cudaEventElapsedTime(&ms, p.start, p.end) == cudaSuccess) replay_ms_.push_back(ms);
      cudaEventDestroy(p.start);
      cudaEventDestroy(p.end);
    }
    print_replay_times();
  }
  if (op_timing_) {
    double total = 0;
    for (const OpTime& t : op_times_) total += t.count ? t.ms / double(t.count) : 0;
    std::fprintf(stderr, "kiln cuda: per-op GPU time of a %s pass (%zu ops, %.4f ms in all)\n",
                 op_timing_ == 1 ? "decode" : "prefill", op_times_.size(), total);
    for (size_t i = 0; i < op_times_.size(); ++i)
      if (op_times_[i].count)
        std::fprintf(stderr, "  op %4zu %-20s %9.2f us\n", i, op_times_[i].op,
                     1e3 * op_times_[i].ms / double(op_times_[i].count));
  }
  for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
}

void StepGraphs::run_timed_ops() {
  std::vector<cudaEvent_t> events(ops_.size() + 1);
  for (cudaEvent_t& e : events) cudaEventCreate(&e);
  // Queue the whole pass behind a wait, so that the host's launch rate does not show up as
  // gaps between the kernels.
  hold_stream(stream_, 20000);
  cudaEventRecord(events[0], stream_);
  for (size_t i = 0; i < ops_.size(); ++i) {
    const Status s = ops_[i].launch(stream_);
    if (!s.ok()) {
      for (cudaEvent_t& e : events) cudaEventDestroy(e);
      const char* op = ops_[i].op;
      clear();
      fail("cuda backend: op {}: {}", op, s.message());
    }
    cudaEventRecord(events[i + 1], stream_);
  }
  cudaEventSynchronize(events.back());
  if (op_times_.size() < ops_.size()) op_times_.resize(ops_.size());
  for (size_t i = 0; i < ops_.size(); ++i) {
    float ms = 0;
    cudaEventElapsedTime(&ms, events[i], events[i + 1]);
    op_times_[i].op = ops_[i].op;
    op_times_[i].ms += ms;
    ++op_times_[i].count;
  }
  for (cudaEvent_t& e : events) cudaEventDestroy(e);
  clear();
}

// The mean (the figure scripts read: "<mean> ms of GPU time each"), then the spread, so that
// a run whose repetitions differ shows whether the GPU time did.
void StepGraphs::print_replay_times() {
  std::vector<float>& ms = replay_ms_;  // sorted in place: printed once, as the graphs go
  double sum = 0;
  for (float v : ms) sum += v;
  std::sort(ms.begin(), ms.end());
  auto at = [&](double q) { return ms.empty() ? 0.0 : double(ms[size_t(q * double(ms.size() - 1) + 0.5)]); };
  std::fprintf(stderr,
               "kiln cuda: %zu graph replays timed, %.4f ms of GPU time each (min %.4f, median %.4f, p90 %.4f, "
               "max %.4f)\n",
               ms.size(), ms.empty() ? 0.0 : sum / double(ms.size()), at(0), at(0.5), at(0.9), at(1));
}

void StepGraphs::timed_launch(cudaGraphExec_t exec) {
  EventPair& p = timers_[next_timer_];
  next_timer_ = (next_timer_ + 1) % 4;
  if (p.used) {
    float ms = 0;
    cudaEventSynchronize(p.end);  // from four launches ago: done or nearly
    if (cudaEventElapsedTime(&ms, p.start, p.end) == cudaSuccess) replay_ms_.push_back(ms);
  }
  cudaEventRecord(p.start, stream_);
  const cudaError_t e = cudaGraphLaunch(exec, stream_);
  cudaEventRecord(p.end, stream_);
  p.used = true;
  if (e != cudaSuccess) fail("cuda backend: graph launch failed: {}", cudaGetErrorString(e));
}

void StepGraphs::add(const SignatureHash& signature, int64_t tokens, Launch launch, const char* op) {
  if (skipped_by_request(op)) return;
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
  if (op_timing_ == 1 && widest_ == 1) return run_timed_ops();
  if (op_timing_ == 2 && widest_ > max_tokens_) return run_timed_ops();
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
    // Step timing also says when graphs are captured: a capture among replays costs a step
    // several times over, and shows here where the replay times only show a slow step.
    if (timing_)
      std::fprintf(stderr, "kiln cuda: step graph %lld captured (%zu ops) after %lld replays\n",
                   (long long)captures_, ops_.size(), (long long)replays_);
  } else {
    ++replays_;
  }
  clear();
  if (timing_) return timed_launch(found->second);
  const cudaError_t e = cudaGraphLaunch(found->second, stream_);
  if (e != cudaSuccess) fail("cuda backend: graph launch failed: {}", cudaGetErrorString(e));
}

int attention_bucket(int needed, int limit) {
  int b = 256;
  while (b < needed) b *= 2;
  return std::max(needed, std::min(b, limit));
}

}  // namespace kiln::cuda
