#pragma once
// The per-instruction-set kernels behind matmul() (backend/cpu/matmul.cpp drives them).
// Each namespace is compiled in its own file with its own -m flags: call a function only
// when cpu_features() says the processor has that instruction set.
//
// Layouts shared with the driver:
// - float token panel: `lanes` tokens interleaved, panel[k * lanes + t] = x[t][k]
//   (zero for padding tokens).
// - int8 token panel (AVX-512 VNNI, 16 tokens): per 32-element block, Int8PanelBlock.
// - decode tokens: one token quantized to int8 per 32-element block, DecodeToken.
#include <cstddef>
#include <cstdint>

#include "backend/cpu/int8_rows.h"

namespace kiln::cpu {

// One token's activations for the decode kernels: its q8 blocks (matmul_q8.h; value =
// dx * q, q in -127..127) rearranged per 32-element block, in quads of 4 blocks (128 elements) whose
// bytes are reordered to [b0[0..15] b1[0..15] b2[0..15] b3[0..15] b0[16..31] ... b3[16..31]],
// the order in which the 4-bit formats hold their nibbles. Per quad, 16 lanes of 4 bytes:
// lane L belongs to block L / 4, and each per-lane array holds, in every lane of a block:
// `bias` = -sum(q) << bias_shift (the weights' zero point as the kernels' accumulator
// start: the shift is chosen per weight type), `bias_lo` / `bias_hi` = -sum << 3 over the
// block's 16 elements in the first / second 64 bytes (q6_K's zero point 32), `dx`, and
// `neg_dx_sum` = -dx * sum(q) / 4 (so that the 4 lanes of a block add up to -dx * sum, for
// the min terms; dx_sum is s for q8_1). Columns past the last whole quad are read by the
// kernels' scalar tail from `blocks`.
struct DecodeToken {
  const float* x = nullptr;  // the f32 activations
  GgmlType act = GgmlType::Q8_0;  // the format of `blocks`
  const void* blocks = nullptr;   // the token's q8 blocks
  int64_t n_quads = 0;
  int8_t* q = nullptr;         // n_quads * 128
  int32_t* bias = nullptr;     // n_quads * 16 each
  int32_t* bias_lo = nullptr;
  int32_t* bias_hi = nullptr;
  float* dx = nullptr;
  float* neg_dx_sum = nullptr;
};
inline constexpr int kDecodeLaneArrays = 5;  // the per-lane arrays above, 64 bytes per quad each

// 16 tokens' activations for one 32-element block, for the VNNI prefill kernel:
// u[c][4 * t + e] = q[t][4c + e] + 128 (unsigned), dx[t] the block scale of token t,
// dx_sum_lo / hi[t] = dx[t] * sum(q[t]) over elements 0..15 / 16..31, dx_sum_all[t] the
// block's dx_sum (Q8View: s for q8_1, else dx * sum over 0..31).
struct alignas(64) Int8PanelBlock {
  uint8_t u[8][64];
  float dx[16];
  float dx_sum_lo[16];
  float dx_sum_hi[16];
  float dx_sum_all[16];
};

// A tile of up to kInt8TileRows unpacked weight rows for the int8 prefill kernel. The q
// bytes are block-major, so that the kernel walks them with one index: the 32 bytes of
// block b of row r at q[(b * kInt8TileRows + r) * 32]. The affine maps are row-major, so
// that the unpackers store a row's maps as vectors: group g of row r at index
// r * row_maps + g of bias (= -128 * sum of the group's q), scale and offset.
inline constexpr int kInt8TileRows = 8;
struct Int8Tile {
  const int8_t* q;
  const int32_t* bias;
  const float* scale;
  const float* offset;  // null when the layout has no offset
  int group;            // 16 or 32
  int64_t row_maps;     // maps per row: cols / group
};

// Weight bytes the next prefill tile will read, fetched into L2 a line or two per step of
// a kernel's loop while the kernel computes: otherwise they arrive from memory during the
// next tile's unpack, where nothing overlaps the wait.
struct Prefetch {
  const uint8_t* next = nullptr;
  int64_t lines = 0;  // 64-byte lines left to fetch
};

namespace avx512 {
float dot_f32(const float* a, const float* b, int64_t n);
float dot_f16(const void* w, const float* x, int64_t n);
float dot_bf16(const void* w, const float* x, int64_t n);

// Float prefill: acc[r * 16 + t] (+)= sum_k w[r * w_stride + k] * panel[k * 16 + t] for
// r < rows (<= 8), k < k_len.
void panel_f32(const float* w, int64_t w_stride, int rows, int64_t k_len, const float* panel,
               float* acc, bool accumulate);
// Two panels at once (acc0 / acc1 overwritten): each weight broadcast serves 32 tokens.
// Fetches `pf` along the way.
void panel_f32_pair(const float* w, int64_t w_stride, int rows, int64_t k_len, const float* panel0,
                    const float* panel1, float* acc0, float* acc1, Prefetch pf);
void transpose_tokens_f32(const float* x, int64_t x_stride, int n_tokens, int64_t cols, float* panel);

// Quantizes `cols` activations to the q8 format `act` (Q8_0, Q8_1 or Q8_K; matmul_q8.h):
// the same bytes as quant/'s reference quantizers.
void quantize_activations(GgmlType act, const float* x, int64_t cols, void* blocks);
// Lays out one token's q8 blocks (of format `act`, quantized from x) for the decode kernels
// (storage of `out` set by the caller), with the bias shift that decode_bias_shift() gives
// for the weight type.
void prepare_decode_token(const void* blocks, GgmlType act, const float* x, int64_t cols, int bias_shift,
                          DecodeToken& out);
int decode_bias_shift(GgmlType type);
// y[t * y_stride + r] for rows [r0, r1) over the whole quads; the caller adds the tail.
void decode_q4_0(const uint8_t* w, size_t row_bytes, int64_t r0, int64_t r1, const DecodeToken* tokens,
                 int n_tokens, float* y, int64_t y_stride);
void decode_q8_0(const uint8_t* w, size_t row_bytes, int64_t r0, int64_t r1, const DecodeToken* tokens,
                 int n_tokens, float* y, int64_t y_stride);
void decode_q4_1(const uint8_t* w, size_t row_bytes, int64_t r0, int64_t r1, const DecodeToken* tokens,
                 int n_tokens, float* y, int64_t y_stride);
void decode_q5_0(const uint8_t* w, size_t row_bytes, int64_t r0, int64_t r1, const DecodeToken* tokens,
                 int n_tokens, float* y, int64_t y_stride);
void decode_q5_1(const uint8_t* w, size_t row_bytes, int64_t r0, int64_t r1, const DecodeToken* tokens,
                 int n_tokens, float* y, int64_t y_stride);
void decode_iq4_nl(const uint8_t* w, size_t row_bytes, int64_t r0, int64_t r1, const DecodeToken* tokens,
                   int n_tokens, float* y, int64_t y_stride);
void decode_q4_K(const uint8_t* w, size_t row_bytes, int64_t r0, int64_t r1, const DecodeToken* tokens,
                 int n_tokens, float* y, int64_t y_stride);
void decode_q5_K(const uint8_t* w, size_t row_bytes, int64_t r0, int64_t r1, const DecodeToken* tokens,
                 int n_tokens, float* y, int64_t y_stride);
void decode_q6_K(const uint8_t* w, size_t row_bytes, int64_t r0, int64_t r1, const DecodeToken* tokens,
                 int n_tokens, float* y, int64_t y_stride);

// int8 prefill: panel of `cols` / 32 blocks for up to 16 tokens (missing tokens are
// zero) from each token's q8 blocks of format `act`.
void prepare_int8_panel(const void* const* token_blocks, GgmlType act, int n_tokens, int64_t cols,
                        Int8PanelBlock* panel);
// acc[r * 16 + t] (+)= the product of tile rows r < rows (<= kInt8TileRows) over blocks
// [b0, b1). Fetches `pf` along the way.
void panel_int8(const Int8Tile& tile, int rows, int64_t b0, int64_t b1, const Int8PanelBlock* panel,
                float* acc, bool accumulate, Prefetch pf);
// SIMD unpackers for the hot types (same results as unpack_int8_row); false = not here.
// 32-element block i of q goes to out.q + i * block_stride (32: a plain row; 32 *
// kInt8TileRows: straight into a block-major Int8Tile); the maps to contiguous arrays
// (out.map_stride must be 1), the bias of group g (-128 * sum of its q, as group_bias) to
// bias[g]. out.qsum is not written.
bool unpack_int8_row_fast(GgmlType type, const void* row, int64_t cols, const Int8Row& out, int64_t block_stride,
                          int32_t* bias);
// acc[r * 16 + t] (8 rows x 16 tokens) to y[t * y_stride + r] for t < n_tokens.
void store_rows8(const float* acc, int n_tokens, float* y, int64_t y_stride);
// bias[g] = -128 * sum of group g of q (`group` elements each), q a plain row.
void group_bias(const int8_t* q, int group, int64_t n_groups, int32_t* bias);
}  // namespace avx512

// One token for the AVX2 decode kernels: ggml's q8_0 (matmul_q8.h) unpacked to arrays:
// int8 per 32-block in natural order, value = dx[b] * q[32 b + j] with dx the f16-rounded
// block scale; sum[b] = sum of the block's q.
struct Q8Token {
  int8_t* q = nullptr;
  float* dx = nullptr;
  int32_t* sum = nullptr;
};

namespace avx2 {
// Quantizes one token as q8_0 (cols a multiple of 32; storage of `out` set by the caller):
// the same levels and scales as quant/'s reference q8_0 quantizer.
void prepare_q8_token(const float* x, int64_t cols, Q8Token& out);
// y[t * y_stride + r] for rows [r0, r1): q4_0 / q8_0 weights (rows of row_bytes).
void decode_q4_0(const uint8_t* w, size_t row_bytes, int64_t r0, int64_t r1, const Q8Token* tokens, int n_tokens,
                 float* y, int64_t y_stride);
void decode_q8_0(const uint8_t* w, size_t row_bytes, int64_t r0, int64_t r1, const Q8Token* tokens, int n_tokens,
                 float* y, int64_t y_stride);
float dot_f32(const float* a, const float* b, int64_t n);
float dot_f16(const void* w, const float* x, int64_t n);
float dot_bf16(const void* w, const float* x, int64_t n);
// As avx512::panel_f32 with 8 token lanes.
void panel_f32(const float* w, int64_t w_stride, int rows, int64_t k_len, const float* panel,
               float* acc, bool accumulate);
void transpose_tokens_f32(const float* x, int64_t x_stride, int n_tokens, int64_t cols, float* panel);
}  // namespace avx2

}  // namespace kiln::cpu
