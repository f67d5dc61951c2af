// The i-quant family's codecs: iq1_s, iq1_m, iq2_xxs, iq2_xs, iq2_s, iq3_xxs, iq3_s
// (lattice types, quant/iquant_lattice.cpp) and iq4_nl, iq4_xs (quant/iquant_iq4.cpp).
// kiln quantizes into iq4_nl and iq4_xs only; the lattice types are read-only.
#include "quant/codec.h"
#include "quant/fast_paths.h"
#include "quant/iquant_kernels.h"

namespace kiln {

std::span<const RowCodec> iquant_codecs() {
  using namespace iquant;
  using T = GgmlType;
  static const RowCodec codecs[] = {
      {T::IQ2_XXS, dequantize_iq2_xxs, fast_dequantizer(T::IQ2_XXS), nullptr},
      {T::IQ2_XS, dequantize_iq2_xs, fast_dequantizer(T::IQ2_XS), nullptr},
      {T::IQ2_S, dequantize_iq2_s, fast_dequantizer(T::IQ2_S), nullptr},
      {T::IQ3_XXS, dequantize_iq3_xxs, fast_dequantizer(T::IQ3_XXS), nullptr},
      {T::IQ3_S, dequantize_iq3_s, fast_dequantizer(T::IQ3_S), nullptr},
      {T::IQ1_S, dequantize_iq1_s, fast_dequantizer(T::IQ1_S), nullptr},
      {T::IQ1_M, dequantize_iq1_m, fast_dequantizer(T::IQ1_M), nullptr},
      {T::IQ4_NL, dequantize_iq4_nl, fast_dequantizer(T::IQ4_NL), quantize_iq4_nl},
      {T::IQ4_XS, dequantize_iq4_xs, fast_dequantizer(T::IQ4_XS), quantize_iq4_xs},
  };
  return codecs;
}

}  // namespace kiln
