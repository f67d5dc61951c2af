#pragma once
// The tensor element types of ggml/GGUF, with their numeric ids as stored in GGUF files
// and their block geometry. A quantized row of n elements is n / block_size blocks of
// type_size bytes each, stored exactly as on disk.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace kiln {

enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22,
  IQ4_XS = 23, I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30,
  TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39, NVFP4 = 40, Q1_0 = 41, Q2_0 = 42,
};

struct TypeTraits {
  GgmlType type;
  std::string_view name;  // lower-case ggml name, e.g. "q4_K", "iq2_xxs", "f16"
  uint32_t block_size;    // elements per block (1 for plain types)
  uint32_t type_size;     // bytes per block
  bool is_quantized;
};

// Traits of a known type, or nullopt for an id kiln does not know (e.g. removed ids).
std::optional<TypeTraits> type_traits(uint32_t id);
const TypeTraits& traits(GgmlType type);  // type must be known

// Parses a type name, case-insensitively ("Q4_K", "q4_k", "bf16").
std::optional<GgmlType> type_from_name(std::string_view name);

inline std::string_view type_name(GgmlType t) { return traits(t).name; }

// Bytes of a row of n elements; nullopt when n is not a multiple of the block size.
std::optional<size_t> row_bytes(GgmlType type, int64_t n);

// Every known type, in id order (for listings and exhaustive tests).
const TypeTraits* all_types(size_t* count);

}  // namespace kiln
