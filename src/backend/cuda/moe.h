#pragma once
// Mixture-of-experts FFN on the device, running only the routed experts:
//
//   out[t] = sum_j weights[t][j] * FFN_{ids[t][j]}(x[t])
//   FFN_e(x) = down_e · glu(gate_e · x + gate_bias_e, up_e · x + up_bias_e) + down_bias_e
//
// A (token t, slot j) pair is p = t * n_used + j. Expert ids are read on the device only,
// so every launch here is the same from step to step and a decode pass can be captured in
// a CUDA graph and replayed; an id outside [0, n_expert) makes that token's output NaN
// (never a silent wrong value).
//
// Two ways to run it:
//   - indexed matvecs (moe_matvec.cu), for a few tokens: one launch computes gate and up of
//     every pair and applies the GLU, one launch computes down for every token, weighting
//     and summing its slots in a fixed order. With quantized weights the activations are
//     quantized to int8 in blocks of 32 first (as matvec.h; one launch each for x and for
//     the GLU output; down takes int8 for up to 32 slots, f32 beyond); `exact` instead
//     decodes the weights to f32 and keeps activations in f32 (results follow an f32
//     reference to ~1e-6 relative). Experts in the row-tile layout (expert_tiles.h,
//     ExpertMatrix::row_tiles) take kernels of their own (moe_tiled_decode.cu).
//   - grouped GEMMs (moe_gemm.cu), for many tokens: the pairs are sorted by expert on the
//     device, then one tensor-core launch covers gate/up (+GLU) of all experts and one
//     covers down; a last launch weights and sums each token's slots in a fixed order.
//     Operands are bf16 (weights dequantized tile by tile, activations rounded), f32
//     accumulation: |error| <= ~2^-8 * sum |w x| per product, as gemm.h. (The backend keeps
//     f32 experts, which only test models have, on the f32 matvecs at every batch size.)
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/ops.h"
#include "backend/cuda/ops_extra.h"
#include "backend/cuda/status.h"
#include "quant/types.h"

