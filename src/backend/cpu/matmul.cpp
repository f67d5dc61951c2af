// The matmul driver: picks a path by weight type, token count and instruction set, splits
// the work over the thread pool and owns the scratch buffers. Kernels live in
// matmul_avx512.cpp / matmul_avx2.cpp (declared in matmul_kernels.h).
//
// Paths:
// Activations of the int8 paths are quantized once per call to ggml's q8 format for the
// weight type (activation_type(); matmul_q8.h), byte for byte as ggml quantizes them.
//
// - decode (n_tokens <= kDecodeMaxTokens): rows split over threads; each row is read once
//   and dotted with every token. On AVX-512 VNNI, q4_0 q4_1 q5_0 q5_1 iq4_nl q8_0 q4_K q5_K q6_K
//   use direct int8 kernels with the activations quantized once per call; other types
//   dequantize a row to f32 (or read f32 / f16 / bf16 directly) and take f32 dot products.
//   On AVX2, q4_0 and q8_0 have int8 kernels (maddubs).
// - prefill, integer weight types on AVX-512 VNNI: activations quantized once and laid out
//   in 16-token int8 panels; each tile of 8 weight rows is unpacked once to int8 and multiplied with
//   every panel (vpdpbusd).
// - prefill otherwise (float types; any type on AVX2): tiles of 8 rows dequantized to f32,
//   multiplied with f32 token panels (FMA).
// - scalar: dequantize a row, f32 dot per token.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "backend/cpu/matmul.h"
#include "backend/cpu/matmul_kernels.h"
#include "core/cpu_features.h"
#include "core/error.h"
#include "quant/codec.h"
#include "quant/quant.h"

namespace kiln::cpu {
namespace {

constexpr int64_t kDecodeMaxTokens = 3;  // up to this many tokens, weights are streamed per row
constexpr int kTileRows = 8;             // weight rows per prefill tile

// A grow-only, 64-byte aligned scratch buffer.
class Scratch {
 public:
  void* get(size_t bytes) {
    if (bytes > size_) {
      data_.reset(static_cast<uint8_t*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64)));
      if (!data_) fail("matmul: cannot allocate {} bytes of scratch", bytes);
      size_ = bytes;
    }
    return data_.get();
  }
  template <typename T>
  T* get(size_t count) {
    return static_cast<T*>(get(count * sizeof(T)));
  }

 private:
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  std::unique_ptr<uint8_t, Free> data_;
  size_t size_ = 0;
};

size_t align64(size_t n) { return (n + 63) / 64 * 64; }

void check_args(const MatmulArgs& a) {
  // Checked here, on the calling thread: an exception inside a pool worker would terminate.
  if (!find_codec(a.type)) fail("matmul: weight type {} has no dequantizer, so no path", type_name(a.type));
  const auto bytes = row_bytes(a.type, a.cols);
  if (!bytes) fail("matmul: {} columns is not a whole number of {} blocks", a.cols, type_name(a.type));
  if (*bytes > a.w_row_bytes)
    fail("matmul: weight row stride {} bytes is less than a {} row of {} columns ({} bytes)", a.w_row_bytes,
         type_name(a.type), a.cols, *bytes);
  if (a.rows < 0 || a.n_tokens < 0) fail("matmul: negative shape rows={} n_tokens={}", a.rows, a.n_tokens);
  if (a.n_tokens > 1 && (a.x_stride < a.cols || a.y_stride < a.rows))
    fail("matmul: strides x={} y={} smaller than a row (cols={} rows={})", a.x_stride, a.y_stride, a.cols, a.rows);
}

// Runs fn(begin, end) over [0, n) in contiguous chunks of about n / (4 * threads) items (at
// least `grain`), claimed one at a time, so that a thread slowed down by the OS or by other
// work on the machine ends up taking fewer chunks instead of holding everyone up.
template <typename Fn>
void parallel_chunks(ThreadPool& pool, int64_t n, int64_t grain, const Fn& fn) {
  if (pool.size() == 1 || n <= grain) {
    if (n > 0) fn(int64_t(0), n);
    return;
  }
  pool.parallel_for(n, grain, fn);
}

