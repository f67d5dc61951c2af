#pragma once
// Shared by the model reference tests (tests/model, and usable by the device tests: header
// only, every run helper takes any Model and Backend): reading reference arrays, running a
// model over a token list, greedy decoding through the KV cache, error measures, and the
// checks of logits and continuations against another engine's.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "backend/cpu/cpu_backend.h"
#include "formats/gguf.h"
#include "model/model.h"
#include "model/source.h"

namespace kiln::testing {

// A path for a test's temporary GGUF file (tag and process id in its name), removed when the
// object goes.
struct TempGguf {
  std::string path;
  explicit TempGguf(const std::string& tag)
      : path((std::filesystem::temp_directory_path() / ("kiln_" + tag + "_" + std::to_string(::getpid()) + ".gguf"))
                 .string()) {}
  TempGguf(const TempGguf&) = delete;
  TempGguf& operator=(const TempGguf&) = delete;
  ~TempGguf() { std::filesystem::remove(path); }
};

inline std::vector<float> read_f32_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  in.seekg(0, std::ios::end);
  const auto bytes = size_t(in.tellg());
  in.seekg(0);
  std::vector<float> v(bytes / sizeof(float));
  in.read(reinterpret_cast<char*>(v.data()), std::streamsize(v.size() * sizeof(float)));
  return v;
}

inline nlohmann::json read_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

// ||a - b|| / ||b|| over n elements.
inline double relative_l2(const float* a, const float* b, int64_t n) {
  double diff = 0, ref = 0;
  for (int64_t i = 0; i < n; ++i) {
    diff += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    ref += double(b[i]) * b[i];
  }
  return std::sqrt(diff / std::max(ref, 1e-30));
}

inline int32_t argmax_row(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return int32_t(best);
}

// The reference tests name their KV cache's type: F32 where the reference is a float32
// engine (HF transformers), F16 where it is llama.cpp's default (see stories_test.cpp).
inline KvCacheConfig cache_config_of(const Model& model, int n_ctx, GgmlType cache_type) {
  KvCacheConfig c = model.cache_config(n_ctx);
  c.dtype = cache_type;
  return c;
}

// All positions' logits of `ids` run as one prefill batch of sequence 0, on any backend.
inline std::vector<float> prefill_all_logits(Model& model, Backend& backend, const std::vector<int32_t>& ids,
                                             int n_ctx = 128, GgmlType cache_type = GgmlType::F32) {
  KvCache cache(backend, cache_config_of(model, n_ctx, cache_type));
  const int seq = cache.add_sequence();
  Batch batch;
  for (size_t i = 0; i < ids.size(); ++i) batch.add(ids[i], int32_t(i), seq, true);
  return model.forward(batch, cache);
}

// Prefill the prompt, then decode n tokens one by one (argmax), through the cache; every
// step's logits are appended to `step_logits` when given.
inline std::vector<int32_t> greedy_decode(Model& model, Backend& backend, const std::vector<int32_t>& prompt, int n,
                                          int n_ctx = 256, std::vector<float>* step_logits = nullptr,
                                          GgmlType cache_type = GgmlType::F32) {
  KvCache cache(backend, cache_config_of(model, n_ctx, cache_type));
  const int seq = cache.add_sequence();
  Batch batch;
  for (size_t i = 0; i < prompt.size(); ++i) batch.add(prompt[i], int32_t(i), seq, i + 1 == prompt.size());
  std::vector<float> logits = model.forward(batch, cache);
  const int64_t vocab = model.hparams().n_vocab;
  std::vector<int32_t> out;
  int32_t pos = int32_t(prompt.size());
  for (int step = 0; step < n; ++step) {
    if (step_logits) step_logits->insert(step_logits->end(), logits.begin(), logits.end());
    out.push_back(argmax_row(logits.data(), vocab));
    if (step + 1 == n) break;
    batch.clear();
    batch.add(out.back(), pos++, seq, true);
    logits = model.forward(batch, cache);
  }
  return out;
}

// The same greedy decoding through Model::forward_greedy: each step's argmax is taken and
// fed back on the backend, and the host keeps one step queued ahead of the token it reads.
inline std::vector<int32_t> greedy_decode_on_device(Model& model, Backend& backend, const std::vector<int32_t>& prompt,
                                                    int n, int n_ctx = 256) {
  KvCache cache(backend, model.cache_config(n_ctx));
  const int seq = cache.add_sequence();
  Batch batch;
  for (size_t i = 0; i < prompt.size(); ++i) batch.add(prompt[i], int32_t(i), seq, i + 1 == prompt.size());
  model.forward_greedy(batch, cache, /*feed_back=*/false);
  std::vector<int32_t> out;
  for (int step = 1; step < n; ++step) {
    batch.clear();
    batch.add(/*token: fed back*/ -1, int32_t(prompt.size()) + step - 1, seq, true);
    model.forward_greedy(batch, cache, /*feed_back=*/true);
    if (model.pending_greedy() > 1) out.push_back(model.take_greedy().at(0));
  }
  while (model.pending_greedy() > 0) out.push_back(model.take_greedy().at(0));
  return out;
}

// A model on the CPU backend with its own cache: a GGUF file or a checkpoint directory.
// Its runs use a KV cache of `cache_type` (f32 unless the test says otherwise).
struct LoadedModel {
  std::unique_ptr<ModelSource> source;
  const gguf::File* file = nullptr;  // when the source is a GGUF file
  std::unique_ptr<CpuBackend> backend;
  std::unique_ptr<Model> model;
  GgmlType cache_type = GgmlType::F32;

