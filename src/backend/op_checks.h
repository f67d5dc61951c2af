#pragma once
// Shape checks of op arguments that do not depend on the device: every backend calls the
// same check, so a mismatch reads the same whichever backend finds it.
#include <string_view>

#include "backend/backend.h"

namespace kiln {

// Heads divide evenly, q/out rows are n_head heads wide, cache rows n_head_kv heads wide,
// the batch index describes q's tokens, and there is one sink per head when sinks are given.
// `op` prefixes the error ("attention", "cuda attention").
void check_attention_shapes(std::string_view op, const Tensor& q, const KvLayer& cache, const BatchIndex& batch,
                            const AttentionParams& p, const Tensor& out);

}  // namespace kiln
