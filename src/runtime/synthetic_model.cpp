#include "runtime/synthetic_model.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/thread_pool.h"
#include "formats/gguf.h"
#include "formats/gguf_writer.h"
#include "quant/model_quantizer.h"
#include "quant/quant.h"

namespace kiln {

namespace {

constexpr float kWeightStd = 0.02f;
constexpr int64_t kChunkElements = int64_t(1) << 22;  // generated and quantized per slice

// ---- tensor list ------------------------------------------------------------------------

struct TensorListBuilder {
  std::vector<SyntheticTensor> tensors;

  void matrix(std::string name, std::vector<int64_t> shape) {
    tensors.push_back({std::move(name), std::move(shape), GgmlType::F32, 0.0f, true});
  }
  void constant(std::string name, std::vector<int64_t> shape, float value) {
    tensors.push_back({std::move(name), std::move(shape), GgmlType::F32, value, false});
  }
};

bool is_recurrent_layer(const SyntheticShape& s, int il) {
  return s.full_attention_interval > 0 && (il + 1) % s.full_attention_interval != 0;
}

void add_attention(TensorListBuilder& b, const SyntheticShape& s, const std::string& p) {
  const int64_t E = s.n_embd, q = int64_t(s.n_head) * s.head_dim, kv = int64_t(s.n_head_kv) * s.head_dim;
  // qwen3next's attention is gated: attn_q yields the queries and as many gate values.
  b.matrix(p + "attn_q.weight", {E, s.arch == "qwen3next" ? 2 * q : q});
  b.matrix(p + "attn_k.weight", {E, kv});
  b.matrix(p + "attn_v.weight", {E, kv});
  b.matrix(p + "attn_output.weight", {q, E});
  if (s.qk_norm) {
    b.constant(p + "attn_q_norm.weight", {s.head_dim}, 1.0f);
    b.constant(p + "attn_k_norm.weight", {s.head_dim}, 1.0f);
  }
}

// GatedDeltaNet, with llama.cpp's qwen3next tensor names and shapes.
void add_linear_attention(TensorListBuilder& b, const SyntheticShape& s, const std::string& p) {
  const int64_t E = s.n_embd, nv = s.linear_v_heads;
  const int64_t key_dim = int64_t(s.linear_k_heads) * s.linear_head_dim_k, value_dim = nv * s.linear_head_dim_v;
  const int64_t conv_channels = 2 * key_dim + value_dim;
  b.constant(p + "ssm_a", {nv}, -1.0f);  // -exp(A_log) with A_log = 0
  b.matrix(p + "ssm_conv1d.weight", {s.conv_kernel, conv_channels});
  b.constant(p + "ssm_dt.bias", {nv}, 0.0f);
  b.matrix(p + "ssm_ba.weight", {E, 2 * nv});
  b.matrix(p + "attn_qkv.weight", {E, conv_channels});
  b.matrix(p + "attn_gate.weight", {E, value_dim});
  b.constant(p + "ssm_norm.weight", {s.linear_head_dim_v}, 1.0f);
  b.matrix(p + "ssm_out.weight", {value_dim, E});
}

void add_ffn(TensorListBuilder& b, const SyntheticShape& s, const std::string& p) {
  const int64_t E = s.n_embd;
  if (s.n_expert == 0) {
    b.matrix(p + "ffn_gate.weight", {E, s.n_ff});
    b.matrix(p + "ffn_up.weight", {E, s.n_ff});
    b.matrix(p + "ffn_down.weight", {s.n_ff, E});
    return;
  }
  const int64_t F = s.n_ff_expert, X = s.n_expert;
  b.matrix(p + "ffn_gate_inp.weight", {E, X});
  b.matrix(p + "ffn_gate_exps.weight", {E, F, X});
  b.matrix(p + "ffn_up_exps.weight", {E, F, X});
  b.matrix(p + "ffn_down_exps.weight", {F, E, X});
  if (s.n_ff_shared_expert > 0) {
    const int64_t S = s.n_ff_shared_expert;
    b.matrix(p + "ffn_gate_inp_shexp.weight", {E, 1});
    b.matrix(p + "ffn_gate_shexp.weight", {E, S});
    b.matrix(p + "ffn_up_shexp.weight", {E, S});
    b.matrix(p + "ffn_down_shexp.weight", {S, E});
  }
}

// llama.cpp's rule for the layers that get more bits in the _M mixes: the first and last
// eighth, and every third layer between.
bool uses_more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

GgmlType type_for(const SyntheticTensor& t, const SynthOptions& o, int layer, int n_layer, int attn_v_index,
                  int n_attn_v) {
  if (!should_quantize(t.name, t.shape)) return GgmlType::F32;
  GgmlType want = o.q4_k_m ? GgmlType::Q4_K : o.type;
  if (o.q4_k_m) {
    if (t.name == "output.weight") want = GgmlType::Q6_K;
    if (ends_with(t.name, "attn_v.weight") && uses_more_bits(attn_v_index, n_attn_v)) want = GgmlType::Q6_K;
    if (t.name.find("ffn_down") != std::string::npos && uses_more_bits(layer, n_layer)) want = GgmlType::Q6_K;
  }
  return fallback_type(want, t.shape[0]);
}

// ---- random numbers -----------------------------------------------------------------------

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// xoshiro256+ seeded per row, so rows come out the same on any number of threads.
class RowRandom {
 public:
  RowRandom(uint64_t seed, uint64_t tensor, uint64_t row) {
    uint64_t x = seed ^ (tensor * 0xD1B54A32D192ED03ull) ^ (row * 0x8CB92BA72F3D8DD7ull);
    for (uint64_t& w : s_) w = splitmix64(x);
  }
  uint64_t next() {
    const uint64_t result = s_[0] + s_[3];
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = (s_[3] << 45) | (s_[3] >> 19);
    return result;
  }
  // Approximately normal (mean 0, std 1): the sum of four 16-bit uniforms, centred and
  // scaled (Irwin-Hall). One generator step per number; tails end at 3.46 sigma, which
  // random benchmark weights do not miss.
  float normal() {
    const uint64_t r = next();
    const uint32_t sum = uint32_t(r & 0xFFFF) + uint32_t((r >> 16) & 0xFFFF) + uint32_t((r >> 32) & 0xFFFF) +
                         uint32_t(r >> 48);
    constexpr float kScale = 1.7320508f / 65536.0f;  // sqrt(12 / 4) per unit of 65536
    return (float(sum) + 2.0f - 2.0f * 65536.0f) * kScale;
  }