  explicit LoadedModel(const std::filesystem::path& path, GgmlType cache = GgmlType::F32)
      : source(open_model_source(path.string())), file(source->gguf_file()), backend(std::make_unique<CpuBackend>()),
        model(Model::load(*source, *backend)), cache_type(cache) {}

  int vocab() const { return model->hparams().n_vocab; }

  std::vector<float> prefill_logits(const std::vector<int32_t>& ids, int n_ctx = 128) {
    return prefill_all_logits(*model, *backend, ids, n_ctx, cache_type);
  }

  std::vector<int32_t> greedy(const std::vector<int32_t>& prompt, int n, int n_ctx = 256) {
    return greedy_decode(*model, *backend, prompt, n, n_ctx, nullptr, cache_type);
  }
};

inline std::vector<int32_t> to_ids(const nlohmann::json& j) { return j.get<std::vector<int32_t>>(); }

// ---- comparing against reference runs --------------------------------------------------

// Row by row, the relative L2 error of `ours` against `theirs` (both `rows` x `vocab`) must
// be <= bound; a failure names `label`, the position (first_position + row), and the first
// logit and the argmax of both rows. Returns the largest error.
inline double expect_rows_near(const float* ours, const float* theirs, int64_t rows, int64_t vocab, double bound,
                               const std::string& label, int64_t first_position = 0) {
  double worst = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* a = ours + r * vocab;
    const float* b = theirs + r * vocab;
    const double err = relative_l2(a, b, vocab);
    worst = std::max(worst, err);
    EXPECT_LE(err, bound) << label << " position " << first_position + r << ": logit[0] ours " << a[0]
                          << " theirs " << b[0] << ", argmax ours " << argmax_row(a, vocab) << " theirs "
                          << argmax_row(b, vocab);
  }
  return worst;
}

// Reference logits from another engine: `rows` x `vocab` float32 values for the positions
// from `first` on, described by a json with "logits_shape": [rows, vocab] and, where the
// rows do not start at position 0, "logits_first_position".
struct ReferenceLogits {
  std::vector<float> values;
  int64_t rows = 0, vocab = 0, first = 0;
};

inline ReferenceLogits read_reference_logits(const nlohmann::json& meta, const std::filesystem::path& f32_path) {
  ReferenceLogits r;
  r.values = read_f32_file(f32_path);
  r.rows = meta["logits_shape"][0];
  r.vocab = meta["logits_shape"][1];
  r.first = meta.value("logits_first_position", int64_t(0));
  return r;
}

// `logits` (all positions of one prefill) against the reference rows, each within `bound`
// relative L2. Sizes that do not fit fail without comparing. Returns the largest error.
inline double expect_logits_match(const std::vector<float>& logits, const ReferenceLogits& want, double bound,
                                  const std::string& label) {
  if (int64_t(want.values.size()) != want.rows * want.vocab ||
      int64_t(logits.size()) < (want.first + want.rows) * want.vocab) {
    ADD_FAILURE() << label << ": " << logits.size() << " logits against a reference of " << want.values.size()
                  << " values (" << want.rows << " x " << want.vocab << " from position " << want.first << ")";
    return INFINITY;
  }
  return expect_rows_near(logits.data() + want.first * want.vocab, want.values.data(), want.rows, want.vocab, bound,
                          label, want.first);
}

// Runs `ids` as one prefill on `model` and checks every reference position: the vocabulary
// and the number of logits must fit, each position within `bound`. Returns the largest error.
inline double expect_prefill_matches(Model& model, Backend& backend, const std::vector<int32_t>& ids,
                                     const ReferenceLogits& want, double bound, const std::string& label,
                                     GgmlType cache_type = GgmlType::F32) {
  const int64_t vocab = model.hparams().n_vocab;
  EXPECT_EQ(vocab, want.vocab) << label << ": vocabulary";
  const std::vector<float> logits = prefill_all_logits(model, backend, ids, 128, cache_type);
  EXPECT_EQ(int64_t(logits.size()), int64_t(ids.size()) * vocab) << label << ": logits of the prefill";
  if (vocab != want.vocab || int64_t(logits.size()) != int64_t(ids.size()) * vocab) return INFINITY;
  return expect_logits_match(logits, want, bound, label);
}

// Every token of `got` equals `expected`'s (and there are as many). Returns how many match.
inline int expect_same_tokens(const std::vector<int32_t>& got, const std::vector<int32_t>& expected,
                              const std::string& label) {
  EXPECT_EQ(got.size(), expected.size()) << label << ": continuation length";
  int matched = 0;
  for (size_t i = 0; i < std::min(got.size(), expected.size()); ++i) {
    EXPECT_EQ(got[i], expected[i]) << label << " continuation token " << i;
    matched += got[i] == expected[i];
  }
  return matched;
}

// Greedy decoding of a reference json's "greedy_prompt_ids" must give its
// "greedy_continuation_ids" token for token. Returns how many match.
inline int expect_greedy_matches(Model& model, Backend& backend, const nlohmann::json& ref, const std::string& label,
                                 GgmlType cache_type = GgmlType::F32) {
  const std::vector<int32_t> expected = to_ids(ref["greedy_continuation_ids"]);
  const std::vector<int32_t> got = greedy_decode(model, backend, to_ids(ref["greedy_prompt_ids"]),
                                                 int(expected.size()), 256, nullptr, cache_type);
  return expect_same_tokens(got, expected, label);
}

}  // namespace kiln::testing
