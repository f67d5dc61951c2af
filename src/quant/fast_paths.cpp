#include "quant/fast_paths.h"

#include "core/cpu_features.h"
#include "quant/iquant_kernels.h"

namespace kiln {
namespace {

#if defined(__x86_64__)
DequantizeFn avx2_kernel(GgmlType type) {
  using T = GgmlType;
  switch (type) {
    case T::F16: return avx2::dequantize_f16;
    case T::BF16: return avx2::dequantize_bf16;
    case T::Q4_0: return avx2::dequantize_q4_0;
    case T::Q4_1: return avx2::dequantize_q4_1;
    case T::Q5_0: return avx2::dequantize_q5_0;
    case T::Q5_1: return avx2::dequantize_q5_1;
    case T::Q8_0: return avx2::dequantize_q8_0;
    case T::Q8_1: return avx2::dequantize_q8_1;
    case T::Q2_K: return avx2::dequantize_q2_K;
    case T::Q3_K: return avx2::dequantize_q3_K;
    case T::Q4_K: return avx2::dequantize_q4_K;
    case T::Q5_K: return avx2::dequantize_q5_K;
    case T::Q6_K: return avx2::dequantize_q6_K;
    case T::MXFP4: return avx2::dequantize_mxfp4;
    case T::NVFP4: return avx2::dequantize_nvfp4;
    case T::TQ1_0: return avx2::dequantize_tq1_0;
    case T::TQ2_0: return avx2::dequantize_tq2_0;
    case T::Q1_0: return avx2::dequantize_q1_0;
    case T::Q2_0: return avx2::dequantize_q2_0;
    case T::IQ2_XXS: return avx2::dequantize_iq2_xxs;
    case T::IQ2_XS: return avx2::dequantize_iq2_xs;
    case T::IQ2_S: return avx2::dequantize_iq2_s;
    case T::IQ3_XXS: return avx2::dequantize_iq3_xxs;
    case T::IQ3_S: return avx2::dequantize_iq3_s;
    case T::IQ1_S: return avx2::dequantize_iq1_s;
    case T::IQ1_M: return avx2::dequantize_iq1_m;
    case T::IQ4_NL: return iquant::dequantize_iq4_nl_avx2;
    case T::IQ4_XS: return iquant::dequantize_iq4_xs_avx2;
    default: return nullptr;
  }
}

DequantizeFn avx512_kernel(GgmlType type) {
  using T = GgmlType;
  switch (type) {
    case T::F16: return avx512::dequantize_f16;
    case T::BF16: return avx512::dequantize_bf16;
    case T::Q4_0: return avx512::dequantize_q4_0;
    case T::Q8_0: return avx512::dequantize_q8_0;
    case T::Q2_K: return avx512::dequantize_q2_K;
    case T::Q3_K: return avx512::dequantize_q3_K;
    case T::Q4_K: return avx512::dequantize_q4_K;
    case T::Q5_K: return avx512::dequantize_q5_K;
    case T::Q6_K: return avx512::dequantize_q6_K;
    case T::MXFP4: return avx512::dequantize_mxfp4;
    case T::IQ4_NL: return avx512::dequantize_iq4_nl;
    case T::IQ4_XS: return avx512::dequantize_iq4_xs;
    default: return nullptr;
  }
}
#endif

}  // namespace

DequantizeFn fast_dequantizer_at(GgmlType type, SimdLevel level) {
#if defined(__x86_64__)
  const CpuFeatures& cpu = cpu_features();
  switch (level) {
    case SimdLevel::Scalar: return nullptr;
    case SimdLevel::Avx2: return cpu.avx2 ? avx2_kernel(type) : nullptr;
    case SimdLevel::Avx512: return cpu.avx512 ? avx512_kernel(type) : nullptr;
  }
#endif
  (void)type;
  (void)level;
  return nullptr;
}

DequantizeFn fast_dequantizer(GgmlType type) {
  // Types without an AVX-512 kernel keep their AVX2 one on AVX-512 processors.
  if (DequantizeFn f = fast_dequantizer_at(type, SimdLevel::Avx512)) return f;
  return fast_dequantizer_at(type, SimdLevel::Avx2);
}

}  // namespace kiln
