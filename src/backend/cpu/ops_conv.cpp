// The causal short convolution of GatedDeltaNet layers: a depthwise 1-D convolution of
// kernel K along each sequence, followed by SiLU. Each channel keeps its last K-1 inputs
// per sequence in `state`, so a decode step convolves over inputs of earlier calls.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/ops_delta_net.h"

namespace kiln::cpu {

void causal_conv_silu(const Tensor& x, const Tensor& weight, Tensor& state, const BatchIndex& batch, Tensor& out,
                      ThreadPool& pool) {
  require_f32_rows(x, "causal_conv_silu", "x");
  require_f32_rows(weight, "causal_conv_silu", "weight");
  require_f32_rows(state, "causal_conv_silu", "state");
  require_f32_rows(out, "causal_conv_silu", "out");
  const int64_t channels = x.ne[0], n_tokens = x.ne[1];
  const int64_t kernel = weight.ne[0];
  KILN_CHECK(kernel >= 2 && weight.ne[1] == channels && weight.is_contiguous(),
             "causal_conv_silu: weight {} {} is not a contiguous {{K >= 2, {}}}", weight.name, weight.describe(),
             channels);
  KILN_CHECK(x.ne[2] == 1 && x.ne[3] == 1 && out.ne[0] == channels && out.ne[1] == n_tokens && out.ne[2] == 1,
             "causal_conv_silu: x {} and out {} must both be {{{}, T}}", x.describe(), out.describe(), channels);
  KILN_CHECK(state.ne[0] == kernel - 1 && state.ne[1] == channels && state.ne[3] == 1 && state.is_contiguous(),
             "causal_conv_silu: state {} {} is not a contiguous {{{}, {}, n_seqs}}", state.name, state.describe(),
             kernel - 1, channels);
  // Validates the sequence rows (the runs themselves are not needed: each channel walks the
  // batch token by token).
  sequence_runs(batch, n_tokens, state.ne[2], "causal_conv_silu");
  const int32_t* pos = batch.positions.as<int32_t>();
  const int32_t* seq = batch.seq_rows.as<int32_t>();
  const float* w = weight.as<float>();
  const int64_t taps = kernel - 1;

  pool.parallel_for(channels, 64, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      const float* wc = w + c * kernel;
      for (int64_t t = 0; t < n_tokens; ++t) {
        float* window = reinterpret_cast<float*>(state.row_ptr(c, seq[t]));  // last K-1 inputs, oldest first
        if (pos[t] == 0) std::fill(window, window + taps, 0.0f);
        const float xt = x.f32_row(t)[c];
        double acc = double(wc[taps]) * xt;
        for (int64_t j = 0; j < taps; ++j) acc += double(wc[j]) * window[j];
        const float y = float(acc);
        out.f32_row(t)[c] = y / (1.0f + std::exp(-y));
        std::copy(window + 1, window + taps, window);
        window[taps - 1] = xt;
      }
    }
  });
}

}  // namespace kiln::cpu

namespace kiln {

void CpuBackend::causal_conv_silu(const Tensor& x, const Tensor& weight, Tensor& state, const BatchIndex& batch,
                                  Tensor& out) {
  cpu::causal_conv_silu(x, weight, state, batch, out, pool());
}

}  // namespace kiln