 private:
  uint64_t s_[4];
};

// ---- metadata -----------------------------------------------------------------------------

int32_t file_type_of(const SynthOptions& o) {
  return o.q4_k_m ? 15 /* LLAMA_FTYPE_MOSTLY_Q4_K_M */ : file_type_for(o.type);
}

void set_model_metadata(gguf::Writer& w, const SyntheticShape& s, const SynthOptions& o) {
  const std::string a = s.arch + ".";
  w.set_string("general.architecture", s.arch);
  w.set_string("general.type", "model");
  w.set_string("general.name", s.name);
  w.set_u32("general.file_type", uint32_t(file_type_of(o)));
  w.set_u32("general.quantization_version", 2);
  w.set_u32(a + "block_count", uint32_t(s.n_layer));
  w.set_u32(a + "context_length", uint32_t(s.n_ctx_train));
  w.set_u32(a + "embedding_length", uint32_t(s.n_embd));
  w.set_u32(a + "feed_forward_length", uint32_t(s.n_ff));
  w.set_u32(a + "attention.head_count", uint32_t(s.n_head));
  w.set_u32(a + "attention.head_count_kv", uint32_t(s.n_head_kv));
  w.set_f32(a + "rope.freq_base", s.rope_base);
  w.set_f32(a + "attention.layer_norm_rms_epsilon", s.rms_eps);
  if (s.head_dim * s.n_head != s.n_embd) {
    w.set_u32(a + "attention.key_length", uint32_t(s.head_dim));
    w.set_u32(a + "attention.value_length", uint32_t(s.head_dim));
  }
  w.set_u32(a + "rope.dimension_count", uint32_t(std::lround(s.head_dim * s.partial_rotary)));
  w.set_u32(a + "vocab_size", uint32_t(s.n_vocab));
  if (s.n_expert > 0) {
    w.set_u32(a + "expert_count", uint32_t(s.n_expert));
    w.set_u32(a + "expert_used_count", uint32_t(s.n_expert_used));
    w.set_u32(a + "expert_feed_forward_length", uint32_t(s.n_ff_expert));
  }
  if (s.n_ff_shared_expert > 0) w.set_u32(a + "expert_shared_feed_forward_length", uint32_t(s.n_ff_shared_expert));
  if (s.full_attention_interval > 0) {
    w.set_u32(a + "ssm.conv_kernel", uint32_t(s.conv_kernel));
    w.set_u32(a + "ssm.state_size", uint32_t(s.linear_head_dim_k));
    w.set_u32(a + "ssm.group_count", uint32_t(s.linear_k_heads));
    w.set_u32(a + "ssm.time_step_rank", uint32_t(s.linear_v_heads));
    w.set_u32(a + "ssm.inner_size", uint32_t(s.linear_v_heads * s.linear_head_dim_v));
    w.set_u32(a + "full_attention_interval", uint32_t(s.full_attention_interval));
  }
}

// A SentencePiece-style vocabulary of the 256 bytes (plus unk/bos/eos), padded with unused
// tokens to the model's size: enough for any text to tokenize and decode.
void set_placeholder_vocab(gguf::Writer& w, int n_vocab) {
  KILN_CHECK(n_vocab >= 259, "a placeholder vocabulary needs at least 259 tokens, the model has {}", n_vocab);
  std::vector<gguf::MetaValue> tokens, scores, types;
  auto add = [&](std::string text, int32_t type) {
    tokens.push_back(gguf::MetaValue::string(text));
    scores.push_back(gguf::MetaValue::f32(0.0f));
    types.push_back(gguf::MetaValue::i32(type));
  };
  add("<unk>", 2);
  add("<s>", 3);
  add("</s>", 3);
  for (int b = 0; b < 256; ++b) add(fmt::format("<0x{:02X}>", b), 6);
  for (int i = 259; i < n_vocab; ++i) add(fmt::format("<unused{}>", i - 259), 5);
  w.set_string("tokenizer.ggml.model", "llama");
  w.set_string("tokenizer.ggml.pre", "default");
  w.set_array("tokenizer.ggml.tokens", gguf::ValueType::STRING, std::move(tokens));
  w.set_array("tokenizer.ggml.scores", gguf::ValueType::F32, std::move(scores));
  w.set_array("tokenizer.ggml.token_type", gguf::ValueType::I32, std::move(types));
  w.set_u32("tokenizer.ggml.unknown_token_id", 0);
  w.set_u32("tokenizer.ggml.bos_token_id", 1);
  w.set_u32("tokenizer.ggml.eos_token_id", 2);
  w.set_bool("tokenizer.ggml.add_bos_token", true);
}

// Copies tokenizer.* from the vocabulary file; returns its number of tokens.
int copy_vocab(gguf::Writer& w, const std::string& path) {
  auto vocab = gguf::File::open(path);
  const gguf::Value* tokens = vocab->find("tokenizer.ggml.tokens");
  KILN_CHECK(tokens != nullptr, "{}: no tokenizer.ggml.tokens: not a vocabulary file", path);
  for (const auto& [key, value] : vocab->metadata())
    if (key.rfind("tokenizer.", 0) == 0) w.set(key, gguf::MetaValue::from(value));
  return int(tokens->as_array("tokenizer.ggml.tokens").size());
}

// ---- writing ------------------------------------------------------------------------------

// Generates rows [row0, row0 + n_rows) of tensor `index` and encodes them into `out`. With
// `row_pool` (encoded rows, back to back), each row is a copy of one pool row instead.
void fill_rows(const SyntheticTensor& t, uint64_t seed, uint64_t index, int64_t row0, int64_t n_rows,
               std::vector<uint8_t>& out, ThreadPool& pool, const std::vector<uint8_t>* row_pool = nullptr) {
  const int64_t cols = t.shape[0];
  const size_t out_row = *row_bytes(t.type, cols);
  out.resize(out_row * size_t(n_rows));
  if (row_pool) {
    const int64_t pool_rows = int64_t(row_pool->size() / out_row);
    for (int64_t r = 0; r < n_rows; ++r) {
      RowRandom rng(seed, index, uint64_t(row0 + r));
      const int64_t pick = int64_t(rng.next() % uint64_t(pool_rows));
      std::copy_n(row_pool->data() + size_t(pick) * out_row, out_row, out.data() + size_t(r) * out_row);
    }
    return;
  }
  pool.parallel_for(n_rows, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> row(size_t(cols), t.fill);
    for (int64_t r = begin; r < end; ++r) {
      if (t.random) {
        RowRandom rng(seed, index, uint64_t(row0 + r));
        for (float& x : row) x = kWeightStd * rng.normal();
      }
      uint8_t* dst = out.data() + size_t(r) * out_row;
      if (t.type == GgmlType::F32) std::copy(row.begin(), row.end(), reinterpret_cast<float*>(dst));
      else quantize_row(t.type, row.data(), dst, cols);
    }
  });
}

}  // namespace

