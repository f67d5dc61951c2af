#include "quant/fast_paths.h"

#include "core/cpu_features.h"

namespace kiln {

DequantizeFn fast_dequantizer(Fast kind) {
#if defined(__x86_64__)
  if (cpu_features().avx2) {
    switch (kind) {
      case Fast::F16: return avx2::dequantize_f16;
      case Fast::BF16: return avx2::dequantize_bf16;
      case Fast::Q4_0: return avx2::dequantize_q4_0;
      case Fast::Q4_1: return avx2::dequantize_q4_1;
      case Fast::Q5_0: return avx2::dequantize_q5_0;
      case Fast::Q8_0: return avx2::dequantize_q8_0;
      case Fast::Q2_K: return avx2::dequantize_q2_K;
      case Fast::Q3_K: return avx2::dequantize_q3_K;
      case Fast::Q4_K: return avx2::dequantize_q4_K;
      case Fast::Q5_K: return avx2::dequantize_q5_K;
      case Fast::Q6_K: return avx2::dequantize_q6_K;
      case Fast::MXFP4: return avx2::dequantize_mxfp4;
      case Fast::NVFP4: return avx2::dequantize_nvfp4;
    }
  }
#endif
  (void)kind;
  return nullptr;
}

}  // namespace kiln