const uint8_t* weight_row(const MatmulArgs& a, int64_t r) {
  return static_cast<const uint8_t*>(a.w) + size_t(r) * a.w_row_bytes;
}

float dot_scalar(const float* w, const float* x, int64_t n) {
  float s[4] = {0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int j = 0; j < 4; ++j) s[j] += w[i + j] * x[i + j];
  for (; i < n; ++i) s[0] += w[i] * x[i];
  return (s[0] + s[1]) + (s[2] + s[3]);
}

// ---- decode: one pass over the rows -------------------------------------------------------

void decode_rows(const MatmulArgs& a, ThreadPool& pool, SimdLevel level) {
  auto dot = level == SimdLevel::Avx512 ? avx512::dot_f32 : level == SimdLevel::Avx2 ? avx2::dot_f32 : dot_scalar;
  using RowDot = float (*)(const void*, const float*, int64_t);
  RowDot direct = nullptr;  // weight types dotted without a dequantized copy
  if (a.type == GgmlType::F16 && level != SimdLevel::Scalar)
    direct = level == SimdLevel::Avx512 ? avx512::dot_f16 : avx2::dot_f16;
  if (a.type == GgmlType::BF16 && level != SimdLevel::Scalar)
    direct = level == SimdLevel::Avx512 ? avx512::dot_bf16 : avx2::dot_bf16;

  parallel_chunks(pool, a.rows, 16, [&](int64_t begin, int64_t end) {
    thread_local Scratch row_buf;
    float* row = row_buf.get<float>(size_t(a.cols));
    for (int64_t r = begin; r < end; ++r) {
      const uint8_t* w = weight_row(a, r);
      if (!direct && r + 1 < end) {  // the next row streams in while this one is worked on
        const uint8_t* next = weight_row(a, r + 1);
        for (size_t off = 0; off < a.w_row_bytes; off += 64) __builtin_prefetch(next + off);
      }
      if (direct) {
        for (int64_t t = 0; t < a.n_tokens; ++t) a.y[t * a.y_stride + r] = direct(w, a.x + t * a.x_stride, a.cols);
        continue;
      }
      const float* wf = row;
      if (a.type == GgmlType::F32 && reinterpret_cast<uintptr_t>(w) % alignof(float) == 0)
        wf = reinterpret_cast<const float*>(w);
      else if (level == SimdLevel::Scalar) dequantize_row_reference(a.type, w, row, a.cols);
      else dequantize_row(a.type, w, row, a.cols);
      for (int64_t t = 0; t < a.n_tokens; ++t) a.y[t * a.y_stride + r] = dot(wf, a.x + t * a.x_stride, a.cols);
    }
  });
}

// Direct int8 decode kernels (AVX-512 VNNI) for the types that have one.
using DecodeKernel = void (*)(const uint8_t*, size_t, int64_t, int64_t, const DecodeToken*, int, float*, int64_t);

DecodeKernel int8_decode_kernel(GgmlType type) {
  switch (type) {
    case GgmlType::Q4_0: return avx512::decode_q4_0;
    case GgmlType::Q4_1: return avx512::decode_q4_1;
    case GgmlType::Q5_0: return avx512::decode_q5_0;
    case GgmlType::Q5_1: return avx512::decode_q5_1;
    case GgmlType::IQ4_NL: return avx512::decode_iq4_nl;
    case GgmlType::Q8_0: return avx512::decode_q8_0;
    case GgmlType::Q4_K: return avx512::decode_q4_K;
    case GgmlType::Q5_K: return avx512::decode_q5_K;
    case GgmlType::Q6_K: return avx512::decode_q6_K;
    default: return nullptr;
  }
}

