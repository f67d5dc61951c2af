#pragma once
// A loaded model: hyper-parameters, weights on a backend, and its architecture's forward
// pass. One Model serves any number of sequences; their state lives in a KvCache.
//
//   auto file = gguf::File::open(path);
//   CpuBackend backend;
//   auto model = Model::load(*file, backend);
//   KvCache cache(backend, model->cache_config(/*n_ctx=*/512));
//   int seq = cache.add_sequence();
//   Batch batch;  for (...) batch.add(token, pos, seq, want_logits);
//   std::vector<float> logits = model->forward(batch, cache);   // [n_outputs][n_vocab]
#include <deque>
#include <memory>
#include <vector>

#include "model/architecture.h"

namespace kiln {

class Model {
 public:
  // Reads the hyper-parameters and weights; throws for an unknown architecture or a
  // missing / unused tensor. The file must outlive the model (weights may be views of it).
  static std::unique_ptr<Model> load(const gguf::File& file, Backend& backend);
  // The same from any source (a GGUF file or a Hugging Face checkpoint, model/source.h);
  // the source must outlive the model.
  static std::unique_ptr<Model> load(const ModelSource& source, Backend& backend);

  const HParams& hparams() const { return hp_; }
  const ModelWeights& weights() const { return weights_; }
  const Architecture& architecture() const { return *arch_; }
  Backend& backend() const { return backend_; }

  // A cache for up to `max_seqs` sequences of `n_ctx` tokens (0: the training context).
  KvCacheConfig cache_config(int n_ctx = 0, int max_seqs = 1, int block_size = 16) const;

  // Runs the batch: stores its keys/values in the cache and writes the logits of the
  // tokens that want them, in batch order, to `logits` (n_outputs x n_vocab floats).
  void forward(const Batch& batch, KvCache& cache, float* logits);
  std::vector<float> forward(const Batch& batch, KvCache& cache);

  // Greedy decoding that stays on the device. Runs the batch like forward(), takes the
  // argmax of each output row on the device and keeps it there as the next step's input;
  // returns without waiting for the device. With `feed_back`, the batch's token values are
  // ignored: its tokens are the previous step's argmaxes (the batch then has exactly as many
  // tokens as that step had outputs). So the host can queue step n+1 while the device still
  // runs step n. take_greedy() waits for the oldest queued step and returns its tokens.
  // At most Backend::kMaxPendingDownloads steps may be waiting; forward() needs none pending.
  void forward_greedy(const Batch& batch, KvCache& cache, bool feed_back);
  std::vector<int32_t> take_greedy();
  size_t pending_greedy() const { return pending_greedy_.size(); }

  // Sees every named intermediate of later passes (nullptr to stop).
  void set_debug_hook(DebugHook hook) { hook_ = std::move(hook); }

 private:
  Model(Backend& backend) : backend_(backend) {}
  // Host work of a pass (slots, uploads of the batch description) up to the architecture.
  ForwardPass begin_pass(const Batch& batch, KvCache& cache, bool tokens_on_device);
  void upload_index(ForwardPass& pass, const Batch& batch, int64_t n_out);

  Backend& backend_;
  const Architecture* arch_ = nullptr;
  HParams hp_;
  ModelWeights weights_;
  ScratchPool scratch_;
  DebugHook hook_;
  // Host staging of the batch description, reused across calls.
  std::vector<int32_t> host_rows_, host_slots_, host_index_;
  struct PendingGreedy {
    uint64_t ticket = 0;
    int64_t n_outputs = 0;
  };
  std::deque<PendingGreedy> pending_greedy_;
  int64_t last_greedy_outputs_ = 0;
};

}  // namespace kiln
