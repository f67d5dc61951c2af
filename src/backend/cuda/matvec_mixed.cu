// The grouped decode matvec over parts of two weight types in one launch (matvec_grouped.h:
// matvec_mixed_f32_parts). Q4_K_M keeps q and k in q4_K but v in q6_K on about half of the
// layers; as two launches (one per type) each launch normalized and quantized x again, and
// the rope / cache store could not join either's epilogue (a separate kernel ran after).
// Here the kernel of matvec_grouped_kernel.cuh reads the q6_K parts with the second format.
// Only the pair that occurs is compiled (q4_K with q6_K), and only the f32-input form.
#include <algorithm>
#include <string>

#include "backend/cuda/matvec_grouped_kernel.cuh"

namespace kiln::cuda {

namespace {

// The launch's formats: the first type met is the kernel's first format unless it is the
// second of the pair; `second.parts` marks the parts in the pair's second type.
struct MixedLaunch {
  int64_t first_row_bytes = 0;
  detail::SecondFormat second;
};

bool mixed_launch(std::span<const PartFormat> formats, MixedLaunch* launch) {
  if (formats.empty() || formats.size() > size_t(kMaxMatvecParts)) return false;
  bool has_first = false, has_second = false;
  MixedLaunch l;
  for (size_t i = 0; i < formats.size(); ++i) {
    const PartFormat& f = formats[i];
    if (f.type == GgmlType::Q4_K) {
      if (has_first && f.w_row_bytes != l.first_row_bytes) return false;  // one stride per type
      l.first_row_bytes = f.w_row_bytes, has_first = true;
    } else if (f.type == GgmlType::Q6_K) {
      if (has_second && f.w_row_bytes != l.second.w_row_bytes) return false;
      l.second.w_row_bytes = f.w_row_bytes, has_second = true;
      l.second.parts |= 1u << i;
    } else {
      return false;
    }
  }
  if (launch) *launch = l;
  return has_first && has_second;
}

// Whether the parts, of formats a mixed launch takes, fit it: each part as a launch of its
// own type would take it (weights, widths, input), and the two-format stages fit.
bool mixed_parts_fit(int64_t cols, std::span<const MatvecPart> parts, std::span<const PartFormat> formats,
                     const F32Input& in) {
  if (parts.size() != formats.size()) return false;
  int64_t total = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (!matvec_parts_f32_fit(formats[i].type, cols, formats[i].w_row_bytes, parts.subspan(i, 1), in)) return false;
    total += parts[i].rows;
  }
  return total < (int64_t(1) << 30) &&
         detail::grouped_smem_bytes<detail::GroupQ4_K, detail::GroupQ6_K>(cols) <= detail::kGroupedMaxSmem;
}

}  // namespace

bool matvec_mixed_formats(std::span<const PartFormat> formats) { return mixed_launch(formats, nullptr); }

bool matvec_mixed_f32_fit(int64_t cols, std::span<const MatvecPart> parts, std::span<const PartFormat> formats,
                          const F32Input& in) {
  return matvec_mixed_formats(formats) && mixed_parts_fit(cols, parts, formats, in);
}

Status matvec_mixed_f32_parts(int64_t cols, std::span<const MatvecPart> parts, std::span<const PartFormat> formats,
                              const F32Input& in, cudaStream_t stream, const PairEpilogue& ep) {
  MixedLaunch l;
  if (!mixed_launch(formats, &l) || !mixed_parts_fit(cols, parts, formats, in))
    return Status::invalid("matvec_mixed_f32_parts: " + std::to_string(parts.size()) + " parts of " +
                           std::to_string(cols) +
                           " columns do not fit the two-format grouped kernel (q4_K parts with q6_K ones, one "
                           "row stride per type, each part fitting the grouped kernel)");
  if (ep.kind == PairEpilogueKind::Glu || ep.kind == PairEpilogueKind::RouterSums ||
      !detail::pair_epilogue_launchable(cols, parts, ep))
    return Status::invalid("matvec_mixed_f32_parts: the pair epilogue does not fit (rope only: the glu epilogue takes "
                           "gate and up of one type)");
  int64_t total = 0;
  const detail::GroupedSegments seg = detail::segments_of(parts, &total);
  return detail::dispatch_grouped<detail::GroupQ4_K, true, detail::GroupQ6_K>(seg, total, cols, l.first_row_bytes,
                                                                               Q8Vector{}, in, ep, stream, l.second);
}

}  // namespace kiln::cuda
