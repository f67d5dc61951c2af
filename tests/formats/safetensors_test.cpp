// safetensors: the reference HF checkpoint against llama.cpp's GGUF conversion of it,
// a sharded checkpoint written here, and broken files.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "formats/gguf.h"
#include "formats/safetensors.h"
#include "format_test_util.h"
#include "support/testdata.h"

namespace kiln {
namespace {

using nlohmann::json;
using safetensors::Dtype;
using testing::expect_error;
using testing::ScratchDir;

struct TensorBytes {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;
};

// A .safetensors image laid out as the reference writer does: header padded with spaces
// to a multiple of 8, tensors back to back in the given order.
std::vector<uint8_t> build_safetensors(const std::vector<TensorBytes>& tensors, const json& metadata = nullptr) {
  json header = json::object();
  if (!metadata.is_null()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.data.size()}}};
    offset += t.data.size();
  }
  std::string text = header.dump();
  text.resize((text.size() + 7) / 8 * 8, ' ');
  std::vector<uint8_t> out;
  testing::GgufBytes le;  // for the little-endian u64
  le.u64(text.size());
  out = le.bytes;
  out.insert(out.end(), text.begin(), text.end());
  for (const auto& t : tensors) out.insert(out.end(), t.data.begin(), t.data.end());
  return out;
}

// A file with the given header text (not padded) and `data_bytes` zero bytes of data.
std::vector<uint8_t> raw_safetensors(std::string_view header, size_t data_bytes) {
  testing::GgufBytes b;
  b.u64(header.size());
  b.bytes.insert(b.bytes.end(), header.begin(), header.end());
  b.zeros(data_bytes);
  return b.bytes;
}

std::string open_error(const std::vector<uint8_t>& bytes, std::initializer_list<std::string_view> words) {
  return expect_error([&] { safetensors::File::open_memory(bytes, "bad.safetensors"); }, words);
}

