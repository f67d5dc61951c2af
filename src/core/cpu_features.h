#pragma once
// What the running processor supports, read once. SIMD kernels are compiled per
// instruction set (files *_avx2.cpp, *_avx512.cpp) and chosen with these flags.
namespace kiln {

struct CpuFeatures {
  bool avx2 = false;     // with FMA and F16C
  bool avx512 = false;   // F, BW, VL, DQ
  bool avx512_vnni = false;
  bool avx512_bf16 = false;
};

// Detected once; KILN_SIMD=scalar|avx2 in the environment caps what is used (for tests
// and for comparing paths).
const CpuFeatures& cpu_features();

}  // namespace kiln
