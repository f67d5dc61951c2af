#pragma once
// A paged KV cache: every layer's keys and values live in fixed-size blocks of
// `block_size` token slots; each sequence owns a list of blocks (its block table), taken
// from a shared free list as it grows. Slot s of layer l holds one token's K (and V) for
// all KV heads: row s of KvLayer::k, in f32 or f16 (KvCacheConfig::dtype). Sized once, up front, for `max_seqs` sequences of
// up to `n_ctx` tokens; nothing is allocated while generating.
//
// The host keeps the authoritative block tables; sync() uploads them to the device
// before a forward pass (the attention op reads them there).
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "runtime/recurrent_state.h"

namespace kiln {

struct KvCacheConfig {
  int n_layer = 0;
  std::vector<bool> layer_has_kv;  // empty: every layer; false for layers without attention
  int n_head_kv = 0;
  int head_dim_k = 0, head_dim_v = 0;
  int n_ctx = 0;                   // longest sequence, in tokens
  int max_seqs = 1;
  int block_size = 16;
  // F32, or F16 (half the memory; what llama.cpp stores by default). The library's default
  // is f32, the exact choice; the command line defaults to f16 (kiln run --cache-type).
  GgmlType dtype = GgmlType::F32;
  // Hybrid models: state of the linear-attention layers (max_seqs is taken from above).
  RecurrentStateConfig recurrent;
};

class KvCache {
 public:
  KvCache(Backend& backend, const KvCacheConfig& config);

  const KvCacheConfig& config() const { return config_; }
  int block_size() const { return config_.block_size; }
  int max_blocks_per_seq() const { return max_blocks_per_seq_; }

  // Sequences are numbered 0 .. max_seqs-1; a new one starts empty.
  int add_sequence();
  void remove_sequence(int seq);
  bool has_sequence(int seq) const;
  // Tokens stored for the sequence (one past its highest position).
  int64_t length(int seq) const;
  // Makes positions [0, new_length) of the sequence addressable, taking blocks as needed.
  void reserve(int seq, int64_t new_length);
  // Forgets positions >= new_length, returning whole blocks no longer used.
  void truncate(int seq, int64_t new_length);
  // The slot holding position `pos` of the sequence (reserved before).
  int32_t slot(int seq, int64_t pos) const;

  // The cache tensors of layer `il` (throws for a layer without KV).
  KvLayer layer(int il) const;
  // The recurrent state of linear-attention layer `il` (throws when there is none).
  RecurrentLayer recurrent_layer(int il) const;
  // Whether the model has recurrent layers: their state cannot be cut back by truncate().
  bool has_recurrent_state() const { return recurrent_ != nullptr; }
  // Device copy of the block tables: I32 {max_blocks_per_seq, max_seqs}, row = sequence.
  const Tensor& block_tables() const { return device_tables_; }
  // Uploads the block tables if a block was taken since the last sync.
  void sync(Backend& backend);

 private:
  struct Sequence {
    bool active = false;
    int64_t length = 0;
    std::vector<int32_t> blocks;
  };
  void check_seq(int seq, const char* what) const;

  KvCacheConfig config_;
  int max_blocks_per_seq_ = 0;
  std::vector<std::unique_ptr<Buffer>> buffers_;  // per layer: K then V
  std::vector<KvLayer> layers_;                    // empty tensors for layers without KV
  std::vector<Sequence> seqs_;
  std::vector<int32_t> free_blocks_;
  std::vector<int32_t> host_tables_;
  bool tables_changed_ = true;  // the device copy starts uninitialized
  std::unique_ptr<Buffer> tables_buffer_;
  Tensor device_tables_;
  std::unique_ptr<RecurrentState> recurrent_;  // hybrid models only
};

}  // namespace kiln