TEST(Safetensors, DtypesMapToGgmlTypes) {
  EXPECT_EQ(safetensors::to_ggml_type(Dtype::F32), GgmlType::F32);
  EXPECT_EQ(safetensors::to_ggml_type(Dtype::F16), GgmlType::F16);
  EXPECT_EQ(safetensors::to_ggml_type(Dtype::BF16), GgmlType::BF16);
  EXPECT_EQ(safetensors::to_ggml_type(Dtype::F64), GgmlType::F64);
  EXPECT_EQ(safetensors::to_ggml_type(Dtype::I8), GgmlType::I8);
  EXPECT_EQ(safetensors::to_ggml_type(Dtype::I16), GgmlType::I16);
  EXPECT_EQ(safetensors::to_ggml_type(Dtype::I32), GgmlType::I32);
  EXPECT_EQ(safetensors::to_ggml_type(Dtype::I64), GgmlType::I64);
  EXPECT_FALSE(safetensors::to_ggml_type(Dtype::U8).has_value());
  EXPECT_FALSE(safetensors::to_ggml_type(Dtype::BOOL).has_value());
  EXPECT_FALSE(safetensors::to_ggml_type(Dtype::F8_E4M3).has_value());
  for (const char* name : {"F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "BOOL", "F8_E4M3", "F8_E5M2"}) {
    const auto d = safetensors::dtype_from_name(name);
    ASSERT_TRUE(d.has_value()) << name;
    EXPECT_EQ(safetensors::dtype_name(*d), name);
    if (auto g = safetensors::to_ggml_type(*d)) {
      EXPECT_EQ(traits(*g).type_size, safetensors::dtype_size(*d)) << name;
    }
  }
  EXPECT_FALSE(safetensors::dtype_from_name("f32").has_value());  // names are case-sensitive
}

// gguf name of each HF llama tensor that llama.cpp's converter stores unchanged.
std::string gguf_name_of(const std::string& hf) {
  static const std::pair<const char*, const char*> kExact[] = {
      {"model.embed_tokens.weight", "token_embd.weight"},
      {"model.norm.weight", "output_norm.weight"},
      {"lm_head.weight", "output.weight"},
  };
  for (const auto& [from, to] : kExact)
    if (hf == from) return to;
  static const std::pair<const char*, const char*> kLayer[] = {
      {"input_layernorm.weight", "attn_norm.weight"},     {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},        {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"},        {"self_attn.o_proj.weight", "attn_output.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},       {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.k_proj.weight", "attn_k.weight"},
  };
  int layer = -1;
  char rest[128] = {};
  if (std::sscanf(hf.c_str(), "model.layers.%d.%127s", &layer, rest) == 2)
    for (const auto& [from, to] : kLayer)
      if (std::string(rest) == from) return fmt::format("blk.{}.{}", layer, to);
  return {};
}

std::vector<float> floats_of(const uint8_t* data, size_t bytes) {
  std::vector<float> out(bytes / 4);
  std::memcpy(out.data(), data, bytes);
  return out;
}

TEST(Safetensors, HfLlamaCheckpointEqualsTheGgufConversion) {
  KILN_REQUIRE_TESTDATA(dir, "arch/hf/llama");
  KILN_REQUIRE_TESTDATA(gguf_path, "arch/llama.gguf");
  const auto ckpt = safetensors::Checkpoint::open(dir.string());
  ASSERT_TRUE(ckpt->has_config());
  EXPECT_EQ(ckpt->config().at("model_type"), "llama");
  EXPECT_EQ(ckpt->config().at("num_hidden_layers"), 2);
  ASSERT_TRUE(ckpt->has_generation_config());
  EXPECT_EQ(ckpt->generation_config().at("eos_token_id"), 2);
  ASSERT_EQ(ckpt->files().size(), 1u);
  EXPECT_EQ(ckpt->files()[0]->metadata().at("format"), "pt");
  EXPECT_EQ(ckpt->tensors().size(), 21u);  // 2 layers x 9 + embeddings, final norm, lm_head

  const auto gguf_file = gguf::File::open(gguf_path.string());
  size_t exact = 0, permuted = 0;
  for (const safetensors::Tensor* t : ckpt->tensors()) {
    SCOPED_TRACE(t->name);
    EXPECT_EQ(t->dtype, Dtype::F32);
    const std::string name = gguf_name_of(t->name);
    ASSERT_FALSE(name.empty()) << "no mapping for " << t->name;
    const gguf::TensorInfo* g = gguf_file->find_tensor(name);
    ASSERT_NE(g, nullptr) << name;
    EXPECT_EQ(t->ggml_shape(), g->shape);
    ASSERT_EQ(t->bytes, g->bytes);
    const std::vector<float> a = floats_of(t->data, t->bytes), b = floats_of(g->data, g->bytes);
    if (name.find("attn_q") != std::string::npos || name.find("attn_k") != std::string::npos) {
      // The converter permutes q/k rows for its rope layout: same values, other order.
      std::vector<float> sa(a), sb(b);
      std::sort(sa.begin(), sa.end());
      std::sort(sb.begin(), sb.end());
      EXPECT_EQ(sa, sb);
      ++permuted;
      continue;
    }
    for (size_t k = 0; k < a.size(); ++k)
      if (a[k] != b[k]) {
        ADD_FAILURE() << "element " << k << ": safetensors " << a[k] << ", gguf " << b[k];
        break;
      }
    ++exact;
  }
  EXPECT_EQ(exact, 17u);
  EXPECT_EQ(permuted, 4u);
  expect_error([&] { ckpt->get("model.nope"); }, {"model.nope"});
}

TEST(Safetensors, EveryDtypeAndTheMetadataRoundTrip) {
  std::vector<TensorBytes> tensors;
  const std::pair<const char*, size_t> dtypes[] = {{"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8},
                                                   {"I32", 4}, {"I16", 2}, {"I8", 1},  {"U8", 1},   {"BOOL", 1},
                                                   {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"U16", 2}, {"U32", 4}, {"U64", 8}};
  uint32_t seed = 0;
  for (const auto& [dtype, size] : dtypes)
    tensors.push_back({fmt::format("t.{}", dtype), dtype, {3, 5}, testing::random_bytes(15 * size, ++seed)});
  tensors.push_back({"scalar", "F32", {}, testing::random_bytes(4, 100)});
  tensors.push_back({"empty", "F16", {0, 7}, {}});
  const auto bytes = build_safetensors(tensors, {{"format", "pt"}, {"note", "ünïcode"}});
  const auto f = safetensors::File::open_memory(bytes, "all.safetensors");
  EXPECT_EQ(f->metadata().at("note"), "ünïcode");
  ASSERT_EQ(f->tensors().size(), tensors.size());
  for (const auto& want : tensors) {
    const safetensors::Tensor* t = f->find(want.name);
    ASSERT_NE(t, nullptr) << want.name;
    EXPECT_EQ(safetensors::dtype_name(t->dtype), want.dtype);
    EXPECT_EQ(t->shape, want.shape);
    ASSERT_EQ(t->bytes, want.data.size());
    if (t->bytes) {
      EXPECT_EQ(std::memcmp(t->data, want.data.data(), t->bytes), 0) << want.name;
    }
  }
  EXPECT_EQ(f->find("scalar")->elements(), 1);
  EXPECT_EQ(f->find("t.F32")->ggml_shape(), (std::vector<int64_t>{5, 3}));
}

TEST(Safetensors, ShardedCheckpointThroughTheIndex) {
  ScratchDir dir;
  const TensorBytes a{"model.a", "F32", {2, 2}, testing::random_bytes(16, 1)};
  const TensorBytes b{"model.b", "BF16", {3}, testing::random_bytes(6, 2)};
  const TensorBytes c{"model.c", "I64", {1}, testing::random_bytes(8, 3)};
  testing::write_file(dir.file("model-00001-of-00002.safetensors"), build_safetensors({a, b}));
  testing::write_file(dir.file("model-00002-of-00002.safetensors"), build_safetensors({c}));
  const json index = {{"metadata", {{"total_size", 30}}},
                      {"weight_map",
                       {{"model.a", "model-00001-of-00002.safetensors"},
                        {"model.b", "model-00001-of-00002.safetensors"},
                        {"model.c", "model-00002-of-00002.safetensors"}}}};
  testing::write_file(dir.file("model.safetensors.index.json"), index.dump(2));
  testing::write_file(dir.file("config.json"), R"({"model_type": "toy", "hidden_size": 4})");

  for (const std::string& path : {dir.path().string(), dir.file("model.safetensors.index.json")}) {
    SCOPED_TRACE(path);
    const auto ckpt = safetensors::Checkpoint::open(path);
    ASSERT_EQ(ckpt->files().size(), 2u);
    ASSERT_EQ(ckpt->tensors().size(), 3u);
    const auto& tc = ckpt->get("model.c");
    EXPECT_EQ(tc.file_index, 1);
    EXPECT_EQ(std::memcmp(tc.data, c.data.data(), 8), 0);
    EXPECT_EQ(ckpt->get("model.b").dtype, Dtype::BF16);
    EXPECT_EQ(ckpt->get("model.a").file_index, 0);
  }
  EXPECT_EQ(safetensors::Checkpoint::open(dir.path().string())->config().at("hidden_size"), 4);
  EXPECT_FALSE(safetensors::Checkpoint::open(dir.path().string())->has_generation_config());

  // The index and the shards must agree.
  json moved = index;
  moved["weight_map"]["model.c"] = "model-00001-of-00002.safetensors";
  testing::write_file(dir.file("model.safetensors.index.json"), moved.dump());
  expect_error([&] { safetensors::Checkpoint::open(dir.path().string()); },
               {"model.safetensors.index.json", "'model.c'", "listed in model-00001-of-00002.safetensors"});
  json unlisted = index;
  unlisted["weight_map"].erase("model.b");
  testing::write_file(dir.file("model.safetensors.index.json"), unlisted.dump());
  expect_error([&] { safetensors::Checkpoint::open(dir.path().string()); }, {"'model.b'", "not listed"});
  json escaping = index;
  escaping["weight_map"]["model.c"] = "../elsewhere.safetensors";
  testing::write_file(dir.file("model.safetensors.index.json"), escaping.dump());
  expect_error([&] { safetensors::Checkpoint::open(dir.path().string()); },
               {"model.safetensors.index.json", "'model.c'", "not a plain file name"});
  json missing = index;
  missing["weight_map"]["model.c"] = "model-00003-of-00002.safetensors";
  testing::write_file(dir.file("model.safetensors.index.json"), missing.dump());
  expect_error([&] { safetensors::Checkpoint::open(dir.path().string()); },
               {"model-00003-of-00002.safetensors", "cannot open"});
  testing::write_file(dir.file("model.safetensors.index.json"), R"({"weight_map": {"a": "x", "a": "y"}})");
  expect_error([&] { safetensors::Checkpoint::open(dir.path().string()); },
               {"model.safetensors.index.json", "duplicate", "'a'"});
  testing::write_file(dir.file("model.safetensors.index.json"), R"({"weight_map": [1, 2]})");
  expect_error([&] { safetensors::Checkpoint::open(dir.path().string()); }, {"model.safetensors.index.json", "weight_map"});

  // Without an index, every .safetensors file of the directory; a tensor in two files is refused.
  std::filesystem::remove(dir.file("model.safetensors.index.json"));
  testing::write_file(dir.file("model-00002-of-00002.safetensors"), build_safetensors({c, b}));
  expect_error([&] { safetensors::Checkpoint::open(dir.path().string()); },
               {"model-00002-of-00002.safetensors", "'model.b'", "also in", "model-00001-of-00002.safetensors"});
  testing::write_file(dir.file("config.json"), R"({"model_type": )");
  expect_error([&] { safetensors::Checkpoint::open(dir.path().string()); }, {"config.json", "malformed JSON"});
}

TEST(SafetensorsCorruption, HeaderLengthAndJson) {
  open_error({1, 2, 3}, {"bad.safetensors", "truncated", "3 bytes"});
  testing::GgufBytes huge;
  huge.u64(1ull << 62).zeros(16);
  open_error(huge.bytes, {"bad.safetensors", "header length 4611686018427387904", "offset 0", "past the end"});
  open_error(raw_safetensors("{\"a\": ", 0), {"bad.safetensors", "malformed JSON", "byte offset"});
  open_error(raw_safetensors("{\"a\": \xff}", 0), {"bad.safetensors", "malformed JSON"});
  open_error(raw_safetensors("[1, 2]", 0), {"bad.safetensors", "not a JSON object"});
  // A number beyond double's range: nlohmann reports it as out_of_range, not parse_error
  // (found by the mutation fuzzer; it used to escape as a non-kiln exception).
  open_error(raw_safetensors(R"({"w": 1e999})", 0), {"bad.safetensors", "malformed JSON", "number overflow"});
  open_error(raw_safetensors(std::string(200, '[') + std::string(200, ']'), 0), {"bad.safetensors", "nested deeper"});
  EXPECT_NO_THROW(safetensors::File::open_memory(raw_safetensors("{}", 0), "empty.safetensors"));
  EXPECT_NO_THROW(safetensors::File::open_memory(raw_safetensors("{}   ", 0), "padded.safetensors"));
}

TEST(SafetensorsCorruption, BadEntries) {
  const auto one = [](std::string_view entry, size_t data) {
    return raw_safetensors(fmt::format(R"({{"w": {}}})", entry), data);
  };
  EXPECT_NO_THROW(safetensors::File::open_memory(one(R"({"dtype":"F32","shape":[2],"data_offsets":[0,8]})", 8), "ok"));
  open_error(one(R"(7)", 0), {"bad.safetensors", "tensor 'w'", "not a JSON object"});
  open_error(one(R"({"dtype":"F32","shape":[2]})", 8), {"bad.safetensors", "tensor 'w'", "data_offsets"});
  open_error(one(R"({"dtype":"Q4","shape":[2],"data_offsets":[0,8]})", 8), {"bad.safetensors", "tensor 'w'", "unknown dtype 'Q4'"});
  open_error(one(R"({"dtype":3,"shape":[2],"data_offsets":[0,8]})", 8), {"bad.safetensors", "tensor 'w'", "dtype"});
  open_error(one(R"({"dtype":"F32","shape":[-2],"data_offsets":[0,8]})", 8), {"bad.safetensors", "tensor 'w'", "non-negative"});
  open_error(one(R"({"dtype":"F32","shape":[2.5],"data_offsets":[0,8]})", 8), {"bad.safetensors", "tensor 'w'", "integer"});
  open_error(one(R"({"dtype":"F32","shape":2,"data_offsets":[0,8]})", 8), {"bad.safetensors", "tensor 'w'", "shape"});
  open_error(one(R"({"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]})", 8),
             {"bad.safetensors", "tensor 'w'", "overflow"});
  open_error(one(R"({"dtype":"F64","shape":[2305843009213693952],"data_offsets":[0,8]})", 8),
             {"bad.safetensors", "tensor 'w'", "needs"});
  open_error(one(R"({"dtype":"F32","shape":[3],"data_offsets":[0,8]})", 8),
             {"bad.safetensors", "tensor 'w'", "needs 12 bytes", "span 8"});
  open_error(one(R"({"dtype":"F32","shape":[2],"data_offsets":[0,8,16]})", 16), {"bad.safetensors", "tensor 'w'", "[begin, end]"});
  open_error(one(R"({"dtype":"F32","shape":[2],"data_offsets":[8,0]})", 8), {"bad.safetensors", "tensor 'w'", "end before"});
  open_error(one(R"({"dtype":"F32","shape":[2],"data_offsets":[0,8]})", 4), {"bad.safetensors", "tensor 'w'", "past the end"});
  open_error(one(R"({"dtype":"F32","shape":[2],"data_offsets":[18446744073709551615,8]})", 8),
             {"bad.safetensors", "tensor 'w'"});
  open_error(one(R"({"dtype":"F32","shape":[2],"data_offsets":[0,8]})", 12), {"bad.safetensors", "4 bytes at the end"});
  open_error(raw_safetensors(R"({"__metadata__": {"a": 1}})", 0), {"bad.safetensors", "__metadata__ 'a'", "not a string"});
  open_error(raw_safetensors(R"({"__metadata__": []})", 0), {"bad.safetensors", "__metadata__"});
}

TEST(SafetensorsCorruption, OverlapsGapsAndDuplicates) {
  const auto two = [](uint64_t a0, uint64_t a1, uint64_t b0, uint64_t b1, size_t data, std::string_view name_b = "b") {
    return raw_safetensors(fmt::format(R"({{"a": {{"dtype":"U8","shape":[{}],"data_offsets":[{},{}]}},)"
                                       R"( "{}": {{"dtype":"U8","shape":[{}],"data_offsets":[{},{}]}}}})",
                                       a1 - a0, a0, a1, name_b, b1 - b0, b0, b1),
                           data);
  };
  const auto f = safetensors::File::open_memory(two(4, 10, 0, 4, 10), "ok");
  EXPECT_EQ(f->tensors()[0].name, "b");  // listed in data order
  open_error(two(0, 6, 4, 10, 10), {"bad.safetensors", "tensor 'b'", "overlaps tensor 'a'"});
  open_error(two(0, 4, 0, 4, 4), {"bad.safetensors", "overlaps"});
  open_error(two(0, 4, 6, 10, 10), {"bad.safetensors", "2 bytes at data offset 4", "before tensor 'b'"});
  open_error(two(2, 4, 4, 10, 10), {"bad.safetensors", "2 bytes at data offset 0", "before tensor 'a'"});
  open_error(two(0, 4, 4, 10, 10, "a"), {"bad.safetensors", "duplicate tensor name 'a'"});
}

TEST(SafetensorsCorruption, EveryTruncationIsAnError) {
  const auto bytes = build_safetensors({{"x", "F32", {3}, testing::random_bytes(12, 1)},
                                        {"y", "I8", {5}, testing::random_bytes(5, 2)}},
                                       {{"format", "pt"}});
  EXPECT_NO_THROW(safetensors::File::open_memory(bytes, "whole.safetensors"));
  for (size_t n = 0; n < bytes.size(); ++n) {
    const std::vector<uint8_t> prefix(bytes.begin(), bytes.begin() + std::ptrdiff_t(n));
    try {
      safetensors::File::open_memory(prefix, "cut.safetensors");
      ADD_FAILURE() << "a prefix of " << n << " of " << bytes.size() << " bytes was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("cut.safetensors"), std::string::npos) << n << ": " << e.what();
    }
  }
}

}  // namespace
}  // namespace kiln