void decode_int8(const MatmulArgs& a, ThreadPool& pool, DecodeKernel kernel) {
  thread_local Scratch act_buf;
  const GgmlType act = activation_type(a.type);
  const int64_t n_quads = a.cols / 128;
  const size_t q_bytes = align64(size_t(n_quads) * 128), lane_bytes = size_t(n_quads) * 64;
  const size_t block_bytes = align64(*row_bytes(act, a.cols));
  const size_t per_token = block_bytes + q_bytes + kDecodeLaneArrays * lane_bytes;
  auto* base = act_buf.get<uint8_t>(per_token * size_t(a.n_tokens));
  DecodeToken tokens[kDecodeMaxTokens];
  for (int64_t t = 0; t < a.n_tokens; ++t) {
    uint8_t* p = base + per_token * size_t(t);
    const float* x = a.x + t * a.x_stride;
    avx512::quantize_activations(act, x, a.cols, p);
    const void* blocks = p;
    p += block_bytes;
    DecodeToken& tk = tokens[t];
    tk.q = reinterpret_cast<int8_t*>(p);
    p += q_bytes;
    tk.bias = reinterpret_cast<int32_t*>(p);
    tk.bias_lo = reinterpret_cast<int32_t*>(p + lane_bytes);
    tk.bias_hi = reinterpret_cast<int32_t*>(p + 2 * lane_bytes);
    tk.dx = reinterpret_cast<float*>(p + 3 * lane_bytes);
    tk.neg_dx_sum = reinterpret_cast<float*>(p + 4 * lane_bytes);
    avx512::prepare_decode_token(blocks, act, x, a.cols, avx512::decode_bias_shift(a.type), tk);
  }
  const size_t row_bytes_exact = *row_bytes(a.type, a.cols);
  parallel_chunks(pool, a.rows, 32, [&](int64_t begin, int64_t end) {
    // The kernels step rows by the exact row size; walk rows one at a time when the
    // stride has padding.
    if (a.w_row_bytes == row_bytes_exact) {
      kernel(static_cast<const uint8_t*>(a.w), a.w_row_bytes, begin, end, tokens, int(a.n_tokens), a.y, a.y_stride);
    } else {
      for (int64_t r = begin; r < end; ++r)
        kernel(weight_row(a, r), row_bytes_exact, 0, 1, tokens, int(a.n_tokens), a.y + r, a.y_stride);
    }
  });
}

// AVX2 int8 decode (q4_0, q8_0): activations quantized per call to natural-order q8 blocks.
using Avx2DecodeKernel = void (*)(const uint8_t*, size_t, int64_t, int64_t, const Q8Token*, int, float*, int64_t);

Avx2DecodeKernel avx2_decode_kernel(GgmlType type) {
  switch (type) {
    case GgmlType::Q4_0: return avx2::decode_q4_0;
    case GgmlType::Q8_0: return avx2::decode_q8_0;
    default: return nullptr;
  }
}

void decode_int8_avx2(const MatmulArgs& a, ThreadPool& pool, Avx2DecodeKernel kernel) {
  thread_local Scratch act_buf;
  const int64_t n_blocks = a.cols / 32;
  const size_t per_token = align64(size_t(a.cols)) + 2 * align64(size_t(n_blocks) * 4);
  auto* base = act_buf.get<uint8_t>(per_token * size_t(a.n_tokens));
  Q8Token tokens[kDecodeMaxTokens];
  for (int64_t t = 0; t < a.n_tokens; ++t) {
    uint8_t* p = base + per_token * size_t(t);
    tokens[t].q = reinterpret_cast<int8_t*>(p);
    tokens[t].dx = reinterpret_cast<float*>(p + align64(size_t(a.cols)));
    tokens[t].sum = reinterpret_cast<int32_t*>(p + align64(size_t(a.cols)) + align64(size_t(n_blocks) * 4));
    avx2::prepare_q8_token(a.x + t * a.x_stride, a.cols, tokens[t]);
  }
  const size_t exact = *row_bytes(a.type, a.cols);
  parallel_chunks(pool, a.rows, 32, [&](int64_t begin, int64_t end) {
    if (a.w_row_bytes == exact) {
      kernel(static_cast<const uint8_t*>(a.w), exact, begin, end, tokens, int(a.n_tokens), a.y, a.y_stride);
    } else {
      for (int64_t r = begin; r < end; ++r)
        kernel(weight_row(a, r), exact, 0, 1, tokens, int(a.n_tokens), a.y + r, a.y_stride);
    }
  });
}

