#include "quant/model_quantizer.h"

#include <array>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "core/thread_pool.h"
#include "formats/gguf_writer.h"
#include "quant/quant.h"

namespace kiln {
namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_float_type(GgmlType t) { return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16; }

// Converts one tensor's rows from the input type to `out_type`, rows split over threads.
std::vector<uint8_t> convert_tensor(const gguf::TensorInfo& t, GgmlType out_type, ThreadPool& pool) {
  const int64_t cols = t.shape.empty() ? 1 : t.shape[0];
  const int64_t rows = t.rows();
  const size_t in_row = *row_bytes(t.type, cols);
  const size_t out_row = *row_bytes(out_type, cols);
  std::vector<uint8_t> out(out_row * size_t(rows));
  pool.parallel_for(rows, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> row(static_cast<size_t>(cols));
    for (int64_t r = begin; r < end; ++r) {
      dequantize_row(t.type, t.data + size_t(r) * in_row, row.data(), cols);
      quantize_row(out_type, row.data(), out.data() + size_t(r) * out_row, cols);
    }
  });
  return out;
}

}  // namespace

bool should_quantize(const std::string& name, const std::vector<int64_t>& shape) {
  if (shape.size() < 2 || !ends_with(name, ".weight")) return false;
  // Tensors llama.cpp keeps in float: norms, MoE routers, positional/type embeddings,
  // state-space and linear-attention parameters that are small and precision-sensitive.
  static constexpr std::array<std::string_view, 8> kKeep = {
      "norm", "ffn_gate_inp", "rope_freqs", "ssm_conv1d", "ssm_a", "ssm_dt", "pos_embd", "token_types"};
  for (std::string_view k : kKeep)
    if (name.find(k) != std::string::npos) return false;
  return true;
}

GgmlType fallback_type(GgmlType wanted, int64_t row_length) {
  if (row_bytes(wanted, row_length)) return wanted;
  // Fall back along the same quality: k-quants and 256-blocks to a 32-block type of
  // similar precision, then to F16, which fits every row.
  GgmlType candidate = GgmlType::F16;
  switch (wanted) {
    case GgmlType::Q2_K: case GgmlType::Q3_K: case GgmlType::Q4_K: case GgmlType::IQ4_XS: candidate = GgmlType::Q4_0; break;
    case GgmlType::Q5_K: candidate = GgmlType::Q5_0; break;
    case GgmlType::Q6_K: candidate = GgmlType::Q8_0; break;
    default: break;
  }
  return row_bytes(candidate, row_length) ? candidate : GgmlType::F16;
}

int32_t file_type_for(GgmlType type) {
  switch (type) {
    case GgmlType::F32: return 0;
    case GgmlType::F16: return 1;
    case GgmlType::Q4_0: return 2;
    case GgmlType::Q4_1: return 3;
    case GgmlType::Q8_0: return 7;
    case GgmlType::Q5_0: return 8;
    case GgmlType::Q5_1: return 9;
    case GgmlType::Q2_K: return 10;
    case GgmlType::Q3_K: return 11;  // Q3_K_S: all matrices Q3_K
    case GgmlType::Q4_K: return 14;  // Q4_K_S
    case GgmlType::Q5_K: return 16;  // Q5_K_S
    case GgmlType::Q6_K: return 18;
    case GgmlType::IQ4_NL: return 25;
    case GgmlType::IQ4_XS: return 30;
    case GgmlType::BF16: return 32;
    case GgmlType::MXFP4: return 38;
    default: return 1024;  // LLAMA_FTYPE_GUESSED: no preset names this mix
  }
}

QuantizeReport quantize_model(const gguf::File& input, const std::string& output_path, const QuantizeOptions& options) {
  if (!can_quantize(options.type)) fail("kiln cannot quantize into {}", type_name(options.type));

  gguf::Writer writer;
  writer.copy_metadata_from(input);
  writer.set_u32("general.file_type", uint32_t(file_type_for(options.type)));
  writer.set_u32("general.quantization_version", 2);

  QuantizeReport report;
  std::vector<GgmlType> out_types;
  for (const auto& t : input.tensors()) {
    GgmlType out = t.type;
    if (should_quantize(t.name, t.shape)) {
      if (!is_float_type(t.type) && !options.allow_requantize)
        fail("{}: tensor '{}' is already {}; requantizing loses precision twice (pass --allow-requantize to do it anyway)",
             input.paths().front(), t.name, type_name(t.type));
      out = fallback_type(options.type, t.shape[0]);
      if (out != options.type) ++report.tensors_fallback;
      else ++report.tensors_quantized;
    } else {
      ++report.tensors_kept;
    }
    out_types.push_back(out);
    writer.add_tensor(t.name, out, t.shape);
    report.input_bytes += t.bytes;
  }

  ThreadPool pool(options.threads);
  gguf::DataStream stream = writer.begin(output_path);
  uint64_t done = 0;
  for (size_t i = 0; i < input.tensors().size(); ++i) {
    const gguf::TensorInfo& t = input.tensors()[i];
    if (out_types[i] == t.type) {
      stream.write_tensor(t.name, {t.data, t.bytes});
      report.output_bytes += t.bytes;
    } else {
      const std::vector<uint8_t> bytes = convert_tensor(t, out_types[i], pool);
      stream.write_tensor(t.name, bytes);
      report.output_bytes += bytes.size();
    }
    done += t.bytes;
    if (options.progress) options.progress(done, report.input_bytes, t.name);
  }
  stream.finish();
  return report;
}

}  // namespace kiln
