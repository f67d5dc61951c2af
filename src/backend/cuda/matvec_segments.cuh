#pragma once
// The parts of one grouped matvec launch as the kernels see them (matvec_grouped.cu for
// quantized weights, matvec_f16_grouped.cu for f16 / bf16): up to kMaxMatvecParts matrices
// over one x, their rows walked as if stacked.
#include <climits>
#include <cstdint>
#include <span>

#include "backend/cuda/matvec_grouped.h"

namespace kiln::cuda::detail {

// Global row r belongs to the first part whose end exceeds r (ends of unused parts are
// INT_MAX). Several products of one x (q/k/v, gate/up) thus cost one launch, and the small
// k/v matrices ride in the large one's waves.
struct GroupedSegments {
  const uint8_t* w[kMaxMatvecParts];
  const float* add[kMaxMatvecParts];
  float* y[kMaxMatvecParts];
  float* acc[kMaxMatvecParts];
  int end[kMaxMatvecParts];
  __device__ __forceinline__ int part_of(int row) const {
    int p = 0;
#pragma unroll
    for (int i = 0; i + 1 < kMaxMatvecParts; ++i) p += row >= end[i] ? 1 : 0;
    return p;
  }
  // Selects instead of a run-time index: an indexed kernel parameter would be copied to local
  // memory (a stack frame in the compiler's report).
  template <typename T>
  __device__ __forceinline__ static T pick(const T (&v)[kMaxMatvecParts], int part) {
    T r = v[0];
#pragma unroll
    for (int i = 1; i < kMaxMatvecParts; ++i) r = part == i ? v[i] : r;
    return r;
  }
  __device__ __forceinline__ int first_row(int part) const { return part == 0 ? 0 : pick(end, part - 1); }
  // The part of global row `row` and its row within that part.
  __device__ __forceinline__ void locate(int row, int& part, int& local) const {
    part = part_of(row), local = row - first_row(part);
  }
};

// The parts stacked by rows (see GroupedSegments); unused slots end at INT_MAX.
inline GroupedSegments segments_of(std::span<const MatvecPart> parts, int64_t* total_rows) {
  GroupedSegments seg{};
  int64_t total = 0;
  for (int i = 0; i < kMaxMatvecParts; ++i) {
    if (size_t(i) < parts.size()) {
      const MatvecPart& p = parts[size_t(i)];
      seg.w[i] = static_cast<const uint8_t*>(p.w);
      seg.add[i] = p.add;
      seg.y[i] = p.y;
      seg.acc[i] = p.accumulate;
      total += p.rows;
      seg.end[i] = int(total);
    } else {
      seg.end[i] = INT_MAX;
    }
  }
  *total_rows = total;
  return seg;
}

}  // namespace kiln::cuda::detail
