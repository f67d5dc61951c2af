#pragma once
// The CPU backend: host memory, weights as views into the mapped file (or, when asked,
// copies in huge-page memory: backend/cpu/weight_arena.h), ops from backend/cpu/ops.h
// spread over a thread pool.
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/weight_arena.h"
#include "core/thread_pool.h"

namespace kiln {

class CpuBackend final : public Backend {
 public:
  // n_threads <= 0: one per core this process may use. copy_weights: weight() copies each
  // tensor of at least kCopyMinBytes into a WeightArena (2 MiB pages) instead of returning
  // a view of the mapped file: faster decode, the weights' size in extra resident memory.
  explicit CpuBackend(int n_threads = 0, bool copy_weights = false);
  static constexpr size_t kCopyMinBytes = size_t(64) << 10;

  std::string_view name() const override { return "cpu"; }
  Device device() const override { return Device::Cpu; }
  std::optional<std::string> supports(Op op, std::span<const GgmlType> types) const override;
  ThreadPool& pool() { return pool_; }
  const cpu::WeightArena& weight_copies() const { return weight_copies_; }

  std::unique_ptr<Buffer> allocate(size_t bytes) override;
  Tensor weight(const gguf::TensorInfo& info) override;
  Tensor owned_weight(const Tensor& host_source, std::string_view name) override;
  void upload(const void* host, const Tensor& dst, size_t bytes) override;
  void download(const Tensor& src, void* host, size_t bytes) override;

  void get_rows(const Tensor& table, const Tensor& ids, Tensor& out) override;
  void rmsnorm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) override;
  void add_rmsnorm(const Tensor& x, Tensor& residual, const Tensor& weight, float eps, Tensor& out) override;
  void matmul(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& out) override;
  void rope(Tensor& x, const Tensor& positions, const RopeParams& params) override;
  void kv_store(const Tensor& k, const Tensor& v, KvLayer& cache, const Tensor& slots) override;
  void attention(const Tensor& q, const KvLayer& cache, const BatchIndex& batch, const AttentionParams& params,
                 Tensor& out) override;
  void glu(const Tensor& gate, const Tensor& up, const GluParams& params, Tensor& out) override;
  void softmax(const Tensor& x, Tensor& out) override;
  void add(const Tensor& a, const Tensor& b, Tensor& out) override;
  void scale(const Tensor& x, float factor, Tensor& out) override;
  void softcap(const Tensor& x, float cap, Tensor& out) override;
  void moe_route(const Tensor& logits, const MoeRouteParams& params, Tensor& ids, Tensor& weights) override;
  void moe_ffn(const Tensor& x, const ExpertWeights& experts, const Tensor& ids, const Tensor& weights,
               const GluParams& act, Tensor& out) override;
  void argmax(const Tensor& x, Tensor& out) override;
  // GatedDeltaNet ops: backend/cpu/ops_conv.cpp, backend/cpu/ops_delta_net.cpp
  void causal_conv_silu(const Tensor& x, const Tensor& weight, Tensor& state, const BatchIndex& batch,
                        Tensor& out) override;
  void gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& alpha, const Tensor& beta,
                        const Tensor& ssm_a, const Tensor& dt_bias, Tensor& state, const BatchIndex& batch,
                        const DeltaRuleParams& params, Tensor& out) override;
  void rmsnorm_gated(const Tensor& x, const Tensor& z, const Tensor& weight, float eps, Tensor& out) override;
  void sigmoid_mul(const Tensor& x, const Tensor& gate, Tensor& out) override;

 private:
  ThreadPool pool_;
  bool copy_weights_ = false;
  cpu::WeightArena weight_copies_;
  std::vector<std::unique_ptr<Buffer>> owned_;  // weights derived at load time
  cpu::MoeScratch moe_scratch_;
};

}  // namespace kiln
