#include "quant/types.h"

#include <array>
#include <cctype>

#include "core/error.h"

namespace kiln {
namespace {

// Block geometry of each type as defined by ggml (ggml-common.h block structs).
constexpr std::array kTypes = {
    TypeTraits{GgmlType::F32, "f32", 1, 4, false},
    TypeTraits{GgmlType::F16, "f16", 1, 2, false},
    TypeTraits{GgmlType::Q4_0, "q4_0", 32, 18, true},
    TypeTraits{GgmlType::Q4_1, "q4_1", 32, 20, true},
    TypeTraits{GgmlType::Q5_0, "q5_0", 32, 22, true},
    TypeTraits{GgmlType::Q5_1, "q5_1", 32, 24, true},
    TypeTraits{GgmlType::Q8_0, "q8_0", 32, 34, true},
    TypeTraits{GgmlType::Q8_1, "q8_1", 32, 36, true},
    TypeTraits{GgmlType::Q2_K, "q2_K", 256, 84, true},
    TypeTraits{GgmlType::Q3_K, "q3_K", 256, 110, true},
    TypeTraits{GgmlType::Q4_K, "q4_K", 256, 144, true},
    TypeTraits{GgmlType::Q5_K, "q5_K", 256, 176, true},
    TypeTraits{GgmlType::Q6_K, "q6_K", 256, 210, true},
    TypeTraits{GgmlType::Q8_K, "q8_K", 256, 292, true},
    TypeTraits{GgmlType::IQ2_XXS, "iq2_xxs", 256, 66, true},
    TypeTraits{GgmlType::IQ2_XS, "iq2_xs", 256, 74, true},
    TypeTraits{GgmlType::IQ3_XXS, "iq3_xxs", 256, 98, true},
    TypeTraits{GgmlType::IQ1_S, "iq1_s", 256, 50, true},
    TypeTraits{GgmlType::IQ4_NL, "iq4_nl", 32, 18, true},
    TypeTraits{GgmlType::IQ3_S, "iq3_s", 256, 110, true},
    TypeTraits{GgmlType::IQ2_S, "iq2_s", 256, 82, true},
    TypeTraits{GgmlType::IQ4_XS, "iq4_xs", 256, 136, true},
    TypeTraits{GgmlType::I8, "i8", 1, 1, false},
    TypeTraits{GgmlType::I16, "i16", 1, 2, false},
    TypeTraits{GgmlType::I32, "i32", 1, 4, false},
    TypeTraits{GgmlType::I64, "i64", 1, 8, false},
    TypeTraits{GgmlType::F64, "f64", 1, 8, false},
    TypeTraits{GgmlType::IQ1_M, "iq1_m", 256, 56, true},
    TypeTraits{GgmlType::BF16, "bf16", 1, 2, false},
    TypeTraits{GgmlType::TQ1_0, "tq1_0", 256, 54, true},
    TypeTraits{GgmlType::TQ2_0, "tq2_0", 256, 66, true},
    TypeTraits{GgmlType::MXFP4, "mxfp4", 32, 17, true},
    TypeTraits{GgmlType::NVFP4, "nvfp4", 64, 36, true},
    TypeTraits{GgmlType::Q1_0, "q1_0", 128, 18, true},
    TypeTraits{GgmlType::Q2_0, "q2_0", 64, 18, true},
};

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i])))
      return false;
  return true;
}

}  // namespace

std::optional<TypeTraits> type_traits(uint32_t id) {
  for (const auto& t : kTypes)
    if (static_cast<uint32_t>(t.type) == id) return t;
  return std::nullopt;
}

const TypeTraits& traits(GgmlType type) {
  for (const auto& t : kTypes)
    if (t.type == type) return t;
  fail("unknown tensor type id {}", static_cast<uint32_t>(type));
}

std::optional<GgmlType> type_from_name(std::string_view name) {
  for (const auto& t : kTypes)
    if (iequals(t.name, name)) return t.type;
  return std::nullopt;
}

std::optional<size_t> row_bytes(GgmlType type, int64_t n) {
  const TypeTraits& t = traits(type);
  if (n < 0 || n % t.block_size != 0) return std::nullopt;
  return size_t(n / t.block_size) * t.type_size;
}

const TypeTraits* all_types(size_t* count) {
  *count = kTypes.size();
  return kTypes.data();
}

}  // namespace kiln
