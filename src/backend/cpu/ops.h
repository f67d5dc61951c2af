#pragma once
// The CPU implementations of the Backend ops (backend/backend.h has the contracts). They
// are the reference every other backend is checked against: plain loops, f32 activations,
// accumulations where precision matters in double, work split over a ThreadPool.
#include <algorithm>
#include <functional>
#include <vector>

#include "backend/backend.h"
#include "core/thread_pool.h"

namespace kiln::cpu {

void get_rows(const Tensor& table, const Tensor& ids, Tensor& out, ThreadPool& pool);
void rmsnorm(const Tensor& x, const Tensor& weight, float eps, Tensor& out, ThreadPool& pool);
void add_rmsnorm(const Tensor& x, Tensor& residual, const Tensor& weight, float eps, Tensor& out, ThreadPool& pool);
void linear(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& out, ThreadPool& pool);
void rope(Tensor& x, const Tensor& positions, const RopeParams& params, ThreadPool& pool);
void kv_store(const Tensor& k, const Tensor& v, KvLayer& cache, const Tensor& slots);
void attention(const Tensor& q, const KvLayer& cache, const BatchIndex& batch, const AttentionParams& params,
               Tensor& out, ThreadPool& pool);
void glu(const Tensor& gate, const Tensor& up, const GluParams& params, Tensor& out, ThreadPool& pool);
void softmax(const Tensor& x, Tensor& out);
void add(const Tensor& a, const Tensor& b, Tensor& out);
void scale(const Tensor& x, float factor, Tensor& out);
void softcap(const Tensor& x, float cap, Tensor& out);
void moe_route(const Tensor& logits, const MoeRouteParams& params, Tensor& ids, Tensor& weights);
void argmax(const Tensor& x, Tensor& out);

// Reusable buffers of the MoE op (grown on first use, then reused for every step).
struct MoeScratch {
  std::vector<int32_t> rows;         // (token, choice) pairs routed to the current expert
  std::vector<float> x, gate, up, y; // gathered inputs, expert activations, expert outputs
};
void moe_ffn(const Tensor& x, const ExpertWeights& experts, const Tensor& ids, const Tensor& weights,
             const GluParams& act, Tensor& out, MoeScratch& scratch, ThreadPool& pool);

// Runs fn over [0, n) split on the pool, or on the calling thread when the whole job
// (n items of about `cost` operations each) is too small to repay waking the workers —
// the common case in decode on small models.
inline void parallel_items(ThreadPool& pool, int64_t n, int64_t cost,
                           const std::function<void(int64_t begin, int64_t end)>& fn) {
  constexpr int64_t kMinWorkPerThread = 16384;
  cost = std::max<int64_t>(cost, 1);
  if (pool.size() == 1 || n * cost < 2 * kMinWorkPerThread) {
    if (n > 0) fn(0, n);
    return;
  }
  pool.parallel_for(n, std::max<int64_t>(1, kMinWorkPerThread / cost), fn);
}

// Checks shared by the ops: an f32 activation, densely packed rows.
void require_f32_rows(const Tensor& t, const char* op, const char* what);

}  // namespace kiln::cpu
