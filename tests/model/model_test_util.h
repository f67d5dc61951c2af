#pragma once
// Shared by the model reference tests: reading reference arrays, running a model over a
// token list, greedy decoding through the KV cache, error measures.
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "formats/gguf.h"
#include "model/model.h"
#include "model/source.h"

namespace kiln::testing {

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

// A model on the CPU backend with its own cache: a GGUF file or a checkpoint directory.
struct LoadedModel {
  std::unique_ptr<ModelSource> source;
  const gguf::File* file = nullptr;  // when the source is a GGUF file
  std::unique_ptr<CpuBackend> backend;
  std::unique_ptr<Model> model;

  explicit LoadedModel(const std::filesystem::path& path)
      : source(open_model_source(path.string())), file(source->gguf_file()), backend(std::make_unique<CpuBackend>()),
        model(Model::load(*source, *backend)) {}

  int vocab() const { return model->hparams().n_vocab; }

  // All positions' logits of `ids` run as one prefill batch of sequence 0.
  std::vector<float> prefill_logits(const std::vector<int32_t>& ids, int n_ctx = 128) {
    KvCache cache(*backend, model->cache_config(n_ctx));
    const int seq = cache.add_sequence();
    Batch batch;
    for (size_t i = 0; i < ids.size(); ++i) batch.add(ids[i], int32_t(i), seq, true);
    return model->forward(batch, cache);
  }

  // Prefill the prompt, then decode n tokens one by one (argmax), through the cache.
  std::vector<int32_t> greedy(const std::vector<int32_t>& prompt, int n, int n_ctx = 256) {
    KvCache cache(*backend, model->cache_config(n_ctx));
    const int seq = cache.add_sequence();
    Batch batch;
    for (size_t i = 0; i < prompt.size(); ++i) batch.add(prompt[i], int32_t(i), seq, i + 1 == prompt.size());
    std::vector<float> logits = model->forward(batch, cache);
    std::vector<int32_t> out;
    int32_t pos = int32_t(prompt.size());
    for (int step = 0; step < n; ++step) {
      out.push_back(argmax_row(logits.data(), vocab()));
      if (step + 1 == n) break;
      batch.clear();
      batch.add(out.back(), pos++, seq, true);
      logits = model->forward(batch, cache);
    }
    return out;
  }
};

inline std::vector<int32_t> to_ids(const nlohmann::json& j) { return j.get<std::vector<int32_t>>(); }

}  // namespace kiln::testing
