#include "quant/fast_paths.h"

#include "core/cpu_features.h"

namespace kiln {

DequantizeFn fast_dequantizer(Fast kind) {
  (void)kind;
  return nullptr;  // SIMD paths are wired in once they exist
}

}  // namespace kiln