std::vector<SyntheticTensor> synthetic_tensors(const SyntheticShape& s, const SynthOptions& o) {
  KILN_CHECK(s.n_layer > 0 && s.n_embd > 0 && s.n_head > 0 && s.n_head_kv > 0 && s.head_dim > 0 && s.n_vocab > 0,
             "synthetic model '{}': incomplete shape", s.name);
  TensorListBuilder b;
  b.matrix("token_embd.weight", {s.n_embd, s.n_vocab});
  for (int il = 0; il < s.n_layer; ++il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    b.constant(p + "attn_norm.weight", {s.n_embd}, 1.0f);
    if (is_recurrent_layer(s, il)) add_linear_attention(b, s, p);
    else add_attention(b, s, p);
    // qwen3next names the norm before the FFN post_attention_norm; the others ffn_norm.
    b.constant(p + (s.arch == "qwen3next" ? "post_attention_norm.weight" : "ffn_norm.weight"), {s.n_embd}, 1.0f);
    add_ffn(b, s, p);
  }
  b.constant("output_norm.weight", {s.n_embd}, 1.0f);
  if (!s.tied_output) b.matrix("output.weight", {s.n_embd, s.n_vocab});

  int n_attn_v = 0;
  for (const SyntheticTensor& t : b.tensors) n_attn_v += ends_with(t.name, "attn_v.weight");
  int attn_v_index = 0;
  for (SyntheticTensor& t : b.tensors) {
    int layer = -1;
    if (t.name.rfind("blk.", 0) == 0) layer = std::stoi(t.name.substr(4));
    t.type = type_for(t, o, layer, s.n_layer, attn_v_index, n_attn_v);
    if (ends_with(t.name, "attn_v.weight")) ++attn_v_index;
  }
  return b.tensors;
}

