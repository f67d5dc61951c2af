#pragma once
// The grouped q4_0 / q8_0 / q4_K / q6_K decode matvec (matvec_grouped.cu): whole groups of
// 256 weights per lane, staged with aligned 16-byte copies. matvec_q8 takes it when
// matvec_grouped_fits.
#include <span>

#include "backend/cuda/matvec.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/ops_extra.h"

namespace kiln::cuda {

// Weight types the grouped kernel reads: q4_0, q8_0, q4_K, q6_K.
bool matvec_grouped_type(GgmlType type);

// One of those types, cols a multiple of 256 (of 2048 for q6_K, whose 210-byte super-blocks
// reach a 16-byte boundary every 8), weights, rows and the quantized x 16-byte aligned, no
// tuning knobs set (those pick the general kernel).
bool matvec_grouped_fits(const MatvecArgs& args, const Q8Vector& xq);
Status matvec_q8_grouped(const MatvecArgs& args, const Q8Vector& xq, cudaStream_t stream);

// Several products of one quantized x in one launch: y_i = W_i x + add_i for up to
// kMaxMatvecParts matrices of one type and width (each its own allocation; their rows are
// walked as if stacked). Every part must fit the grouped kernel (matvec_parts_fit).
constexpr int kMaxMatvecParts = 3;
struct MatvecPart {
  const void* w = nullptr;     // rows x cols, row r at (uint8_t*)w + r * w_row_bytes
  int64_t rows = 0;
  const float* add = nullptr;  // [rows] or null; may alias y
  float* y = nullptr;          // [rows]
  float* accumulate = nullptr; // [rows] or null: accumulate[r] += y[r] too (a residual stream)
};

// What a launch may do with the two rows of a warp's task besides the products, so that the
// op after them needs no kernel of its own (in the int8 kernel pairs need cols <= 4096, where
// a task is two rows of 16 lanes each; matvec_pairs_fit says whether a launch can; the f16 /
// bf16 kernel, matvec_f16_grouped.h, takes pairs of any width):
//  - RopeStore: parts q, k, v of token `token`. The row pairs (2i, 2i+1) of each q and k head
//    are rotated as rope() does in its normal (not NeoX) style, with the angles of a
//    rope_table(), and k and v also go into the KV cache at the token's slot: what
//    rope_store() would do after the products.
//  - Glu: parts gate and up of equal rows; row i of each is one pair, and besides both
//    products glu.out[i] = act(gate_i) * up_i is written: what glu() would do after the
//    products. The int8 kernel takes it over f32 x only (matvec_f32_parts), with rows a
//    multiple of 32: its blocks own whole int8 blocks of the activation and also write its
//    int8 copy (glu.q8, as glu() with GluArgs::q8), which the down product reads
//    (matvec_grouped_glu.cu; without that copy the down product quantized the activation in
//    every block: measured slower, docs/perf-notes.md round 5).
//  - RouterSums: one part that accumulates into the residual stream (an attention output
//    product), and an MoE router after it: besides the products, each block adds its rows'
//    share of every expert's router sum, sums[e] += sum_i router_t[i][e] * norm_weight[i] *
//    h_i over its rows i, h_i the residual's new value, into router.sums (double, so that the
//    order the blocks add in changes the sums only far below f32's precision). The experts'
//    kernels after it finish the front from them (moe.h's MoeFoldedFront): no launch of the
//    norm, router and routing between. They only read the sums, so the launch also sets
//    router.zero (the sums of the MoE layer before, whose readers have ended by its wait)
//    back to zero. Rows of at most 16 groups, at most kRouterSumsMaxExperts experts.
enum class PairEpilogueKind : uint8_t { None, RopeStore, Glu, RouterSums };
constexpr int kRouterSumsMaxExperts = 128;
constexpr int64_t kRouterSumsMaxCols = 16 * 256;  // the product's width: rows of at most 16 groups
struct RouterSumsEpilogue {
  const float* router_t = nullptr;     // [rows][n_expert]: the router transposed (row i: column i's weights)
  const float* norm_weight = nullptr;  // [rows]: the norm's weights, which the router's input carries
  double* sums = nullptr;              // [n_expert], added to (zero before the first launch)
  double* zero = nullptr;              // [kRouterSumsMaxExperts] set to zero after the wait, or null; not sums
  int n_expert = 0;
};
struct GluEpilogue {
  GluKind kind = GluKind::Silu;
  float alpha = 1.702f, limit = 7.0f;  // SwigluOai only
  float* out = nullptr;                // token t's activation at out + t * out_stride
  int64_t out_stride = 0;
  // int8 kernel only: token t's int8 copy of the activation at q8 + t * q8_row_bytes, laid
  // out as GluArgs::q8 (16-byte aligned; null: none), and the kernel's copy stages per warp
  // (1 or 2; the backend's KILN_CUDA_GLU_EPILOGUE_Q8 picks).
  uint8_t* q8 = nullptr;
  int64_t q8_row_bytes = 0;
  int stages = 2;
};
struct PairEpilogue {
  PairEpilogueKind kind = PairEpilogueKind::None;
  int64_t token = 0;              // the batch row of this launch (index into angles, slots, glu.out)
  int head_dim = 0, n_rot = 0;    // the first n_rot dims of each head rotate
  const float* angles = nullptr;  // rope_table(): per token, cos [n_rot / 2] then sin [n_rot / 2]
  KvStoreArgs store;              // the cache and slots (k and v unused: the products' rows go)
  GluEpilogue glu;
  RouterSumsEpilogue router;
};
// The parts' side of a pair epilogue, whatever the kernel: RopeStore three parts of even
// rows, q and k whole heads, k and v as wide as the cache rows; Glu two parts of equal rows
// and an output. No part accumulates.
bool pair_epilogue_parts_fit(std::span<const MatvecPart> parts, const PairEpilogue& ep);
// The int8 kernel's: the shapes above and rows of at most 16 groups (the angles are checked
// at launch); for Glu also rows a multiple of 32, an aligned int8 copy (or none) and 1 or 2
// stages.
bool matvec_pairs_fit(int64_t cols, std::span<const MatvecPart> parts, const PairEpilogue& ep);

// Whether a two-stage launch with this epilogue that would fit twice its even share of blocks
// a multiprocessor is capped at the share (occupancy.h). KILN_CUDA_GROUPED_SPREAD (read once):
// unset, every launch but those with the router sums; 0 none; 2 every launch, the router sums'
// too. The router sums' product (Qwen3-30B-A3B's o since the MoE front is folded) is followed
// by the experts' gate / up, whose blocks find room beside it when it is not capped: 1.5713 →
// 1.5255 ms a step (docs/perf-notes.md, round 31).
bool grouped_spread(PairEpilogueKind epilogue);

bool matvec_parts_fit(GgmlType type, int64_t cols, int64_t w_row_bytes, std::span<const MatvecPart> parts,
                      const Q8Vector& xq);
Status matvec_q8_parts(GgmlType type, int64_t cols, int64_t w_row_bytes, std::span<const MatvecPart> parts,
                       const Q8Vector& xq, cudaStream_t stream, const PairEpilogue& ep = {});

// The same products with x given in f32 and quantized by every block of the launch into its
// own shared memory (the bytes quantize_q8 would write), so that no separate quantizing
// kernel runs before. With norm_weight set, x is first RMS-normalized as rmsnorm() does,
// x / rms(x) * norm_weight, and the normalized vector is written to `normed` when that is
// set (later ops may read it). x, norm_weight and normed 16-byte aligned, cols <= 8192.
struct F32Input {
  const float* x = nullptr;            // [cols]
  const float* norm_weight = nullptr;  // [cols] or null: no normalization
  float eps = 0.0f;
  float* normed = nullptr;             // [cols] or null; only with norm_weight; must not alias x
};
constexpr int64_t kMaxF32InputCols = 8192;
bool matvec_parts_f32_fit(GgmlType type, int64_t cols, int64_t w_row_bytes, std::span<const MatvecPart> parts,
                          const F32Input& in);
Status matvec_f32_parts(GgmlType type, int64_t cols, int64_t w_row_bytes, std::span<const MatvecPart> parts,
                        const F32Input& in, cudaStream_t stream, const PairEpilogue& ep = {});

// Parts of two weight types in one launch over f32 x, as matvec_f32_parts (norm inside, pair
// epilogue) otherwise: a Q4_K_M layer's q4_K q and k with its q6_K v, which would take one
// launch per type, each normalizing and quantizing x again, and no epilogue. formats[i] is
// part i's type and row stride (one stride per type). The pairs of types taken: q4_K with
// q6_K (matvec_mixed_formats says); each part must fit the grouped kernel on its own.
struct PartFormat {
  GgmlType type = GgmlType::F32;
  int64_t w_row_bytes = 0;
};
bool matvec_mixed_formats(std::span<const PartFormat> formats);
bool matvec_mixed_f32_fit(int64_t cols, std::span<const MatvecPart> parts, std::span<const PartFormat> formats,
                          const F32Input& in);
Status matvec_mixed_f32_parts(int64_t cols, std::span<const MatvecPart> parts, std::span<const PartFormat> formats,
                              const F32Input& in, cudaStream_t stream, const PairEpilogue& ep = {});

}  // namespace kiln::cuda
