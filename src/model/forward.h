#pragma once
// What an architecture's forward function works with: the batch, described on the device;
// the weights; the KV cache; named scratch buffers reused across steps; a debug hook.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "backend/backend.h"
#include "model/hparams.h"
#include "model/weights.h"
#include "runtime/kv_cache.h"

namespace kiln {

// Tokens to run in one pass: any mix of sequences (prefill chunks and decode steps).
// Token t is `tokens[t]` at `positions[t]` of sequence `seq_ids[t]`; logits are produced
// for the tokens whose `want_logits` is set, in batch order.
struct Batch {
  std::vector<int32_t> tokens, positions, seq_ids;
  std::vector<uint8_t> want_logits;

  void add(int32_t token, int32_t position, int32_t seq, bool logits) {
    tokens.push_back(token);
    positions.push_back(position);
    seq_ids.push_back(seq);
    want_logits.push_back(logits ? 1 : 0);
  }
  void clear() { tokens.clear(), positions.clear(), seq_ids.clear(), want_logits.clear(); }
  int64_t size() const { return int64_t(tokens.size()); }
  int64_t n_outputs() const;
};

// Called with every named intermediate (name, layer or -1, the device tensor). The tensor
// is only valid during the call; use Backend::download to read it.
using DebugHook = std::function<void(std::string_view name, int layer, const Tensor& t)>;

// Scratch buffers by name. A buffer is allocated the first time a name is asked for, and
// again only when a larger size is asked for, so steady-state steps allocate nothing.
class ScratchPool {
 public:
  Tensor get(Backend& backend, const std::string& name, GgmlType dtype, int64_t ne0, int64_t ne1);

 private:
  std::map<std::string, std::unique_ptr<Buffer>, std::less<>> buffers_;
};

struct ForwardPass {
  Backend& backend;
  const HParams& hp;
  const ModelWeights& w;
  KvCache& cache;
  ScratchPool& scratch_pool;
  const DebugHook& hook;

  int64_t n_tokens = 0;
  int64_t n_outputs = 0;
  Tensor tokens;       // I32 [T]
  Tensor output_rows;  // I32 [n_outputs]: batch rows whose logits are wanted (0..n-1 when n_outputs == n_tokens)
  BatchIndex index;    // positions, sequences, cache slots
  Tensor logits;       // f32 {n_vocab, n_outputs}: the architecture writes the result here

  // A scratch tensor {ne0, ne1} named `name` (reused across steps).
  Tensor scratch(const std::string& name, int64_t ne0, int64_t ne1, GgmlType dtype = GgmlType::F32) {
    return scratch_pool.get(backend, name, dtype, ne0, ne1);
  }
  // Reports a named intermediate to the debug hook, if one is set.
  void observe(const Tensor& t, std::string_view name, int layer = -1) const {
    if (hook) hook(name, layer, t);
  }
};

}  // namespace kiln