// ---- prefill ------------------------------------------------------------------------------

// acc[r * lanes + t] -> y[tok0 + t][row0 + r]: transposed in registers' reach first, so that
// each token's rows go out as one contiguous run (strided single stores to 16 different
// pages cost more than the kernel's arithmetic for small tiles).
void store_tile(const MatmulArgs& a, const float* acc, int lanes, int64_t row0, int rows, int64_t tok0) {
  const int n = int(std::min<int64_t>(lanes, a.n_tokens - tok0));
  if (lanes == 16 && rows == 8) return avx512::store_rows8(acc, n, a.y + tok0 * a.y_stride + row0, a.y_stride);
  float run[16];
  for (int t = 0; t < n; ++t) {
    for (int r = 0; r < rows; ++r) run[r] = acc[r * lanes + t];
    float* dst = a.y + (tok0 + t) * a.y_stride + row0;
    if (rows == 8) std::memcpy(dst, run, 8 * sizeof(float));  // fixed size: inlined, no call
    else std::memcpy(dst, run, sizeof(float) * size_t(rows));
  }
}

// Part `part` of `parts` of the weight bytes of tile `next` (kTileRows rows), for the
// kernels to prefetch while they work on the tile before it; nothing past `end`, the
// calling thread's last tile.
Prefetch next_tile_share(const MatmulArgs& a, int64_t next, int64_t end, int64_t part, int64_t parts) {
  if (next >= end) return {};
  const int64_t row0 = next * kTileRows, rows = std::min<int64_t>(kTileRows, a.rows - row0);
  const int64_t lines = (int64_t(a.w_row_bytes) * rows + 63) / 64, share = (lines + parts - 1) / parts;
  const int64_t first = std::min(lines, part * share);
  return {weight_row(a, row0) + 64 * first, std::min(share, lines - first)};
}

void prefill_float(const MatmulArgs& a, ThreadPool& pool, SimdLevel level) {
  const bool wide = level == SimdLevel::Avx512;
  const int lanes = wide ? 16 : 8;
  const int64_t n_groups = (a.n_tokens + lanes - 1) / lanes;
  const size_t group_floats = size_t(a.cols) * lanes;
  thread_local Scratch panel_buf;
  float* panel = panel_buf.get<float>(group_floats * size_t(n_groups));
  parallel_chunks(pool, n_groups, 1, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      const int n = int(std::min<int64_t>(lanes, a.n_tokens - g * lanes));
      const float* x = a.x + g * lanes * a.x_stride;
      if (wide) avx512::transpose_tokens_f32(x, a.x_stride, n, a.cols, panel + g * group_floats);
      else avx2::transpose_tokens_f32(x, a.x_stride, n, a.cols, panel + g * group_floats);
    }
  });
  auto kernel = wide ? avx512::panel_f32 : avx2::panel_f32;
  const int64_t n_tiles = (a.rows + kTileRows - 1) / kTileRows;
  parallel_chunks(pool, n_tiles, 1, [&](int64_t t0, int64_t t1) {
    thread_local Scratch tile_buf;
    float* tile = tile_buf.get<float>(size_t(kTileRows) * size_t(a.cols));
    alignas(64) float acc[kTileRows * 16], acc2[kTileRows * 16];
    for (int64_t tile_index = t0; tile_index < t1; ++tile_index) {
      const int64_t row0 = tile_index * kTileRows;
      const int rows = int(std::min<int64_t>(kTileRows, a.rows - row0));
      const float* w = tile;
      int64_t w_stride = a.cols;
      if (a.type == GgmlType::F32 && a.w_row_bytes % sizeof(float) == 0 &&
          reinterpret_cast<uintptr_t>(a.w) % alignof(float) == 0) {
        w = reinterpret_cast<const float*>(weight_row(a, row0));
        w_stride = int64_t(a.w_row_bytes / sizeof(float));
      } else {
        for (int r = 0; r < rows; ++r) dequantize_row(a.type, weight_row(a, row0 + r), tile + r * a.cols, a.cols);
      }
      int64_t g = 0;
      if (wide) {  // two token panels per pass
        const int64_t pairs = n_groups / 2;
        for (; g + 2 <= n_groups; g += 2) {
          avx512::panel_f32_pair(w, w_stride, rows, a.cols, panel + g * group_floats, panel + (g + 1) * group_floats,
                                 acc, acc2, next_tile_share(a, tile_index + 1, t1, g / 2, pairs));
          store_tile(a, acc, lanes, row0, rows, g * lanes);
          store_tile(a, acc2, lanes, row0, rows, (g + 1) * lanes);
        }
      }
      for (; g < n_groups; ++g) {
        kernel(w, w_stride, rows, a.cols, panel + g * group_floats, acc, false);
        store_tile(a, acc, lanes, row0, rows, g * lanes);
      }
    }
  });
}

