// Models loaded straight from Hugging Face checkpoints (testdata/arch/hf/<name>/: config.json
// + model.safetensors, the same weights as arch/<name>.gguf):
//   - logits of the reference ids vs HF transformers' (relative L2 <= 1e-4 per position,
//     f32 KV cache), greedy continuation equal to HF generate's;
//   - the checkpoint-loaded and GGUF-loaded models agree (<= 1e-5), and every tensor the
//     checkpoint source makes equals the converter's, transforms included;
//   - damaged checkpoints (missing, extra, misshapen tensors, no config) fail with errors
//     that name the tensor;
//   - a bf16 checkpoint runs as its values in f32;
//   - qwen2, qwen3, mixtral and Llama 3.1 rope scaling (no checkpoint in testdata) from a
//     checkpoint rebuilt out of the converted GGUF, against HF's logits.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include <unistd.h>

#include "core/half.h"
#include "formats/safetensors.h"
#include "model/hf_checkpoint.h"
#include "model_test_util.h"
#include "support/testdata.h"

namespace kiln::testing {
namespace {

namespace fs = std::filesystem;

class HfCheckpoint : public ::testing::TestWithParam<std::string> {};

TEST_P(HfCheckpoint, PrefillLogitsMatchTransformers) {
  const std::string name = GetParam();
  KILN_REQUIRE_TESTDATA(ref_path, "arch/" + name + ".ref.json");
  KILN_REQUIRE_TESTDATA(dir, "arch/hf/" + name + "/config.json");
  const nlohmann::json ref = read_json(ref_path);
  KILN_REQUIRE_TESTDATA(logits_path, "arch/" + ref["logits_file"].get<std::string>());
  const ReferenceLogits want = read_reference_logits(ref, logits_path);

  LoadedModel m(dir.parent_path());
  ASSERT_EQ(m.source->format(), SourceFormat::HfCheckpoint);
  ASSERT_EQ(m.vocab(), want.vocab);
  const double worst =
      expect_prefill_matches(*m.model, *m.backend, to_ids(ref["ids"]), want, 1e-4, name, GgmlType::F32);
  std::printf("[ %s from checkpoint ] max relative L2 error vs transformers over %lld positions: %.3g\n",
              name.c_str(), (long long)want.rows, worst);
}

TEST_P(HfCheckpoint, GreedyDecodeMatchesTransformers) {
  const std::string name = GetParam();
  KILN_REQUIRE_TESTDATA(ref_path, "arch/" + name + ".ref.json");
  KILN_REQUIRE_TESTDATA(dir, "arch/hf/" + name + "/config.json");
  LoadedModel m(dir.parent_path());
  expect_greedy_matches(*m.model, *m.backend, read_json(ref_path), name, GgmlType::F32);
}

TEST_P(HfCheckpoint, AgreesWithTheConvertedGguf) {
  const std::string name = GetParam();
  KILN_REQUIRE_TESTDATA(ref_path, "arch/" + name + ".ref.json");
  KILN_REQUIRE_TESTDATA(gguf_path, "arch/" + name + ".gguf");
  KILN_REQUIRE_TESTDATA(dir, "arch/hf/" + name + "/config.json");
  const nlohmann::json ref = read_json(ref_path);
  LoadedModel hf(dir.parent_path()), gg(gguf_path);
  ASSERT_EQ(hf.vocab(), gg.vocab());
  const std::vector<int32_t> ids = to_ids(ref["ids"]);
  const std::vector<float> a = hf.prefill_logits(ids), b = gg.prefill_logits(ids);
  ASSERT_EQ(a.size(), b.size());
  const double worst = expect_rows_near(a.data(), b.data(), int64_t(ids.size()), hf.vocab(), 1e-5, name);
  std::printf("[ %s ] checkpoint vs GGUF: max relative L2 %.3g\n", name.c_str(), worst);
}

// Every tensor the checkpoint source makes (renamed, stacked, regrouped, +1, -exp) equals
// the one llama.cpp's converter wrote — except llama's Wq/Wk, whose rows the converter
// permutes for its rope pairing (kiln ropes HF's layout with the neox pairing instead).
TEST_P(HfCheckpoint, TensorsEqualTheConverters) {
  const std::string name = GetParam();
  KILN_REQUIRE_TESTDATA(gguf_path, "arch/" + name + ".gguf");
  KILN_REQUIRE_TESTDATA(dir, "arch/hf/" + name + "/config.json");
  auto hf = open_model_source(dir.parent_path().string());
  auto gg = open_model_source(gguf_path.string());
  CpuBackend backend;
  std::vector<std::string> names = hf->tensor_names(), gguf_names = gg->tensor_names();
  std::sort(names.begin(), names.end());
  std::sort(gguf_names.begin(), gguf_names.end());
  EXPECT_EQ(names, gguf_names);
  int compared = 0;
  for (const std::string& t : names) {
    if (!gg->has_tensor(t)) continue;
    const bool permuted = name == "llama" && (t.ends_with("attn_q.weight") || t.ends_with("attn_k.weight"));
    EXPECT_EQ(*hf->tensor_shape(t), *gg->tensor_shape(t)) << t;
    const Tensor x = hf->load_tensor(t, backend), y = gg->load_tensor(t, backend);
    ASSERT_EQ(x.dtype, GgmlType::F32) << t;
    ASSERT_EQ(x.elements(), y.elements()) << t;
    if (permuted) continue;
    const float* p = x.as<float>();
    const float* q = y.as<float>();
    for (int64_t i = 0; i < x.elements(); ++i) {
      // -exp(A_log): the converter rounds exp in float32, kiln in double.
      if (std::abs(p[i] - q[i]) > 1e-6f * std::max(1.0f, std::abs(q[i]))) {
        ADD_FAILURE() << t << "[" << i << "]: checkpoint " << p[i] << ", GGUF " << q[i];
        break;
      }
    }
    ++compared;
  }
  std::printf("[ %s ] %d tensors equal the converter's\n", name.c_str(), compared);
}

INSTANTIATE_TEST_SUITE_P(Arch, HfCheckpoint, ::testing::Values("llama", "qwen3moe", "qwen3next"));

// Llama 3.1 rope scaling: the factors computed from config.json equal the rope_freqs
// tensor the converter wrote.
TEST(HfConfig, Llama3RopeFactorsMatchTheConverter) {
  KILN_REQUIRE_TESTDATA(ref_path, "arch/llama31-ropescale.ref.json");
  KILN_REQUIRE_TESTDATA(gguf_path, "arch/llama31-ropescale.gguf");
  const HfModelConfig config = translate_hf_config(read_json(ref_path)["hf_config"], ref_path.string());
  ASSERT_TRUE(config.computed.count("rope_freqs.weight"));
  const std::vector<float>& ours = config.computed.at("rope_freqs.weight");
  auto file = gguf::File::open(gguf_path.string());
  const gguf::TensorInfo* info = file->find_tensor("rope_freqs.weight");
  ASSERT_TRUE(info);
  ASSERT_EQ(info->type, GgmlType::F32);
  ASSERT_EQ(int64_t(ours.size()), info->elements());
  const float* theirs = reinterpret_cast<const float*>(info->data);
  for (size_t i = 0; i < ours.size(); ++i)
    EXPECT_NEAR(ours[i], theirs[i], 1e-6 * std::abs(theirs[i])) << "pair " << i;
}

TEST(HfConfig, TranslatesQwen3NextKeys) {
  KILN_REQUIRE_TESTDATA(ref_path, "arch/qwen3next.ref.json");
  const HfModelConfig c = translate_hf_config(read_json(ref_path)["hf_config"], "qwen3next config");
  auto get = [&](const std::string& key) {
    const gguf::Value* v = c.metadata.find("qwen3next." + key);
    EXPECT_TRUE(v) << key;
    return v ? v->as_int(key) : -1;
  };
  EXPECT_EQ(c.arch, "qwen3next");
  EXPECT_EQ(get("ssm.conv_kernel"), 4);
  EXPECT_EQ(get("ssm.state_size"), 32);
  EXPECT_EQ(get("ssm.group_count"), 2);
  EXPECT_EQ(get("ssm.time_step_rank"), 4);
  EXPECT_EQ(get("ssm.inner_size"), 128);
  EXPECT_EQ(get("rope.dimension_count"), 16);  // partial_rotary_factor 0.25 of 64
  EXPECT_EQ(get("expert_count"), 8);
  EXPECT_EQ(get("expert_used_count"), 2);
  EXPECT_EQ(get("expert_feed_forward_length"), 64);
}

TEST(HfConfig, RefusesWhatItCannotRun) {
  auto message = [](const nlohmann::json& config) {
    try {
      translate_hf_config(config, "cfg");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  const nlohmann::json base = {{"model_type", "llama"}, {"hidden_size", 64}, {"num_attention_heads", 2},
                               {"num_hidden_layers", 1}};
  EXPECT_NE(message(base).find("(no error)"), std::string::npos);
  nlohmann::json c = base;
  c["model_type"] = "bert";
  EXPECT_NE(message(c).find("model_type \"bert\""), std::string::npos) << message(c);
  c = base;
  c["rope_scaling"] = {{"rope_type", "longrope"}, {"factor", 4.0}};
  EXPECT_NE(message(c).find("longrope"), std::string::npos) << message(c);
  c = base;
  c.erase("num_hidden_layers");
  EXPECT_NE(message(c).find("num_hidden_layers"), std::string::npos) << message(c);
  c = base;
  c["hidden_act"] = "gelu";
  EXPECT_NE(message(c).find("gelu"), std::string::npos) << message(c);
}

// ---- damaged checkpoints ------------------------------------------------------------

struct OutTensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

void write_safetensors(const fs::path& path, const std::vector<OutTensor>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  size_t offset = 0;
  for (const OutTensor& t : tensors) {
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string text = header.dump();
  while (text.size() % 8) text += ' ';
  std::ofstream out(path, std::ios::binary);
  const uint64_t n = text.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out.write(text.data(), std::streamsize(text.size()));
  for (const OutTensor& t : tensors) out.write(reinterpret_cast<const char*>(t.bytes.data()), std::streamsize(t.bytes.size()));
}

// Copies testdata checkpoint `name` into a temporary directory, letting `edit` change the
// tensor list (and config.json) first; returns the error loading it gives, or "".
std::string load_error(const fs::path& original, const std::string& label,
                       const std::function<void(std::vector<OutTensor>&, nlohmann::json&)>& edit) {
  auto ckpt = safetensors::Checkpoint::open(original.string());
  std::vector<OutTensor> tensors;
  for (const safetensors::Tensor* t : ckpt->tensors())
    tensors.push_back({t->name, std::string(safetensors::dtype_name(t->dtype)), t->shape,
                       std::vector<uint8_t>(t->data, t->data + t->bytes)});
  nlohmann::json config = ckpt->config();
  edit(tensors, config);
  const fs::path dir = fs::temp_directory_path() / ("kiln_hf_" + label + "_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  write_safetensors(dir / "model.safetensors", tensors);
  if (!config.is_null()) std::ofstream(dir / "config.json") << config.dump(2);
  std::string error;
  try {
    LoadedModel m(dir);
  } catch (const Error& e) {
    error = e.what();
  }
  fs::remove_all(dir);
  return error;
}

void drop(std::vector<OutTensor>& ts, const std::string& name) {
  std::erase_if(ts, [&](const OutTensor& t) { return t.name == name; });
}

TEST(HfCheckpointErrors, DamagedCheckpointsNameTheTensor) {
  KILN_REQUIRE_TESTDATA(llama, "arch/hf/llama/config.json");
  KILN_REQUIRE_TESTDATA(moe, "arch/hf/qwen3moe/config.json");
  KILN_REQUIRE_TESTDATA(next, "arch/hf/qwen3next/config.json");
  struct Case {
    const char* label;
    fs::path dir;
    std::function<void(std::vector<OutTensor>&, nlohmann::json&)> edit;
    std::vector<std::string> expect;  // substrings of the error
  };
  const std::vector<Case> cases = {
      {"intact", llama.parent_path(), [](auto&, auto&) {}, {}},
      {"missing", llama.parent_path(),
       [](auto& ts, auto&) { drop(ts, "model.layers.1.mlp.up_proj.weight"); },
       {"blk.1.ffn_up.weight", "model.layers.1.mlp.up_proj.weight"}},
      {"unknown", llama.parent_path(),
       [](auto& ts, auto&) { ts.push_back({"model.layers.0.mlp.extra.weight", "F32", {4}, std::vector<uint8_t>(16)}); },
       {"model.layers.0.mlp.extra.weight", "not used"}},
      {"layer_beyond", llama.parent_path(),
       [](auto& ts, auto&) {
         ts.push_back({"model.layers.7.input_layernorm.weight", "F32", {128}, std::vector<uint8_t>(512)});
       },
       {"model.layers.7.input_layernorm.weight", "layer 7"}},
      {"no_lm_head", llama.parent_path(), [](auto& ts, auto&) { drop(ts, "lm_head.weight"); },
       {"lm_head.weight", "tie_word_embeddings"}},
      {"no_config", llama.parent_path(), [](auto&, auto& cfg) { cfg = nullptr; }, {"config.json"}},
      {"missing_expert", moe.parent_path(),
       [](auto& ts, auto&) { drop(ts, "model.layers.1.mlp.experts.5.down_proj.weight"); },
       {"expert 5", "blk.1.ffn_down_exps.weight"}},
      {"expert_shape", moe.parent_path(),
       [](auto& ts, auto&) {
         for (OutTensor& t : ts)
           if (t.name == "model.layers.0.mlp.experts.2.gate_proj.weight") {
             t.shape = {32, 128};
             t.bytes.resize(32 * 128 * 4);
           }
       },
       {"model.layers.0.mlp.experts.2.gate_proj.weight"}},
      {"qkvz_rows", next.parent_path(),
       [](auto&, auto& cfg) { cfg["linear_value_head_dim"] = 16; },
       {"in_proj_qkvz", "rows expected"}},
      {"layer_types", next.parent_path(),
       [](auto&, auto& cfg) { cfg["layer_types"][0] = "full_attention"; },
       {"layer_types[0]"}},
  };
  for (const Case& c : cases) {
    const std::string error = load_error(c.dir, c.label, c.edit);
    if (c.expect.empty()) {
      EXPECT_EQ(error, "") << c.label;
      continue;
    }
    EXPECT_FALSE(error.empty()) << c.label << ": loaded without an error";
    for (const std::string& s : c.expect) EXPECT_NE(error.find(s), std::string::npos) << c.label << ": " << error;
    std::printf("[ %s ] %s\n", c.label, error.c_str());
  }
}

// The checkpoint with every value rounded to bfloat16, stored as BF16 (as most checkpoints
// are shipped) or as F32; returns the logits of `ids` and checks the weight types.
std::vector<float> rounded_checkpoint_logits(const fs::path& original, bool store_bf16,
                                             const std::vector<int32_t>& ids) {
  auto ckpt = safetensors::Checkpoint::open(original.string());
  std::vector<OutTensor> tensors;
  for (const safetensors::Tensor* t : ckpt->tensors()) {
    OutTensor o{t->name, store_bf16 ? "BF16" : "F32", t->shape, {}};
    for (int64_t i = 0; i < t->elements(); ++i) {
      float f;
      std::memcpy(&f, t->data + size_t(i) * 4, 4);
      const uint16_t h = f32_to_bf16(f);
      const float rounded = bf16_to_f32(h);
      const auto* p = store_bf16 ? reinterpret_cast<const uint8_t*>(&h) : reinterpret_cast<const uint8_t*>(&rounded);
      o.bytes.insert(o.bytes.end(), p, p + (store_bf16 ? 2 : 4));
    }
    tensors.push_back(std::move(o));
  }
  const fs::path dir = fs::temp_directory_path() /
                       ("kiln_hf_" + std::string(store_bf16 ? "bf16_" : "f32_") + std::to_string(::getpid()));
  fs::create_directories(dir);
  write_safetensors(dir / "model.safetensors", tensors);
  std::ofstream(dir / "config.json") << ckpt->config().dump(2);
  std::vector<float> logits;
  {
    LoadedModel m(dir);
    const LayerWeights& l0 = m.model->weights().layers[0];
    const GgmlType matrix = store_bf16 ? GgmlType::BF16 : GgmlType::F32;
    EXPECT_EQ(l0.exp_gate.dtype, matrix);   // experts stacked in their own type
    EXPECT_EQ(l0.ssm_qkv.dtype, matrix);    // in_proj_qkvz regrouped in its own type
    EXPECT_EQ(l0.ssm_a.dtype, GgmlType::F32);
    EXPECT_EQ(l0.ssm_conv.dtype, GgmlType::F32);
    EXPECT_EQ(l0.attn_norm.dtype, GgmlType::F32);
    logits = m.prefill_logits(ids);
  }
  fs::remove_all(dir);
  return logits;
}

// A bf16 checkpoint gives the logits of the same values stored as f32: what differs is
// only the widening at load and the bf16 matmul path.
TEST(HfCheckpointDtypes, Bf16CheckpointMatchesItsValuesInF32) {
  KILN_REQUIRE_TESTDATA(ref_path, "arch/qwen3next.ref.json");
  KILN_REQUIRE_TESTDATA(config, "arch/hf/qwen3next/config.json");
  const std::vector<int32_t> ids = to_ids(read_json(ref_path)["ids"]);
  const std::vector<float> a = rounded_checkpoint_logits(config.parent_path(), true, ids);
  const std::vector<float> b = rounded_checkpoint_logits(config.parent_path(), false, ids);
  ASSERT_EQ(a.size(), b.size());
  const int64_t vocab = int64_t(a.size() / ids.size());
  // Every position within 1e-5 (so the worst one too).
  const double worst = expect_rows_near(a.data(), b.data(), int64_t(ids.size()), vocab, 1e-5, "bf16 vs f32");
  std::printf("[ qwen3next bf16 checkpoint ] vs the same values in f32: max relative L2 %.3g\n", worst);
}

// The architectures without a checkpoint in testdata: a checkpoint is rebuilt from the
// converted GGUF by undoing the converter (names through the table in reverse, experts
// unstacked, llama's Wq/Wk rows un-permuted), with the config.json HF used; it must give
// HF's logits. This checks the config translation (biases, q/k norms, num_local_experts,
// llama3 rope scaling computed from the config) end to end.
class RebuiltCheckpoint : public ::testing::TestWithParam<std::string> {};

TEST_P(RebuiltCheckpoint, LogitsMatchTransformers) {
  const std::string name = GetParam();
  KILN_REQUIRE_TESTDATA(ref_path, "arch/" + name + ".ref.json");
  KILN_REQUIRE_TESTDATA(gguf_path, "arch/" + name + ".gguf");
  const nlohmann::json ref = read_json(ref_path);
  KILN_REQUIRE_TESTDATA(logits_path, "arch/" + ref["logits_file"].get<std::string>());
  const nlohmann::json config = ref["hf_config"];
  const HfModelConfig translated = translate_hf_config(config, name);
  const HfTensorTable* table = find_hf_tensor_table(translated.arch);
  ASSERT_TRUE(table);
  const int64_t head_dim = config["head_dim"];

  auto file = gguf::File::open(gguf_path.string());
  std::vector<OutTensor> tensors;
  for (const gguf::TensorInfo& t : file->tensors()) {
    if (t.name == "rope_freqs.weight") continue;  // computed from config.json instead
    ASSERT_EQ(t.type, GgmlType::F32) << t.name;
    // "blk.3.attn_q.weight" -> pattern "blk.{L}.attn_q.weight", layer 3.
    std::string pattern = t.name, layer;
    if (t.name.starts_with("blk.")) {
      const size_t dot = t.name.find('.', 4);
      layer = t.name.substr(4, dot - 4);
      pattern = "blk.{L}" + t.name.substr(dot);
    }
    const HfTensorRule* rule = nullptr;
    for (const HfTensorRule& r : table->rules)
      if (pattern == r.gguf) rule = &r;
    ASSERT_TRUE(rule) << t.name << ": no rule";
    std::string hf = rule->hf;
    if (size_t at = hf.find("{L}"); at != std::string::npos) hf.replace(at, 3, layer);
    const std::vector<int64_t> shape(t.shape.rbegin(), t.shape.rend());  // outermost first
    const size_t bytes = t.bytes;
    if (size_t at = hf.find("{E}"); at != std::string::npos) {
      const size_t per = bytes / size_t(shape[0]);
      for (int64_t e = 0; e < shape[0]; ++e) {
        std::string expert = hf;
        expert.replace(at, 3, std::to_string(e));
        tensors.push_back({expert, "F32", {shape[1], shape[2]}, std::vector<uint8_t>(t.data + e * per, t.data + (e + 1) * per)});
      }
      continue;
    }
    OutTensor o{hf, "F32", shape, std::vector<uint8_t>(t.data, t.data + bytes)};
    if (translated.arch == "llama" && (pattern.ends_with("attn_q.weight") || pattern.ends_with("attn_k.weight"))) {
      // The converter put HF row h*hd + i at h*hd + 2i and h*hd + hd/2 + i at h*hd + 2i + 1.
      const size_t row = bytes / size_t(shape[0]);
      for (int64_t r = 0; r < shape[0]; ++r) {
        const int64_t h = r / head_dim, i = r % head_dim;
        const int64_t from = h * head_dim + (i < head_dim / 2 ? 2 * i : 2 * (i - head_dim / 2) + 1);
        std::memcpy(o.bytes.data() + size_t(r) * row, t.data + size_t(from) * row, row);
      }
    }
    tensors.push_back(std::move(o));
  }
  const fs::path dir = fs::temp_directory_path() / ("kiln_hf_rebuilt_" + name + std::to_string(::getpid()));
  fs::create_directories(dir);
  write_safetensors(dir / "model.safetensors", tensors);
  std::ofstream(dir / "config.json") << config.dump(2);
  std::vector<float> logits;
  {
    LoadedModel m(dir);
    logits = m.prefill_logits(to_ids(ref["ids"]));
  }
  fs::remove_all(dir);
  const double worst = expect_logits_match(logits, read_reference_logits(ref, logits_path), 1e-4, name);
  std::printf("[ %s rebuilt checkpoint ] max relative L2 vs transformers: %.3g\n", name.c_str(), worst);
}

INSTANTIATE_TEST_SUITE_P(Arch, RebuiltCheckpoint, ::testing::Values("qwen2", "qwen3", "mixtral", "llama31-ropescale"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& c : s)
                             if (c == '-') c = '_';
                           return s;
                         });

}  // namespace
}  // namespace kiln::testing
