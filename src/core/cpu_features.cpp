#include "core/cpu_features.h"

#include <cpuid.h>

#include <cstdlib>
#include <cstring>

namespace kiln {
namespace {

bool os_saves_avx_state(bool want_avx512) {
  unsigned eax, ebx, ecx, edx;
  __cpuid(1, eax, ebx, ecx, edx);
  if (!(ecx & (1u << 27))) return false;  // OSXSAVE
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  const unsigned need = want_avx512 ? 0xe6u : 0x6u;
  return (lo & need) == need;
}

CpuFeatures detect() {
  CpuFeatures f;
  unsigned eax, ebx, ecx, edx;
  if (__get_cpuid_max(0, nullptr) < 7) return f;
  __cpuid(1, eax, ebx, ecx, edx);
  const bool fma = ecx & (1u << 12), f16c = ecx & (1u << 29);
  __cpuid_count(7, 0, eax, ebx, ecx, edx);
  const bool avx2 = ebx & (1u << 5);
  const bool avx512 = (ebx & (1u << 16)) && (ebx & (1u << 17)) && (ebx & (1u << 30)) && (ebx & (1u << 31));
  const bool vnni = ecx & (1u << 11);
  __cpuid_count(7, 1, eax, ebx, ecx, edx);
  const bool bf16 = eax & (1u << 5);

  f.avx2 = avx2 && fma && f16c && os_saves_avx_state(false);
  f.avx512 = f.avx2 && avx512 && os_saves_avx_state(true);
  f.avx512_vnni = f.avx512 && vnni;
  f.avx512_bf16 = f.avx512 && bf16;

  if (const char* cap = std::getenv("KILN_SIMD")) {
    if (std::strcmp(cap, "scalar") == 0) f = CpuFeatures{};
    else if (std::strcmp(cap, "avx2") == 0) f.avx512 = f.avx512_vnni = f.avx512_bf16 = false;
  }
  return f;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

}  // namespace kiln