void prefill_int8(const MatmulArgs& a, ThreadPool& pool, Int8Layout layout) {
  const int64_t n_groups = (a.n_tokens + 15) / 16;
  const int64_t n_blocks = a.cols / 32;
  const GgmlType act = activation_type(a.type);
  const size_t token_bytes = align64(*row_bytes(act, a.cols));
  thread_local Scratch panel_buf, act_buf;
  auto* panel = panel_buf.get<Int8PanelBlock>(size_t(n_groups * n_blocks));
  auto* blocks = act_buf.get<uint8_t>(token_bytes * size_t(n_groups * 16));
  parallel_chunks(pool, n_groups, 1, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      const int n = int(std::min<int64_t>(16, a.n_tokens - g * 16));
      const void* token_blocks[16];
      for (int t = 0; t < n; ++t) {
        uint8_t* dst = blocks + token_bytes * size_t(g * 16 + t);
        avx512::quantize_activations(act, a.x + (g * 16 + t) * a.x_stride, a.cols, dst);
        token_blocks[t] = dst;
      }
      avx512::prepare_int8_panel(token_blocks, act, n, a.cols, panel + g * n_blocks);
    }
  });
  const int64_t wgroups = a.cols / layout.group;  // affine groups per weight row
  const int64_t n_tiles = (a.rows + kInt8TileRows - 1) / kInt8TileRows;
  parallel_chunks(pool, n_tiles, 1, [&](int64_t t0, int64_t t1) {
    // Rows are unpacked straight into the block-major tile (hot types), or into a plain row
    // whose blocks are then copied; either way the maps go straight to the tile's rows.
    thread_local Scratch row_buf, tile_buf, meta_buf;
    auto* q_row = row_buf.get<int8_t>(size_t(a.cols) + 4 * size_t(wgroups));
    auto* qsum = reinterpret_cast<int32_t*>(q_row + a.cols);
    auto* tile_q = tile_buf.get<int8_t>(size_t(kInt8TileRows) * size_t(a.cols));
    const size_t n_maps = size_t(kInt8TileRows) * size_t(wgroups);
    auto* tile_bias = meta_buf.get<int32_t>(3 * n_maps);
    auto* tile_scale = reinterpret_cast<float*>(tile_bias + n_maps);
    float* tile_offset = tile_scale + n_maps;
    const Int8Tile tile{tile_q, tile_bias, tile_scale, layout.has_offset ? tile_offset : nullptr, layout.group,
                        wgroups};
    alignas(64) float acc[kInt8TileRows * 16];
    for (int64_t tile_index = t0; tile_index < t1; ++tile_index) {
      const int64_t row0 = tile_index * kInt8TileRows;
      const int rows = int(std::min<int64_t>(kInt8TileRows, a.rows - row0));
      for (int r = 0; r < rows; ++r) {
        const int64_t tile_stride = 32 * kInt8TileRows;  // bytes between a row's blocks
        float* scale = tile_scale + r * wgroups;
        float* offset = tile_offset + r * wgroups;
        int32_t* bias = tile_bias + r * wgroups;
        if (avx512::unpack_int8_row_fast(a.type, weight_row(a, row0 + r), a.cols, {tile_q + 32 * r, scale, offset, qsum},
                                         tile_stride, bias))
          continue;
        unpack_int8_row(a.type, weight_row(a, row0 + r), a.cols, {q_row, scale, offset, qsum});
        avx512::group_bias(q_row, layout.group, wgroups, bias);
        for (int64_t b = 0; b < n_blocks; ++b) std::memcpy(tile_q + 32 * r + b * tile_stride, q_row + 32 * b, 32);
      }
      for (int64_t g = 0; g < n_groups; ++g) {
        avx512::panel_int8(tile, rows, 0, n_blocks, panel + g * n_blocks, acc, false,
                           next_tile_share(a, tile_index + 1, t1, g, n_groups));
        store_tile(a, acc, 16, row0, rows, g * 16);
      }
    }
  });
}

}  // namespace

