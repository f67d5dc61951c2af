#include "model/model.h"

#include <algorithm>

#include "formats/gguf.h"

namespace kiln {

int64_t Batch::n_outputs() const {
  return std::count_if(want_logits.begin(), want_logits.end(), [](uint8_t w) { return w != 0; });
}

Tensor ScratchPool::get(Backend& backend, const std::string& name, GgmlType dtype, int64_t ne0, int64_t ne1) {
  const size_t need = *row_bytes(dtype, ne0) * size_t(std::max<int64_t>(ne1, 1));
  auto it = buffers_.find(name);
  if (it == buffers_.end() || it->second->size() < need) {
    auto buffer = backend.allocate(need);
    it = buffers_.insert_or_assign(name, std::move(buffer)).first;
  }
  return it->second->view(dtype, {ne0, ne1}, 0, it->first);
}

std::unique_ptr<Model> Model::load(const gguf::File& file, Backend& backend) {
  return load(GgufSource(file), backend);
}

std::unique_ptr<Model> Model::load(const ModelSource& source, Backend& backend) {
  std::unique_ptr<Model> m(new Model(backend));
  m->hp_ = HParams::from_source(source);
  m->arch_ = find_architecture(m->hp_.arch);
  if (!m->arch_) {
    std::string known;
    for (std::string_view n : architecture_names()) known += fmt::format("{}{}", known.empty() ? "" : ", ", n);
    fail("{}: architecture '{}' is not supported (known: {})", source.path(), m->hp_.arch, known);
  }
  if (m->arch_->configure) m->arch_->configure(m->hp_, source);
  m->weights_ = load_weights(source, backend, m->hp_, m->arch_->global_weights, m->arch_->layer_weights);
  KILN_CHECK(!m->weights_.tok_embd.empty() && m->hp_.n_vocab > 0, "{}: no token embedding", source.path());
  return m;
}

KvCacheConfig Model::cache_config(int n_ctx, int max_seqs, int block_size) const {
  KvCacheConfig c;
  c.n_layer = hp_.n_layer;
  c.n_head_kv = hp_.n_head_kv;
  c.head_dim_k = hp_.head_dim_k;
  c.head_dim_v = hp_.head_dim_v;
  c.n_ctx = n_ctx > 0 ? n_ctx : (hp_.n_ctx_train > 0 ? hp_.n_ctx_train : 4096);
  c.max_seqs = max_seqs;
  c.block_size = block_size;
  // Hybrid models: linear-attention layers keep recurrent state instead of keys and values.
  const HParams::LinearAttention& la = hp_.linear;
  if (!la.layer_is_recurrent.empty()) {
    c.layer_has_kv.resize(size_t(hp_.n_layer));
    for (int il = 0; il < hp_.n_layer; ++il) c.layer_has_kv[size_t(il)] = !la.layer_is_recurrent[size_t(il)];
    c.recurrent.layer_has_state = la.layer_is_recurrent;
    c.recurrent.conv_channels = 2 * la.n_k_heads * la.head_dim_k + la.n_v_heads * la.head_dim_v;
    c.recurrent.conv_kernel = la.conv_kernel;
    c.recurrent.n_v_heads = la.n_v_heads;
    c.recurrent.head_dim_k = la.head_dim_k;
    c.recurrent.head_dim_v = la.head_dim_v;
  }
  return c;
}

// The per-token indexes (positions, sequence rows, cache slots, output rows) go up as one
// copy into one buffer, each in a region of its own: on a GPU every copy is a separate
// operation on the stream, a few microseconds of idle device between two decode steps.
void Model::upload_index(ForwardPass& pass, const Batch& batch, int64_t n_out) {
  const int64_t n = pass.n_tokens;
  const int64_t region = (n + 63) / 64 * 64;  // keeps each region 256-byte aligned
  host_index_.assign(size_t(4 * region), 0);
  int32_t* host = host_index_.data();
  std::copy(batch.positions.begin(), batch.positions.end(), host);
  std::copy(batch.seq_ids.begin(), batch.seq_ids.end(), host + region);
  std::copy(host_slots_.begin(), host_slots_.end(), host + 2 * region);
  std::copy(host_rows_.begin(), host_rows_.end(), host + 3 * region);
  const Tensor all = pass.scratch("in_index", 4 * region, 1, GgmlType::I32);
  backend_.upload(host, all, size_t(3 * region + n_out) * sizeof(int32_t));
  auto view = [&](int k, int64_t count, const char* name) {
    return Tensor::contiguous(GgmlType::I32, {std::max<int64_t>(count, 1)}, all.as<int32_t>() + k * region,
                              all.device, name);
  };
  pass.index.positions = view(0, n, "in_positions");
  pass.index.seq_rows = view(1, n, "in_seq_rows");
  pass.index.slots = view(2, n, "in_slots");
  pass.output_rows = view(3, n_out, "in_output_rows");
}

std::vector<float> Model::forward(const Batch& batch, KvCache& cache) {
  std::vector<float> logits(size_t(batch.n_outputs()) * size_t(hp_.n_vocab));
  forward(batch, cache, logits.data());
  return logits;
}

ForwardPass Model::begin_pass(const Batch& batch, KvCache& cache, bool tokens_on_device) {
  const int64_t n = batch.size();
  KILN_CHECK(n > 0, "forward: empty batch");
  KILN_CHECK(batch.positions.size() == size_t(n) && batch.seq_ids.size() == size_t(n) &&
                 batch.want_logits.size() == size_t(n),
             "forward: batch has {} tokens but {} positions, {} sequence ids, {} logit flags", n,
             batch.positions.size(), batch.seq_ids.size(), batch.want_logits.size());
  // Make room in the cache and find each token's slot (host work, before any device op).
  host_rows_.clear();
  host_slots_.resize(size_t(n));
  int32_t max_position = 0;
  bool in_order = true;
  for (int64_t t = 0; t < n; ++t) {
    const int seq = batch.seq_ids[size_t(t)];
    const int32_t pos = batch.positions[size_t(t)];
    const int32_t token = batch.tokens[size_t(t)];
    KILN_CHECK(tokens_on_device || (token >= 0 && token < hp_.n_vocab),
               "forward: token {} at batch row {} outside the vocabulary of {}", token, t, hp_.n_vocab);
    KILN_CHECK(cache.has_sequence(seq), "forward: batch row {} names sequence {}, which the cache does not hold", t,
               seq);
    KILN_CHECK(pos >= 0, "forward: negative position {} at batch row {}", pos, t);
    cache.reserve(seq, int64_t(pos) + 1);
    host_slots_[size_t(t)] = cache.slot(seq, pos);
    max_position = std::max(max_position, pos);
    in_order = in_order && seq == batch.seq_ids[0] && pos == batch.positions[0] + t;
    if (batch.want_logits[size_t(t)]) host_rows_.push_back(int32_t(t));
  }
  const int64_t n_out = int64_t(host_rows_.size());

  ForwardPass pass{.backend = backend_, .hp = hp_, .w = weights_, .cache = cache, .scratch_pool = scratch_,
                   .hook = hook_, .n_tokens = n, .n_outputs = n_out, .tokens = {}, .output_rows = {}, .index = {},
                   .logits = {}};
  // Tokens on the device: the previous greedy step left them in in_tokens.
  pass.tokens = pass.scratch("in_tokens", n, 1, GgmlType::I32).reshape({n});
  if (!tokens_on_device) backend_.upload(batch.tokens.data(), pass.tokens, size_t(n) * sizeof(int32_t));
  upload_index(pass, batch, n_out);
  cache.sync(backend_);
  pass.index.block_tables = cache.block_tables();
  pass.index.max_position = max_position;
  pass.index.one_sequence_in_order = in_order;
  pass.index.first_position = batch.positions[0];
  // With no logits wanted the pass still runs: it fills the cache (the head is skipped).
  pass.logits = pass.scratch("logits", hp_.n_vocab, std::max<int64_t>(n_out, 1)).rows_view(0, n_out);
  return pass;
}

void Model::forward(const Batch& batch, KvCache& cache, float* logits) {
  KILN_CHECK(pending_greedy_.empty(), "forward: {} greedy steps are still pending", pending_greedy_.size());
  ForwardPass pass = begin_pass(batch, cache, /*tokens_on_device=*/false);
  arch_->forward(pass);
  backend_.synchronize();
  if (pass.n_outputs > 0)
    backend_.download(pass.logits, logits, size_t(pass.n_outputs) * size_t(hp_.n_vocab) * sizeof(float));
}

void Model::forward_greedy(const Batch& batch, KvCache& cache, bool feed_back) {
  KILN_CHECK(pending_greedy_.size() < size_t(Backend::kMaxPendingDownloads),
             "forward_greedy: {} steps pending; take_greedy() the oldest first", pending_greedy_.size());
  KILN_CHECK(!feed_back || int64_t(batch.size()) == last_greedy_outputs_,
             "forward_greedy: {} tokens fed back, but the previous step produced {}", batch.size(),
             last_greedy_outputs_);
  ForwardPass pass = begin_pass(batch, cache, feed_back);
  KILN_CHECK(pass.n_outputs > 0, "forward_greedy: the batch wants no logits");
  KILN_CHECK(size_t(pass.n_outputs) * sizeof(int32_t) <= Backend::kMaxAsyncDownloadBytes,
             "forward_greedy: {} outputs in one step (at most {})", pass.n_outputs,
             Backend::kMaxAsyncDownloadBytes / sizeof(int32_t));
  arch_->forward(pass);
  // The argmax overwrites the start of in_tokens, after this pass has read it: the ops run
  // in order, and the next step reads its tokens from there.
  Tensor next = pass.scratch("in_tokens", pass.n_outputs, 1, GgmlType::I32).reshape({pass.n_outputs});
  backend_.argmax(pass.logits, next);
  pending_greedy_.push_back({backend_.download_async(next, size_t(pass.n_outputs) * sizeof(int32_t)),
                             pass.n_outputs});
  last_greedy_outputs_ = pass.n_outputs;
}

std::vector<int32_t> Model::take_greedy() {
  KILN_CHECK(!pending_greedy_.empty(), "take_greedy: no greedy step is pending");
  const PendingGreedy step = pending_greedy_.front();
  pending_greedy_.pop_front();
  std::vector<int32_t> tokens(size_t(step.n_outputs));
  backend_.finish_download(step.ticket, tokens.data(), tokens.size() * sizeof(int32_t));
  return tokens;
}

}  // namespace kiln
