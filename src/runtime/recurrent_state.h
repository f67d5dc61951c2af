#pragma once
// Per-sequence state of recurrent (linear-attention) layers, the counterpart of the KV
// cache for hybrid models: for each GatedDeltaNet layer, the rolling input window of its
// short convolution and the delta-rule matrix of every value head. Sized once, up front,
// for `max_seqs` sequences; row s of each tensor belongs to sequence s (the KV cache's
// sequence number). Nothing needs clearing between sequences: the ops start a sequence
// from zero state when they see its position 0 (backend/backend.h).
#include <memory>
#include <vector>

#include "backend/backend.h"

namespace kiln {

struct RecurrentStateConfig {
  std::vector<bool> layer_has_state;  // per layer; empty: no recurrent layers at all
  int conv_channels = 0, conv_kernel = 0;
  int n_v_heads = 0, head_dim_k = 0, head_dim_v = 0;
  int max_seqs = 1;

  bool empty() const;
};

// One layer's state tensors (views of buffers the RecurrentState owns).
struct RecurrentLayer {
  Tensor conv;   // f32 {conv_kernel - 1, conv_channels, max_seqs}
  Tensor delta;  // f32 {head_dim_v, head_dim_k, n_v_heads, max_seqs}
};

class RecurrentState {
 public:
  RecurrentState(Backend& backend, const RecurrentStateConfig& config);

  const RecurrentStateConfig& config() const { return config_; }
  // The state of layer `il` (throws for a layer without recurrent state).
  RecurrentLayer layer(int il) const;
  // Bytes held on the device.
  size_t bytes() const;

 private:
  RecurrentStateConfig config_;
  std::vector<std::unique_ptr<Buffer>> buffers_;
  std::vector<RecurrentLayer> layers_;
};

}  // namespace kiln
