#pragma once
// How much memory a context will take, asked before allocating it, so that a context too
// large for the machine is refused with a message instead of ending in the OOM killer.
#include <cstdint>
#include <optional>
#include <string>

#include "model/hparams.h"
#include "quant/types.h"

namespace kiln {

struct MemoryEstimate {
  uint64_t kv_cache_bytes = 0;  // keys and values of every attention layer, of the cache's type
  uint64_t scratch_bytes = 0;   // activations of a batch of `max_batch` tokens, logits
  // Weights copied out of the file at load (the CPU's `--cpu-weights copy`), set by the
  // caller; 0 when weights are read from the mapped file (resident only as they are touched,
  // and reclaimable page cache).
  uint64_t weight_copy_bytes = 0;
  uint64_t total() const { return kv_cache_bytes + scratch_bytes + weight_copy_bytes; }
};

// An upper estimate for one sequence of `n_ctx` tokens run in batches of `max_batch`, with
// a KV cache of `cache_type` entries (F32: 4 bytes, F16: 2).
MemoryEstimate estimate_memory(const HParams& hp, int n_ctx, int max_batch, GgmlType cache_type = GgmlType::F32,
                               int block_size = 16);

// /proc/meminfo's MemAvailable in bytes, or nullopt when it cannot be read.
std::optional<uint64_t> available_memory();

// Throws a kiln::Error explaining the shortfall when `estimate` exceeds the available memory.
void check_memory_fits(const MemoryEstimate& estimate, int n_ctx);

}  // namespace kiln
