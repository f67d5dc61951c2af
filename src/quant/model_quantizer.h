#pragma once
// Converting a whole GGUF model to another weight type (`kiln quantize`).
//
// Matrices (tensors of two or more dimensions named *.weight) become the target type;
// vectors, norms, MoE routers and the other small tensors that llama.cpp also keeps in
// float stay as they are. A matrix whose rows are not whole blocks of the target type
// falls back to a type that fits (see fallback_type). The output is a standard GGUF v3
// file: the input's metadata with general.file_type updated, written tensor by tensor.
#include <cstdint>
#include <functional>
#include <string>

#include "formats/gguf.h"
#include "quant/types.h"

namespace kiln {

struct QuantizeOptions {
  GgmlType type = GgmlType::Q8_0;
  int threads = 0;                 // 0: all cores
  bool allow_requantize = false;   // accept already-quantized inputs (lossy twice)
  // Called after each tensor with (bytes of input done, bytes of input in all).
  std::function<void(uint64_t done, uint64_t total, const std::string& tensor)> progress;
};

struct QuantizeReport {
  int tensors_quantized = 0;
  int tensors_kept = 0;
  int tensors_fallback = 0;  // quantized to a fallback type because rows did not fit
  uint64_t input_bytes = 0;
  uint64_t output_bytes = 0;
};

// Whether `name` with `shape` is a matrix that quantization should convert.
bool should_quantize(const std::string& name, const std::vector<int64_t>& shape);

// The type a matrix with rows of `row_length` gets when `wanted` does not fit: the
// closest type whose block size divides the row, or F16.
GgmlType fallback_type(GgmlType wanted, int64_t row_length);

// llama.cpp's general.file_type value for a model mostly of `type` (LLAMA_FTYPE_*).
int32_t file_type_for(GgmlType type);

QuantizeReport quantize_model(const gguf::File& input, const std::string& output_path, const QuantizeOptions& options);

}  // namespace kiln
