// The grouped decode matvec for parts of one weight type: dispatch by type and width, the
// shape checks and the public entry points of matvec_grouped.h (the kernel and its formats:
// matvec_grouped_kernel.cuh).
#include <string>

#include "backend/cuda/env_switch.h"
#include "backend/cuda/matvec_grouped_kernel.cuh"

namespace kiln::cuda {
namespace detail {

int grouped_one_stage_mode() {
  static const int mode = [] {
    const int v = env_int("KILN_CUDA_GROUPED_ONE_STAGE", 1);
    return v == 0 || v == 2 ? v : 1;
  }();
  return mode;
}

int x_multicast_cluster_setting() {
  static const int cluster = std::clamp(env_int("KILN_CUDA_X_MULTICAST", -1), -1, 8);
  return cluster;
}

bool grouped_eight_lanes_enabled() {
  static const bool enabled = env_int("KILN_CUDA_GROUPED_EIGHT_LANES", 1) != 0;
  return enabled;
}

template <bool kFromF32>
Status dispatch_type(GgmlType type, const GroupedSegments& seg, int64_t total_rows, int64_t cols,
                     int64_t w_row_bytes, const Q8Vector& xq, const F32Input& in, const PairEpilogue& ep,
                     cudaStream_t stream) {
  if (type == GgmlType::Q4_0)
    return dispatch_grouped<GroupQ4_0, kFromF32>(seg, total_rows, cols, w_row_bytes, xq, in, ep, stream);
  if (type == GgmlType::Q4_K)
    return dispatch_grouped<GroupQ4_K, kFromF32>(seg, total_rows, cols, w_row_bytes, xq, in, ep, stream);
  if (type == GgmlType::Q6_K)
    return dispatch_grouped<GroupQ6_K, kFromF32>(seg, total_rows, cols, w_row_bytes, xq, in, ep, stream);
  return dispatch_grouped<GroupQ8_0, kFromF32>(seg, total_rows, cols, w_row_bytes, xq, in, ep, stream);
}

size_t smem_for(GgmlType type, int64_t cols) {
  if (type == GgmlType::Q4_0) return grouped_smem_bytes<GroupQ4_0>(cols);
  if (type == GgmlType::Q4_K) return grouped_smem_bytes<GroupQ4_K>(cols);
  if (type == GgmlType::Q6_K) return grouped_smem_bytes<GroupQ6_K>(cols);
  return grouped_smem_bytes<GroupQ8_0>(cols);
}

int group_bytes_of(GgmlType type) {
  if (type == GgmlType::Q4_0) return GroupQ4_0::kGroupBytes;
  if (type == GgmlType::Q4_K) return GroupQ4_K::kGroupBytes;
  if (type == GgmlType::Q6_K) return GroupQ6_K::kGroupBytes;
  return GroupQ8_0::kGroupBytes;
}

}  // namespace detail

bool matvec_grouped_type(GgmlType type) {
  return type == GgmlType::Q4_0 || type == GgmlType::Q8_0 || type == GgmlType::Q4_K || type == GgmlType::Q6_K;
}

namespace {

// The weights' side of matvec_grouped_fits (the input's side differs between the int8 and
// the f32 forms).
bool grouped_weights_fit(const MatvecArgs& a) {
  if (!matvec_grouped_type(a.type)) return false;
  if (a.rows_per_warp != 0 || a.warps_per_row != 0) return false;  // tuning knobs: the general kernel
  if (a.cols % detail::kGroupElems != 0 || a.rows >= (int64_t(1) << 30)) return false;
  // Every chunk of a row (up to 32 groups, the last one partial) is copied in whole 16-byte
  // pieces; for q6_K (210-byte groups) that needs a multiple of 8 groups.
  if (a.cols / detail::kGroupElems * detail::group_bytes_of(a.type) % 16 != 0) return false;
  if (!detail::aligned16(a.w) || a.w_row_bytes % 16 != 0) return false;
  return detail::smem_for(a.type, a.cols) <= detail::kGroupedMaxSmem;
}

// Every part's weights fit, and the rows in all stay below 2^30.
bool parts_weights_fit(GgmlType type, int64_t cols, int64_t w_row_bytes, std::span<const MatvecPart> parts) {
  if (parts.empty() || parts.size() > size_t(kMaxMatvecParts)) return false;
  int64_t total = 0;
  for (const MatvecPart& p : parts) {
    MatvecArgs a;
    a.type = type, a.w = p.w, a.w_row_bytes = w_row_bytes, a.rows = p.rows, a.cols = cols;
    if (p.rows <= 0 || !p.y || !grouped_weights_fit(a)) return false;
    total += p.rows;
  }
  return total < (int64_t(1) << 30);
}

}  // namespace

bool matvec_grouped_fits(const MatvecArgs& a, const Q8Vector& xq) {
  return grouped_weights_fit(a) && detail::aligned16(xq.qs) && detail::aligned16(xq.ds);
}

bool pair_epilogue_parts_fit(std::span<const MatvecPart> parts, const PairEpilogue& ep) {
  for (const MatvecPart& p : parts)
    if (p.accumulate) return false;
  if (ep.kind == PairEpilogueKind::Glu)
    return parts.size() == 2 && parts[0].rows == parts[1].rows && ep.glu.out;
  if (ep.kind != PairEpilogueKind::RopeStore) return false;
  for (const MatvecPart& p : parts)
    if (p.rows % 2 != 0) return false;  // pairs (2i, 2i+1) never straddle two parts
  const KvStoreArgs& st = ep.store;
  return parts.size() == 3 && ep.head_dim > 0 && ep.head_dim % 2 == 0 && ep.n_rot > 0 &&
         ep.n_rot % 2 == 0 && ep.n_rot <= ep.head_dim && parts[0].rows % ep.head_dim == 0 &&
         parts[1].rows % ep.head_dim == 0 && parts[1].rows == st.k_width &&
         parts[2].rows == st.v_width && st.slots && st.cache_k && st.cache_v &&
         (st.cache_type == GgmlType::F32 || st.cache_type == GgmlType::F16);
}

namespace {

// The glu epilogue's own needs (matvec_grouped_glu.cu): blocks own whole int8 blocks of the
// activation (rows a multiple of 32), and its int8 copy, if any, is aligned and holds the
// values and the scales of a row as glu() lays them out.
bool glu_epilogue_fits(std::span<const MatvecPart> parts, const GluEpilogue& g) {
  if (parts.size() != 2 || parts[0].rows % 32 != 0 || (g.stages != 1 && g.stages != 2)) return false;
  if (!g.q8) return true;
  return q8_rows_fit(g.q8, g.q8_row_bytes, parts[0].rows);
}

// The router sums' needs: one part accumulating into the residual, rows of at most 16 groups
// (two rows a task: the kernel's instances with the sums are those), the router and norm
// weights and the sums given, at most kRouterSumsMaxExperts experts.
bool router_sums_fit(int64_t cols, std::span<const MatvecPart> parts, const RouterSumsEpilogue& r) {
  static_assert(kRouterSumsMaxCols == detail::kMaxPairGroups * detail::kGroupElems);
  return cols % detail::kGroupElems == 0 && cols <= kRouterSumsMaxCols && parts.size() == 1 && parts[0].accumulate &&
         r.router_t && r.norm_weight && r.sums && r.n_expert > 0 && r.n_expert <= kRouterSumsMaxExperts;
}

}  // namespace

bool matvec_pairs_fit(int64_t cols, std::span<const MatvecPart> parts, const PairEpilogue& ep) {
  if (ep.kind == PairEpilogueKind::None) return true;
  if (ep.kind == PairEpilogueKind::RouterSums) return router_sums_fit(cols, parts, ep.router);
  if (ep.kind != PairEpilogueKind::RopeStore && ep.kind != PairEpilogueKind::Glu) return false;
  if (cols % detail::kGroupElems != 0 || cols / detail::kGroupElems > detail::kMaxPairGroups) return false;
  if (ep.kind == PairEpilogueKind::Glu && !glu_epilogue_fits(parts, ep.glu)) return false;
  return pair_epilogue_parts_fit(parts, ep);
}

bool grouped_spread(PairEpilogueKind epilogue) {
  static const int mode = env_int("KILN_CUDA_GROUPED_SPREAD", 1);
  return mode == 2 || (mode != 0 && epilogue != PairEpilogueKind::RouterSums);
}

bool matvec_parts_fit(GgmlType type, int64_t cols, int64_t w_row_bytes, std::span<const MatvecPart> parts,
                      const Q8Vector& xq) {
  return detail::aligned16(xq.qs) && detail::aligned16(xq.ds) && parts_weights_fit(type, cols, w_row_bytes, parts);
}

Status matvec_q8_parts(GgmlType type, int64_t cols, int64_t w_row_bytes, std::span<const MatvecPart> parts,
                       const Q8Vector& xq, cudaStream_t stream, const PairEpilogue& ep) {
  if (!matvec_parts_fit(type, cols, w_row_bytes, parts, xq) || xq.n != cols)
    return Status::invalid("matvec_q8_parts: " + std::to_string(parts.size()) + " parts of " + std::to_string(cols) +
                           " columns do not fit the grouped kernel (q4_0 / q8_0 / q4_K / q6_K, 16-byte aligned, "
                           "at most " +
                           std::to_string(kMaxMatvecParts) + " parts)");
  if (ep.kind == PairEpilogueKind::Glu || !detail::pair_epilogue_launchable(cols, parts, ep))
    return Status::invalid("matvec_q8_parts: the pair epilogue does not fit (the glu epilogue needs f32 x: "
                           "matvec_f32_parts)");
  int64_t total = 0;
  const detail::GroupedSegments seg = detail::segments_of(parts, &total);
  return detail::dispatch_type<false>(type, seg, total, cols, w_row_bytes, xq, F32Input{}, ep, stream);
}

bool matvec_parts_f32_fit(GgmlType type, int64_t cols, int64_t w_row_bytes, std::span<const MatvecPart> parts,
                          const F32Input& in) {
  if (!in.x || cols > kMaxF32InputCols || !detail::aligned16(in.x)) return false;
  if (in.norm_weight && !detail::aligned16(in.norm_weight)) return false;
  if (in.normed && (!in.norm_weight || !detail::aligned16(in.normed))) return false;
  return parts_weights_fit(type, cols, w_row_bytes, parts);
}

Status matvec_f32_parts(GgmlType type, int64_t cols, int64_t w_row_bytes, std::span<const MatvecPart> parts,
                        const F32Input& in, cudaStream_t stream, const PairEpilogue& ep) {
  if (!matvec_parts_f32_fit(type, cols, w_row_bytes, parts, in))
    return Status::invalid("matvec_f32_parts: " + std::to_string(parts.size()) + " parts of " + std::to_string(cols) +
                            " columns with f32 x do not fit the grouped kernel (q4_0 / q8_0 / q4_K / q6_K, "
                           "16-byte aligned, "
                           "at most " + std::to_string(kMaxF32InputCols) + " columns)");
  if (!detail::pair_epilogue_launchable(cols, parts, ep) || ep.kind == PairEpilogueKind::RouterSums)
    return Status::invalid("matvec_f32_parts: the pair epilogue does not fit (the router sums need int8 x: "
                           "matvec_q8_parts)");
  if (ep.kind == PairEpilogueKind::Glu) return detail::matvec_glu_f32_parts(type, cols, w_row_bytes, parts, in, ep, stream);
  int64_t total = 0;
  const detail::GroupedSegments seg = detail::segments_of(parts, &total);
  return detail::dispatch_type<true>(type, seg, total, cols, w_row_bytes, Q8Vector{}, in, ep, stream);
}

Status matvec_q8_grouped(const MatvecArgs& a, const Q8Vector& xq, cudaStream_t stream) {
  const MatvecPart part{a.w, a.rows, a.add, a.y};
  return matvec_q8_parts(a.type, a.cols, a.w_row_bytes, std::span<const MatvecPart>(&part, 1), xq, stream);
}

}  // namespace kiln::cuda
