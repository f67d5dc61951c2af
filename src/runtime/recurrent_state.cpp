#include "runtime/recurrent_state.h"

namespace kiln {

bool RecurrentStateConfig::empty() const {
  for (bool b : layer_has_state)
    if (b) return false;
  return true;
}

RecurrentState::RecurrentState(Backend& backend, const RecurrentStateConfig& c) : config_(c) {
  KILN_CHECK(c.conv_channels > 0 && c.conv_kernel >= 2 && c.n_v_heads > 0 && c.head_dim_k > 0 && c.head_dim_v > 0 &&
                 c.max_seqs > 0,
             "recurrent state: {} conv channels of kernel {}, {} value heads of {} x {}, {} sequences",
             c.conv_channels, c.conv_kernel, c.n_v_heads, c.head_dim_k, c.head_dim_v, c.max_seqs);
  layers_.resize(c.layer_has_state.size());
  for (size_t il = 0; il < c.layer_has_state.size(); ++il) {
    if (!c.layer_has_state[il]) continue;
    const int64_t taps = c.conv_kernel - 1;
    buffers_.push_back(backend.allocate(size_t(taps * c.conv_channels * c.max_seqs) * sizeof(float)));
    layers_[il].conv = buffers_.back()->view(GgmlType::F32, {taps, c.conv_channels, c.max_seqs}, 0, "conv_state");
    buffers_.push_back(
        backend.allocate(size_t(int64_t(c.head_dim_v) * c.head_dim_k * c.n_v_heads * c.max_seqs) * sizeof(float)));
    layers_[il].delta = buffers_.back()->view(GgmlType::F32, {c.head_dim_v, c.head_dim_k, c.n_v_heads, c.max_seqs},
                                              0, "delta_state");
  }
}

RecurrentLayer RecurrentState::layer(int il) const {
  KILN_CHECK(il >= 0 && size_t(il) < layers_.size() && !layers_[size_t(il)].conv.empty(),
             "recurrent state: layer {} has no recurrent state", il);
  return layers_[size_t(il)];
}

size_t RecurrentState::bytes() const {
  size_t total = 0;
  for (const auto& b : buffers_) total += b->size();
  return total;
}

}  // namespace kiln
