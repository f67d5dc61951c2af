#include "runtime/memory_estimate.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace kiln {

namespace {

std::string gib(uint64_t bytes) { return fmt::format("{:.2f} GiB", double(bytes) / double(1ull << 30)); }

}  // namespace

MemoryEstimate estimate_memory(const HParams& hp, int n_ctx, int max_batch, GgmlType cache_type, int block_size) {
  MemoryEstimate e;
  const uint64_t slots = uint64_t((n_ctx + block_size - 1) / block_size) * uint64_t(block_size);
  const uint64_t kv_width = uint64_t(hp.n_head_kv) * uint64_t(hp.head_dim_k + hp.head_dim_v);
  e.kv_cache_bytes = uint64_t(hp.n_layer) * slots * kv_width * traits(cache_type).type_size;

  // Per token of a batch: the residual stream and a few normed copies, q/k/v and the
  // attention output, the FFN's gate and up (or the routed experts' for each token), and
  // the attention scores of one row per head. Doubled for the buffers we do not count.
  const uint64_t batch = uint64_t(std::max(1, std::min(max_batch, n_ctx)));
  const uint64_t ff = uint64_t(std::max(hp.n_ff, hp.n_ff_expert * std::max(1, hp.n_expert_used)));
  const uint64_t per_token = 4ull * uint64_t(hp.n_embd) + uint64_t(hp.n_head) * uint64_t(hp.head_dim_k + hp.head_dim_v) +
                             kv_width + 3 * ff + uint64_t(hp.n_head) * uint64_t(n_ctx) + uint64_t(hp.n_expert);
  e.scratch_bytes = 2 * batch * per_token * sizeof(float) + 2ull * uint64_t(hp.n_vocab) * sizeof(float) + (64ull << 20);
  return e;
}

std::optional<uint64_t> available_memory() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream fields(line.substr(13));
    uint64_t kib = 0;
    if (fields >> kib) return kib * 1024;
  }
  return std::nullopt;
}

void check_memory_fits(const MemoryEstimate& estimate, int n_ctx) {
  const std::optional<uint64_t> available = available_memory();
  if (!available) return;  // not Linux, or /proc hidden: nothing to judge by
  if (estimate.total() <= *available) return;
  if (estimate.weight_copy_bytes > 0)
    fail("a context of {} tokens needs about {} (KV cache {} + scratch {} + weight copy {}) but only {} of memory is "
         "available; use a smaller context (-c) or read the weights from the file (--cpu-weights map)",
         n_ctx, gib(estimate.total()), gib(estimate.kv_cache_bytes), gib(estimate.scratch_bytes),
         gib(estimate.weight_copy_bytes), gib(*available));
  fail("a context of {} tokens needs about {} (KV cache {} + scratch {}) but only {} of memory is available; "
       "use a smaller context (-c)",
       n_ctx, gib(estimate.total()), gib(estimate.kv_cache_bytes), gib(estimate.scratch_bytes), gib(*available));
}

}  // namespace kiln
