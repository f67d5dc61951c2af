#include "runtime/kv_cache.h"

#include <algorithm>

namespace kiln {

KvCache::KvCache(Backend& backend, const KvCacheConfig& c) : config_(c) {
  KILN_CHECK(c.n_layer > 0 && c.n_head_kv > 0 && c.head_dim_k > 0 && c.head_dim_v > 0,
             "kv cache: {} layers, {} kv heads of {}/{} dims", c.n_layer, c.n_head_kv, c.head_dim_k, c.head_dim_v);
  KILN_CHECK(c.n_ctx > 0 && c.max_seqs > 0 && c.block_size > 0, "kv cache: context {}, {} sequences, blocks of {}",
             c.n_ctx, c.max_seqs, c.block_size);
  KILN_CHECK(c.dtype == GgmlType::F32 || c.dtype == GgmlType::F16,
             "kv cache: {} entries are not supported (f32 or f16)", type_name(c.dtype));
  KILN_CHECK(c.layer_has_kv.empty() || c.layer_has_kv.size() == size_t(c.n_layer),
             "kv cache: layer_has_kv lists {} layers of {}", c.layer_has_kv.size(), c.n_layer);
  max_blocks_per_seq_ = (c.n_ctx + c.block_size - 1) / c.block_size;
  const int64_t n_blocks = int64_t(max_blocks_per_seq_) * c.max_seqs;
  const int64_t n_slots = n_blocks * c.block_size;
  const int64_t k_width = int64_t(c.n_head_kv) * c.head_dim_k, v_width = int64_t(c.n_head_kv) * c.head_dim_v;
  const size_t element = traits(c.dtype).type_size;

  layers_.resize(size_t(c.n_layer));
  for (int il = 0; il < c.n_layer; ++il) {
    if (!c.layer_has_kv.empty() && !c.layer_has_kv[size_t(il)]) continue;
    buffers_.push_back(backend.allocate(size_t(k_width * n_slots) * element));
    layers_[size_t(il)].k = buffers_.back()->view(c.dtype, {k_width, n_slots}, 0, "cache_k");
    buffers_.push_back(backend.allocate(size_t(v_width * n_slots) * element));
    layers_[size_t(il)].v = buffers_.back()->view(c.dtype, {v_width, n_slots}, 0, "cache_v");
    layers_[size_t(il)].block_size = c.block_size;
  }
  seqs_.resize(size_t(c.max_seqs));
  // Hand out low block numbers first (pop from the back).
  for (int64_t b = n_blocks - 1; b >= 0; --b) free_blocks_.push_back(int32_t(b));
  host_tables_.assign(size_t(n_blocks), 0);
  tables_buffer_ = backend.allocate(host_tables_.size() * sizeof(int32_t));
  device_tables_ =
      tables_buffer_->view(GgmlType::I32, {max_blocks_per_seq_, c.max_seqs}, 0, "block_tables");
  if (!c.recurrent.empty()) {
    RecurrentStateConfig rc = c.recurrent;
    rc.max_seqs = c.max_seqs;
    recurrent_ = std::make_unique<RecurrentState>(backend, rc);
  }
}

RecurrentLayer KvCache::recurrent_layer(int il) const {
  KILN_CHECK(recurrent_, "kv cache: layer {}: the model has no recurrent layers", il);
  return recurrent_->layer(il);
}

void KvCache::check_seq(int seq, const char* what) const {
  KILN_CHECK(seq >= 0 && seq < config_.max_seqs && seqs_[size_t(seq)].active,
             "kv cache {}: sequence {} is not active ({} sequences)", what, seq, config_.max_seqs);
}

int KvCache::add_sequence() {
  for (size_t s = 0; s < seqs_.size(); ++s) {
    if (seqs_[s].active) continue;
    seqs_[s] = Sequence{true, 0, {}};
    return int(s);
  }
  fail("kv cache: all {} sequences are in use", config_.max_seqs);
}

void KvCache::remove_sequence(int seq) {
  check_seq(seq, "remove_sequence");
  truncate(seq, 0);
  seqs_[size_t(seq)].active = false;
}

bool KvCache::has_sequence(int seq) const {
  return seq >= 0 && seq < config_.max_seqs && seqs_[size_t(seq)].active;
}

int64_t KvCache::length(int seq) const {
  check_seq(seq, "length");
  return seqs_[size_t(seq)].length;
}

void KvCache::reserve(int seq, int64_t new_length) {
  check_seq(seq, "reserve");
  KILN_CHECK(new_length <= config_.n_ctx, "kv cache: sequence {} would hold {} tokens, the context is {}", seq,
             new_length, config_.n_ctx);
  Sequence& s = seqs_[size_t(seq)];
  const size_t blocks_needed = size_t((new_length + config_.block_size - 1) / config_.block_size);
  while (s.blocks.size() < blocks_needed) {
    KILN_CHECK(!free_blocks_.empty(), "kv cache: out of blocks for sequence {}", seq);
    const int32_t b = free_blocks_.back();
    free_blocks_.pop_back();
    host_tables_[size_t(seq) * size_t(max_blocks_per_seq_) + s.blocks.size()] = b;
    s.blocks.push_back(b);
    tables_changed_ = true;
  }
  s.length = std::max(s.length, new_length);
}

void KvCache::truncate(int seq, int64_t new_length) {
  check_seq(seq, "truncate");
  Sequence& s = seqs_[size_t(seq)];
  KILN_CHECK(new_length >= 0, "kv cache: truncate sequence {} to {}", seq, new_length);
  const size_t blocks_kept = size_t((new_length + config_.block_size - 1) / config_.block_size);
  while (s.blocks.size() > blocks_kept) {
    free_blocks_.push_back(s.blocks.back());
    s.blocks.pop_back();
  }
  s.length = std::min(s.length, new_length);
}

int32_t KvCache::slot(int seq, int64_t pos) const {
  check_seq(seq, "slot");
  const Sequence& s = seqs_[size_t(seq)];
  KILN_CHECK(pos >= 0 && size_t(pos / config_.block_size) < s.blocks.size(),
             "kv cache: position {} of sequence {} is not reserved", pos, seq);
  return s.blocks[size_t(pos / config_.block_size)] * config_.block_size + int32_t(pos % config_.block_size);
}

KvLayer KvCache::layer(int il) const {
  KILN_CHECK(il >= 0 && il < config_.n_layer && !layers_[size_t(il)].k.empty(), "kv cache: layer {} has no KV",
             il);
  return layers_[size_t(il)];
}

void KvCache::sync(Backend& backend) {
  // Most decode steps take no new block: then the device copy is already right, and skipping
  // the upload saves a copy operation between two steps.
  if (!tables_changed_) return;
  backend.upload(host_tables_.data(), device_tables_, host_tables_.size() * sizeof(int32_t));
  tables_changed_ = false;
}

}  // namespace kiln
