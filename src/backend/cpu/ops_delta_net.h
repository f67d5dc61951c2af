#pragma once
// CPU implementations of the GatedDeltaNet ops (contracts in backend/backend.h): the causal
// short convolution, the gated delta rule in its recurrent and chunked forms, the gated
// RMSNorm and the sigmoid gate. They are the reference other backends are checked against.
#include <vector>

#include "backend/backend.h"
#include "core/thread_pool.h"

namespace kiln::cpu {

void causal_conv_silu(const Tensor& x, const Tensor& weight, Tensor& state, const BatchIndex& batch, Tensor& out,
                      ThreadPool& pool);
void gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& alpha, const Tensor& beta,
                      const Tensor& ssm_a, const Tensor& dt_bias, Tensor& state, const BatchIndex& batch,
                      const DeltaRuleParams& params, Tensor& out, ThreadPool& pool);
void rmsnorm_gated(const Tensor& x, const Tensor& z, const Tensor& weight, float eps, Tensor& out, ThreadPool& pool);
void sigmoid_mul(const Tensor& x, const Tensor& gate, Tensor& out);

// A run of consecutive tokens of one sequence within a batch: the unit the recurrent ops
// advance a sequence's state by.
struct SequenceRun {
  int64_t first_token = 0, n_tokens = 0;
  int32_t seq_row = 0;
  bool starts_sequence = false;  // the first token is at position 0: the state starts at zero
};
// Splits the batch into runs (a run ends where the sequence changes or positions skip).
// Checks every sequence row against `n_state_rows`.
std::vector<SequenceRun> sequence_runs(const BatchIndex& batch, int64_t n_tokens, int64_t n_state_rows,
                                       const char* op);

}  // namespace kiln::cpu
