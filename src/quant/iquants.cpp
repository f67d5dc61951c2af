// The i-quant family's codecs: iq1_s, iq1_m, iq2_xxs, iq2_xs, iq2_s, iq3_xxs, iq3_s
// (lattice types, quant/iquant_lattice.cpp) and iq4_nl, iq4_xs (quant/iquant_iq4.cpp).
// kiln quantizes into iq4_nl and iq4_xs only; the lattice types are read-only.
#include <array>

#include "core/cpu_features.h"
#include "quant/codec.h"
#include "quant/iquant_kernels.h"

namespace kiln {

std::span<const RowCodec> iquant_codecs() {
  using namespace iquant;
  static const std::array<RowCodec, 9> codecs = [] {
    const bool avx2 = cpu_features().avx2;
    return std::array<RowCodec, 9>{{
        {GgmlType::IQ2_XXS, dequantize_iq2_xxs, nullptr, nullptr},
        {GgmlType::IQ2_XS, dequantize_iq2_xs, nullptr, nullptr},
        {GgmlType::IQ2_S, dequantize_iq2_s, nullptr, nullptr},
        {GgmlType::IQ3_XXS, dequantize_iq3_xxs, nullptr, nullptr},
        {GgmlType::IQ3_S, dequantize_iq3_s, nullptr, nullptr},
        {GgmlType::IQ1_S, dequantize_iq1_s, nullptr, nullptr},
        {GgmlType::IQ1_M, dequantize_iq1_m, nullptr, nullptr},
        {GgmlType::IQ4_NL, dequantize_iq4_nl, avx2 ? dequantize_iq4_nl_avx2 : nullptr,
         quantize_iq4_nl},
        {GgmlType::IQ4_XS, dequantize_iq4_xs, avx2 ? dequantize_iq4_xs_avx2 : nullptr,
         quantize_iq4_xs},
    }};
  }();
  return codecs;
}

}  // namespace kiln
