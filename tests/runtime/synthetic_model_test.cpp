// kiln synth's models: the tensors, shapes and types a preset promises, readable by the
// GGUF reader, and runnable by the model code.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <string>

#include "backend/cpu/cpu_backend.h"
#include "formats/gguf.h"
#include "model/model.h"
#include "quant/quant.h"
#include "runtime/synthetic_model.h"
#include "support/testdata.h"
#include "tokenizer/tokenizer.h"

namespace kiln {
namespace {

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("kiln_synth_test_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

struct TempFile {
  std::string path;
  explicit TempFile(const std::string& name) : path(temp_path(name)) {}
  ~TempFile() { std::filesystem::remove(path); }
};

TEST(Synth, TinyPresetLoadsWithExpectedTensors) {
  TempFile f("tiny_q8.gguf");
  SynthOptions o;
  o.type = GgmlType::Q8_0;
  o.threads = 2;
  const SynthReport report = write_synthetic_model(synthetic_preset("test-tiny"), o, f.path);
  auto file = gguf::File::open(f.path);
  EXPECT_EQ(file->architecture(), "llama");
  EXPECT_EQ(file->get_int("llama.block_count"), 2);
  EXPECT_EQ(file->get_int("llama.embedding_length"), 256);
  EXPECT_EQ(file->get_int("llama.attention.head_count_kv"), 2);
  EXPECT_EQ(file->get_int("general.file_type"), 7);  // LLAMA_FTYPE_MOSTLY_Q8_0
  EXPECT_EQ(int(file->tensors().size()), report.n_tensors);
  EXPECT_EQ(report.n_tensors, 2 + 9 * 2 + 1);  // embd, output_norm, output + 9 per layer

  const std::map<std::string, std::pair<std::vector<int64_t>, GgmlType>> expected = {
      {"token_embd.weight", {{256, 512}, GgmlType::Q8_0}},
      {"output.weight", {{256, 512}, GgmlType::Q8_0}},
      {"output_norm.weight", {{256}, GgmlType::F32}},
      {"blk.1.attn_q.weight", {{256, 256}, GgmlType::Q8_0}},
      {"blk.1.attn_k.weight", {{256, 128}, GgmlType::Q8_0}},
      {"blk.1.ffn_down.weight", {{512, 256}, GgmlType::Q8_0}},
      {"blk.0.ffn_norm.weight", {{256}, GgmlType::F32}},
  };
  for (const auto& [name, want] : expected) {
    const gguf::TensorInfo* t = file->find_tensor(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->shape, want.first) << name;
    EXPECT_EQ(t->type, want.second) << name << ": " << type_name(t->type);
  }
  // Norms are ones; matrices have the standard deviation asked for.
  const gguf::TensorInfo* norm = file->find_tensor("blk.0.attn_norm.weight");
  for (int i = 0; i < 256; ++i) ASSERT_EQ(reinterpret_cast<const float*>(norm->data)[i], 1.0f) << "element " << i;
  const gguf::TensorInfo* q = file->find_tensor("blk.0.attn_q.weight");
  std::vector<float> values(size_t(q->elements()));
  dequantize_row(q->type, q->data, values.data(), q->elements());
  double sum = 0, squares = 0;
  for (float v : values) sum += v, squares += double(v) * v;
  const double mean = sum / double(values.size());
  EXPECT_NEAR(mean, 0.0, 0.001);
  EXPECT_NEAR(std::sqrt(squares / double(values.size()) - mean * mean), 0.02, 0.001);
}

TEST(Synth, SameSeedSameBytesAnyThreadCount) {
  TempFile a("seed_a.gguf"), b("seed_b.gguf"), c("seed_c.gguf");
  SynthOptions o;
  o.type = GgmlType::Q4_0;
  o.threads = 1;
  write_synthetic_model(synthetic_preset("test-tiny"), o, a.path);
  o.threads = 2;
  write_synthetic_model(synthetic_preset("test-tiny"), o, b.path);
  o.seed = 43;
  write_synthetic_model(synthetic_preset("test-tiny"), o, c.path);
  auto fa = gguf::File::open(a.path), fb = gguf::File::open(b.path), fc = gguf::File::open(c.path);
  const gguf::TensorInfo *ta = fa->find_tensor("blk.1.ffn_up.weight"), *tb = fb->find_tensor("blk.1.ffn_up.weight"),
                         *tc = fc->find_tensor("blk.1.ffn_up.weight");
  ASSERT_EQ(ta->bytes, tb->bytes);
  EXPECT_EQ(std::memcmp(ta->data, tb->data, ta->bytes), 0);
  EXPECT_NE(std::memcmp(ta->data, tc->data, ta->bytes), 0);
}

// --fast: every row of a pooled matrix is one of kSynthPoolRows rows quantized once; the
// file keeps the types, sizes and value distribution of a normal one.
TEST(Synth, RowPoolKeepsTypesSizesAndDistribution) {
  TempFile normal("pool_off.gguf"), fast("pool_on.gguf");
  SynthOptions o;
  o.type = GgmlType::Q4_K;
  o.threads = 2;
  write_synthetic_model(synthetic_preset("test-tiny"), o, normal.path);
  o.row_pool = true;
  write_synthetic_model(synthetic_preset("test-tiny"), o, fast.path);
  auto fn = gguf::File::open(normal.path), ff = gguf::File::open(fast.path);
  ASSERT_EQ(fn->tensors().size(), ff->tensors().size());
  for (size_t i = 0; i < fn->tensors().size(); ++i) {
    EXPECT_EQ(fn->tensors()[i].name, ff->tensors()[i].name);
    EXPECT_EQ(fn->tensors()[i].type, ff->tensors()[i].type) << fn->tensors()[i].name;
    EXPECT_EQ(fn->tensors()[i].bytes, ff->tensors()[i].bytes) << fn->tensors()[i].name;
  }
  const gguf::TensorInfo* t = ff->find_tensor("token_embd.weight");  // 512 rows of 256
  ASSERT_NE(t, nullptr);
  const int64_t rows = t->shape[1];
  const size_t row = t->bytes / size_t(rows);
  std::set<std::string> distinct;
  for (int64_t r = 0; r < rows; ++r)
    distinct.insert(std::string(reinterpret_cast<const char*>(t->data) + size_t(r) * row, row));
  EXPECT_LE(int64_t(distinct.size()), kSynthPoolRows);
  EXPECT_GT(distinct.size(), 200u);  // drawn across the pool, not one row repeated
  std::vector<float> values(size_t(t->elements()));
  dequantize_row(t->type, t->data, values.data(), t->elements());
  double squares = 0;
  for (float v : values) squares += double(v) * v;
  EXPECT_NEAR(std::sqrt(squares / double(values.size())), 0.02, 0.002);
}

TEST(Synth, Q4KMMixFollowsLlamaCppRule) {
  // 16 layers (llama3-1b): more bits for layers 0, 1, 4, 7, 10, 13, 14, 15.
  SynthOptions o;
  o.q4_k_m = true;
  const std::vector<SyntheticTensor> tensors = synthetic_tensors(synthetic_preset("llama3-1b"), o);
  std::map<std::string, GgmlType> type;
  for (const SyntheticTensor& t : tensors) type[t.name] = t.type;
  const std::vector<int> more = {0, 1, 4, 7, 10, 13, 14, 15};
  for (int il = 0; il < 16; ++il) {
    const bool m = std::find(more.begin(), more.end(), il) != more.end();
    const std::string p = "blk." + std::to_string(il) + ".";
    EXPECT_EQ(type[p + "attn_v.weight"], m ? GgmlType::Q6_K : GgmlType::Q4_K) << "layer " << il;
    EXPECT_EQ(type[p + "ffn_down.weight"], m ? GgmlType::Q6_K : GgmlType::Q4_K) << "layer " << il;
    EXPECT_EQ(type[p + "attn_q.weight"], GgmlType::Q4_K) << "layer " << il;
  }
  EXPECT_EQ(type["output.weight"], GgmlType::Q6_K);
  EXPECT_EQ(type["token_embd.weight"], GgmlType::Q4_K);
}

TEST(Synth, Llama2_13bPresetHasThePublishedShape) {
  // Llama-2-13B's published configuration: hidden 5120, 40 layers, intermediate 13824, 40
  // attention heads without grouping, vocabulary 32000, untied output; 13.0 B parameters.
  SynthOptions o;
  o.type = GgmlType::F16;
  const std::vector<SyntheticTensor> tensors = synthetic_tensors(synthetic_preset("llama2-13b"), o);
  std::map<std::string, std::vector<int64_t>> shape;
  int64_t params = 0;
  for (const SyntheticTensor& t : tensors) {
    shape[t.name] = t.shape;
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    params += n;
  }
  EXPECT_EQ(tensors.size(), size_t(40 * 9 + 3));
  EXPECT_EQ(shape["token_embd.weight"], (std::vector<int64_t>{5120, 32000}));
  EXPECT_EQ(shape["output.weight"], (std::vector<int64_t>{5120, 32000}));
  EXPECT_EQ(shape["blk.39.attn_k.weight"], (std::vector<int64_t>{5120, 5120}));
  EXPECT_EQ(shape["blk.39.ffn_gate.weight"], (std::vector<int64_t>{5120, 13824}));
  EXPECT_EQ(shape["blk.39.ffn_down.weight"], (std::vector<int64_t>{13824, 5120}));
  EXPECT_NEAR(double(params), 13.016e9, 0.01e9);
}

TEST(Synth, Qwen3NextNamesMatchLlamaCppConverter) {
  // Tensor names and shapes of our qwen3next layout, checked against the tiny model that
  // llama.cpp's converter wrote (same structure at a small scale).
  KILN_REQUIRE_TESTDATA(path, "arch/qwen3next.gguf");
  auto ref = gguf::File::open(path.string());
  SyntheticShape s = synthetic_preset("qwen3-next-80b-a3b");
  s.n_layer = 4, s.n_embd = 128, s.n_head = 2, s.n_head_kv = 1, s.head_dim = 64, s.n_vocab = 512;
  s.n_expert = 8, s.n_expert_used = 2, s.n_ff_expert = 64, s.n_ff_shared_expert = 64;
  s.linear_k_heads = 2, s.linear_v_heads = 4, s.linear_head_dim_k = 32, s.linear_head_dim_v = 32;
  SynthOptions o;
  o.type = GgmlType::F32;
  const std::vector<SyntheticTensor> ours = synthetic_tensors(s, o);
  EXPECT_EQ(ours.size(), ref->tensors().size());
  for (const SyntheticTensor& t : ours) {
    const gguf::TensorInfo* r = ref->find_tensor(t.name);
    ASSERT_NE(r, nullptr) << t.name << " is not in llama.cpp's qwen3next file";
    EXPECT_EQ(t.shape, r->shape) << t.name;
  }
  // The metadata is complete enough for the model code to run it.
  TempFile f("qwen3next_small.gguf");
  write_synthetic_model(s, o, f.path);
  auto file = gguf::File::open(f.path);
  CpuBackend backend(1);
  std::unique_ptr<Model> model = Model::load(*file, backend);
  KvCache cache(backend, model->cache_config(16));
  const int seq = cache.add_sequence();
  Batch batch;
  for (int i = 0; i < 5; ++i) batch.add(i * 7 + 3, i, seq, true);
  const std::vector<float> logits = model->forward(batch, cache);
  for (size_t i = 0; i < logits.size(); ++i) ASSERT_TRUE(std::isfinite(logits[i])) << "logit " << i;
}

TEST(Synth, TinyModelRunsWithFiniteLogits) {
  TempFile f("tiny_run.gguf");
  SynthOptions o;
  o.q4_k_m = true;
  write_synthetic_model(synthetic_preset("test-tiny"), o, f.path);
  auto file = gguf::File::open(f.path);
  CpuBackend backend(1);
  std::unique_ptr<Model> model = Model::load(*file, backend);
  KvCache cache(backend, model->cache_config(32));
  const int seq = cache.add_sequence();
  const Tokenizer tokenizer = Tokenizer::from_gguf(*file);
  const std::vector<int32_t> ids = tokenizer.encode("Hello, world");
  ASSERT_FALSE(ids.empty());
  Batch batch;
  for (size_t i = 0; i < ids.size(); ++i) batch.add(ids[i], int32_t(i), seq, true);
  const std::vector<float> logits = model->forward(batch, cache);
  ASSERT_EQ(logits.size(), ids.size() * 512);
  for (size_t i = 0; i < logits.size(); ++i) ASSERT_TRUE(std::isfinite(logits[i])) << "logit " << i << " = " << logits[i];
}

TEST(Synth, VocabularyFileSetsTheVocabulary) {
  KILN_REQUIRE_TESTDATA(vocab, "tokenizer/vocab/ggml-vocab-llama-spm.gguf");
  TempFile f("tiny_vocab.gguf");
  SynthOptions o;
  o.type = GgmlType::Q8_0;
  o.vocab_path = vocab.string();
  write_synthetic_model(synthetic_preset("test-tiny"), o, f.path);
  auto file = gguf::File::open(f.path);
  const Tokenizer reference = Tokenizer::from_gguf(vocab.string());
  const Tokenizer copied = Tokenizer::from_gguf(*file);
  EXPECT_EQ(copied.vocab_size(), reference.vocab_size());
  EXPECT_EQ(file->find_tensor("token_embd.weight")->shape[1], int64_t(reference.vocab_size()));
  EXPECT_EQ(copied.encode("Hello world"), reference.encode("Hello world"));
}

}  // namespace
}  // namespace kiln