namespace kiln::cuda {

// One stacked expert matrix: n_expert matrices of `rows` rows, row r of expert e at
// (uint8_t*)data + e * expert_bytes + r * row_bytes; optional f32 bias per expert.
struct ExpertMatrix {
  GgmlType type = GgmlType::F32;
  const void* data = nullptr;
  int64_t row_bytes = 0, expert_bytes = 0;
  const float* bias = nullptr;  // [n_expert][rows] at bias + e * bias_stride, or null
  int64_t bias_stride = 0;
  // The bytes are in the row-tile layout of expert_tiles.h (q4_K / q6_K; expert_bytes and
  // row_bytes then say where the rows' tiles start, as in the block layout). The decode
  // kernels load it straight into registers and the prefill GEMM (tile engine v8, whatever
  // gemm_version says) copies it back into rows; exact mode refuses it.
  bool row_tiles = false;
};

// The MoE front (norm, router logits, routing) folded into the experts' decode kernels, for
// one token over experts in the row-tile layout: the attention output product before has
// added each expert's router sum over the residual x into `sums` (matvec_grouped.h's
// RouterSums epilogue: sums[e] = sum_i router[e][i] * norm_weight[i] * x_i). The logits are
// sums[e] / rms(x); with no router or selection bias they rank as the sums do, so every gate /
// up block ranks the experts from the sums alone (rank_by_sums in moe_tiled_decode.cu, through
// route_detail::rank_chosen), starts on its weights, then normalizes and quantizes x into its
// shared memory, which gives it rms(x); the block of slot 0's first rows also computes the
// routing's weights of `route` and writes them with the ids (route.ids / route.weights:
// MoeFfnArgs::ids / weights). The down blocks rank the same way
// before their wait, so their first weights load early as before; they read the weights after
// it. The sums are only read here: the next MoE layer's product sets them back to zero
// (RouterSumsEpilogue::zero). One launch fewer a layer than the front of ops_extra.h's
// moe_norm_route; the logits agree to f32 rounding (x * (w * g) summed in another order, scaled
// by 1 / rms after the sum).
struct MoeFoldedFront {
  double* sums = nullptr;              // [n_expert]; null: no folded front
  const float* x = nullptr;            // [n_embd]: the residual, the router's input before its norm
  const float* norm_weight = nullptr;  // [n_embd]
  float eps = 0.0f;
  const float* router_bias = nullptr;  // [n_expert]: must be null (and route.selection_bias)
  MoeRouteArgs route;                  // its logits are not read (nor written)
};
// Whether moe_ffn_matvec takes a folded front with these arguments (one token, tiled q4_K /
// q6_K experts, n_embd a multiple of 256 up to 4096, at most kRouterSumsMaxExperts experts,
// no router or selection bias, x and the norm weights 16-byte aligned, the route's ids and
// weights those of the FFN).
struct MoeFfnArgs;
bool moe_folded_front_fits(const MoeFfnArgs& args);

enum class MoeDownWalk { Default, PerSegment, Flat };
enum class MoeGateUpLaunch { Default, FourStages, OneWave, Direct };

struct MoeFfnArgs {
  ExpertMatrix gate, up;   // n_ff rows of n_embd (gate and up of one type)
  ExpertMatrix down;       // n_embd rows of n_ff
  int64_t n_embd = 0, n_ff = 0, n_expert = 0, n_used = 0, n_tokens = 0;
  const float* x = nullptr;  // [n_tokens][n_embd], row stride x_stride floats
  int64_t x_stride = 0;
  const int32_t* ids = nullptr;  // [n_tokens][n_used], row stride ids_stride
  int64_t ids_stride = 0;
  const float* weights = nullptr;  // [n_tokens][n_used], row stride weights_stride
  int64_t weights_stride = 0;
  float* out = nullptr;  // [n_tokens][n_embd], row stride out_stride; must not alias x
  int64_t out_stride = 0;
  // residual[t] += out[t] as well (the residual stream), or null.
  float* residual = nullptr;
  int64_t residual_stride = 0;
  GluKind act = GluKind::Silu;
  float alpha = 1.702f, limit = 7.0f;  // SwigluOai only
  // moe_ffn_gemm only: the tile engine, 4, 6, 7 (moe_gemm_tile.cuh) or 8 (moe_gemm_v8.cuh;
  // q4_K and q6_K, v7 for other types); 0 takes the default, v8 unless the environment says
  // KILN_CUDA_MOE_PREFILL_V=4, 6 or 7 (read once).
  int gemm_version = 0;
  // moe_ffn_matvec's int8 down product: how a warp walks its slots' rows
  // (moe_flat_segments.cuh). Default: flattened where that leaves fewer chunks (a row's 32-column
  // slices not a multiple of 32), unless the environment says KILN_CUDA_MOE_FLAT_SEGMENTS=0
  // (read once); PerSegment: each row in its own chunks everywhere; Flat: flattened everywhere
  // (for tests; whole chunks then give the per-segment walk's bits).
  MoeDownWalk down_walk = MoeDownWalk::Default;
  // moe_ffn_matvec's int8 gate / up kernel: FourStages, the blocks as many registers as the
  // compiler takes (q4_K: 1,320 of Qwen3-30B-A3B's 1,536 blocks resident, the rest a second
  // wave); OneWave, at most 40 registers and fewer copy stages, so that 12 blocks share a
  // multiprocessor (moe_matvec.cu); Direct, OneWave's grid and registers with each lane reading
  // its block fields straight from global memory (q4_K rows at 16-byte multiples; else
  // OneWave). Default: Direct for q4_K unless the environment says KILN_CUDA_MOE_GATE_UP_DIRECT=0,
  // else OneWave unless it says KILN_CUDA_MOE_GATE_UP_ONE_WAVE=0 (read once). The same bits
  // every way.
  MoeGateUpLaunch gate_up_launch = MoeGateUpLaunch::Default;
  // moe_ffn_matvec's int8 path (gate / up and down both quantized types): counters, one per
  // 32 values of h (moe_h_ticket_count), zero before the first launch and left zero by every
  // launch. With them the gate / up kernel also writes h's int8 copy: the last of the 8 blocks
  // that write a group of 32 values quantizes it (one launch fewer a layer; the same bits as
  // the launch of its own). Null: h is quantized by a launch of its own. (The kernel for
  // experts in row tiles makes h's int8 copy in either case, without counters.)
  unsigned* h_tickets = nullptr;
  // moe_ffn_matvec's int8 gate / up: x's int8 copy made by the kernel before this op (token t
  // at x_q8 + t * x_q8_row_bytes, laid out as matvec.h's Q8Vector: the front's
  // MoeNormRouteArgs::q8), so that no launch quantizes x here. That kernel may also have
  // written the expert ids, so the gate / up kernel then reads them only after its wait.
  // Null: x is quantized by a launch of its own.
  const uint8_t* x_q8 = nullptr;
  int64_t x_q8_row_bytes = 0;
  // The front folded into the decode kernels (above), or none (front.sums null): then x, the
  // ids and the weights come from the kernels before, as everywhere else.
  MoeFoldedFront front;
};

// The counters MoeFfnArgs::h_tickets needs: one per 32 values of h (n_tokens * n_used * n_ff / 32).
int64_t moe_h_ticket_count(const MoeFfnArgs& args);

// Whether the device kernels take these weight types (f32 f16 bf16 and every type the block
// decoders know; gate and up must share one type).
bool moe_supports(GgmlType gate_up, GgmlType down);

// ---- indexed matvecs (decode) ----
size_t moe_matvec_scratch_bytes(const MoeFfnArgs& args, bool exact);
Status moe_ffn_matvec(const MoeFfnArgs& args, bool exact, void* scratch, size_t scratch_bytes, cudaStream_t stream);

// ---- grouped GEMMs (prefill) ----
// Whether the grouped GEMM takes this problem (n_embd and n_ff multiples of 32, at most
// kMoeGemmMaxExperts experts); otherwise use the matvecs.
constexpr int64_t kMoeGemmMaxExperts = 4096;
bool moe_gemm_fits(const MoeFfnArgs& args);
size_t moe_gemm_scratch_bytes(const MoeFfnArgs& args);
Status moe_ffn_gemm(const MoeFfnArgs& args, void* scratch, size_t scratch_bytes, cudaStream_t stream);

}  // namespace kiln::cuda