SynthReport write_synthetic_model(SyntheticShape shape, const SynthOptions& o, const std::string& path) {
  const bool f32 = o.type == GgmlType::F32;
  KILN_CHECK(o.q4_k_m || f32 || can_quantize(o.type), "synth: kiln cannot quantize into {}", type_name(o.type));
  gguf::Writer w;
  int vocab_size = 0;
  if (!o.vocab_path.empty()) {
    // Read the vocabulary first: its size decides the embedding's.
    gguf::Writer vocab_meta;
    vocab_size = copy_vocab(vocab_meta, o.vocab_path);
    shape.n_vocab = vocab_size;
    set_model_metadata(w, shape, o);
    for (const auto& [key, value] : vocab_meta.metadata()) w.set(key, value);
  } else {
    set_model_metadata(w, shape, o);
    set_placeholder_vocab(w, shape.n_vocab);
  }

  const std::vector<SyntheticTensor> tensors = synthetic_tensors(shape, o);
  SynthReport report;
  uint64_t total_bytes = 0;
  for (const SyntheticTensor& t : tensors) {
    w.add_tensor(t.name, t.type, t.shape);
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    report.n_params += uint64_t(n);
    total_bytes += w.tensors().back().bytes;
  }
  report.n_tensors = int(tensors.size());

  ThreadPool pool(o.threads);
  gguf::DataStream stream = w.begin(path);
  std::vector<uint8_t> slice;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const SyntheticTensor& t = tensors[i];
    int64_t rows = 1;
    for (size_t d = 1; d < t.shape.size(); ++d) rows *= t.shape[d];
    const int64_t rows_per_slice = std::max<int64_t>(1, kChunkElements / t.shape[0]);
    std::vector<uint8_t> row_pool;
    const bool pooled = o.row_pool && t.random && t.type != GgmlType::F32 && rows > kSynthPoolRows;
    if (pooled) fill_rows(t, o.seed, uint64_t(i), rows, kSynthPoolRows, row_pool, pool);  // rows past the end
    for (int64_t r = 0; r < rows; r += rows_per_slice) {
      const int64_t n = std::min(rows_per_slice, rows - r);
      fill_rows(t, o.seed, uint64_t(i), r, n, slice, pool, pooled ? &row_pool : nullptr);
      stream.write(slice);
      report.bytes += slice.size();
      if (o.progress) o.progress(report.bytes, total_bytes, t.name);
    }
  }
  stream.finish();
  return report;
}

}  // namespace kiln