GgmlType activation_type(GgmlType weight_type) {
  switch (weight_type) {
    case GgmlType::Q4_0:
    case GgmlType::Q5_0:
    case GgmlType::Q8_0:
    case GgmlType::IQ4_NL: return GgmlType::Q8_0;
    case GgmlType::Q4_1:
    case GgmlType::Q5_1: return GgmlType::Q8_1;
    case GgmlType::Q2_K:
    case GgmlType::Q3_K:
    case GgmlType::Q4_K:
    case GgmlType::Q5_K:
    case GgmlType::Q6_K:
    case GgmlType::IQ4_XS: return GgmlType::Q8_K;
    default: return GgmlType::F32;
  }
}

SimdLevel best_simd_level() {
  const CpuFeatures& f = cpu_features();
  if (f.avx512) return SimdLevel::Avx512;
  if (f.avx2) return SimdLevel::Avx2;
  return SimdLevel::Scalar;
}

void matmul(const MatmulArgs& a, ThreadPool& pool, SimdLevel level) {
  check_args(a);
  if (a.rows == 0 || a.n_tokens == 0) return;
  level = std::min(level, best_simd_level());
  const bool vnni = level == SimdLevel::Avx512 && cpu_features().avx512_vnni;
  if (a.n_tokens <= kDecodeMaxTokens || level == SimdLevel::Scalar) {
    if (vnni) {
      if (DecodeKernel k = int8_decode_kernel(a.type)) return decode_int8(a, pool, k);
    } else if (level != SimdLevel::Scalar) {
      if (Avx2DecodeKernel k = avx2_decode_kernel(a.type)) return decode_int8_avx2(a, pool, k);
    }
    return decode_rows(a, pool, level);
  }
  if (vnni && activation_type(a.type) != GgmlType::F32) {
    const Int8Layout layout = int8_layout(a.type);
    if (layout.group != 0) return prefill_int8(a, pool, layout);
  }
  prefill_float(a, pool, level);
}

void matmul(const MatmulArgs& a, ThreadPool& pool) { matmul(a, pool, best_simd_level()); }

bool quantizes_activations(GgmlType type, int64_t n_tokens, SimdLevel level) {
  level = std::min(level, best_simd_level());
  if (level == SimdLevel::Scalar) return false;
  const bool vnni = level == SimdLevel::Avx512 && cpu_features().avx512_vnni;
  if (n_tokens <= kDecodeMaxTokens)
    return vnni ? int8_decode_kernel(type) != nullptr : avx2_decode_kernel(type) != nullptr;
  return vnni && int8_layout(type).group != 0 && activation_type(type) != GgmlType::F32;
}

}  // namespace kiln::cpu
