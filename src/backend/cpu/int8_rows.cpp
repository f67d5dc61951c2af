// Scalar unpacking of integer-coded weight rows into int8 groups (see int8_rows.h).
// Each function follows the block layout documented in quant/blocks.h and
// quant/iquant_blocks.h; the comments say only how the affine map is chosen.
#include "backend/cpu/int8_rows.h"

#include <cstring>

#include "core/error.h"
#include "core/half.h"
#include "quant/blocks.h"
#include "quant/iquant_blocks.h"
#include "quant/iquant_grids.h"

namespace kiln::cpu {
namespace {

template <typename Block>
Block block_at(const void* row, int64_t index) {
  Block b;
  std::memcpy(&b, static_cast<const uint8_t*>(row) + index * int64_t(sizeof(Block)), sizeof(Block));
  return b;
}

int32_t sum_of(const int8_t* q, int n) {
  int32_t s = 0;
  for (int i = 0; i < n; ++i) s += q[i];
  return s;
}

// Legacy 4/5-bit blocks: element j in the low nibble of qs[j], j + 16 in the high nibble.
void nibbles_32(const uint8_t* qs, uint32_t high_bits, int bias, int8_t* q) {
  for (int j = 0; j < 16; ++j) {
    q[j] = int8_t((qs[j] & 0xF) + (((high_bits >> j) & 1) << 4) - bias);
    q[j + 16] = int8_t((qs[j] >> 4) + (((high_bits >> (j + 16)) & 1) << 4) - bias);
  }
}

void unpack_q4_0(const void* row, int64_t nb, const Int8Row& o) {
  for (int64_t b = 0; b < nb; ++b) {
    const auto blk = block_at<BlockQ4_0>(row, b);
    nibbles_32(blk.qs, 0, 8, o.q + 32 * b);  // (q - 8) * d
    o.scale[(b) * o.map_stride] = f16_to_f32(blk.d);
    o.qsum[b] = sum_of(o.q + 32 * b, 32);
  }
}

void unpack_q4_1(const void* row, int64_t nb, const Int8Row& o) {
  for (int64_t b = 0; b < nb; ++b) {
    const auto blk = block_at<BlockQ4_1>(row, b);
    nibbles_32(blk.qs, 0, 0, o.q + 32 * b);  // q * d + m
    o.scale[(b) * o.map_stride] = f16_to_f32(blk.d);
    o.offset[(b) * o.map_stride] = f16_to_f32(blk.m);
    o.qsum[b] = sum_of(o.q + 32 * b, 32);
  }
}

void unpack_q5_0(const void* row, int64_t nb, const Int8Row& o) {
  for (int64_t b = 0; b < nb; ++b) {
    const auto blk = block_at<BlockQ5_0>(row, b);
    uint32_t qh;
    std::memcpy(&qh, blk.qh, 4);
    nibbles_32(blk.qs, qh, 16, o.q + 32 * b);  // (q - 16) * d
    o.scale[(b) * o.map_stride] = f16_to_f32(blk.d);
    o.qsum[b] = sum_of(o.q + 32 * b, 32);
  }
}

void unpack_q5_1(const void* row, int64_t nb, const Int8Row& o) {
  for (int64_t b = 0; b < nb; ++b) {
    const auto blk = block_at<BlockQ5_1>(row, b);
    uint32_t qh;
    std::memcpy(&qh, blk.qh, 4);
    nibbles_32(blk.qs, qh, 0, o.q + 32 * b);  // q * d + m
    o.scale[(b) * o.map_stride] = f16_to_f32(blk.d);
    o.offset[(b) * o.map_stride] = f16_to_f32(blk.m);
    o.qsum[b] = sum_of(o.q + 32 * b, 32);
  }
}

void unpack_q8_0(const void* row, int64_t nb, const Int8Row& o) {
  for (int64_t b = 0; b < nb; ++b) {
    const auto blk = block_at<BlockQ8_0>(row, b);
    std::memcpy(o.q + 32 * b, blk.qs, 32);
    o.scale[(b) * o.map_stride] = f16_to_f32(blk.d);
    o.qsum[b] = sum_of(o.q + 32 * b, 32);
  }
}

void unpack_iq4_nl(const void* row, int64_t nb, const Int8Row& o) {
  for (int64_t b = 0; b < nb; ++b) {
    const auto blk = block_at<iquant::BlockIq4nl>(row, b);
    int8_t* q = o.q + 32 * b;
    for (int j = 0; j < 16; ++j) {
      q[j] = iquant::kIq4Levels[blk.qs[j] & 0xF];
      q[j + 16] = iquant::kIq4Levels[blk.qs[j] >> 4];
    }
    o.scale[(b) * o.map_stride] = f16_to_f32(blk.d);
    o.qsum[b] = sum_of(q, 32);
  }
}

void unpack_iq4_xs(const void* row, int64_t nb, const Int8Row& o) {
  for (int64_t b = 0; b < nb; ++b) {
    const auto blk = block_at<iquant::BlockIq4xs>(row, b);
    const float d = f16_to_f32(blk.d);
    for (int g = 0; g < 8; ++g) {
      const int low = (blk.scales_l[g / 2] >> (4 * (g % 2))) & 0xF;
      const int high = (blk.scales_h >> (2 * g)) & 3;
      const int64_t gi = 8 * b + g;
      int8_t* q = o.q + 32 * gi;
      for (int j = 0; j < 16; ++j) {
        q[j] = iquant::kIq4Levels[blk.qs[16 * g + j] & 0xF];
        q[j + 16] = iquant::kIq4Levels[blk.qs[16 * g + j] >> 4];
      }
      o.scale[(gi) * o.map_stride] = d * float((low | (high << 4)) - 32);
      o.qsum[gi] = sum_of(q, 32);
    }
  }
}

void unpack_q2_K(const void* row, int64_t nb, const Int8Row& o) {
  for (int64_t b = 0; b < nb; ++b) {
    const auto blk = block_at<BlockQ2_K>(row, b);
    const float d = f16_to_f32(blk.d), dmin = f16_to_f32(blk.dmin);
    int8_t* q = o.q + 256 * b;
    for (int half = 0; half < 2; ++half)
      for (int shift = 0; shift < 4; ++shift)
        for (int l = 0; l < 32; ++l)
          q[128 * half + 32 * shift + l] = int8_t((blk.qs[32 * half + l] >> (2 * shift)) & 3);
    for (int s = 0; s < 16; ++s) {  // d * scale * q - dmin * min
      o.scale[(16 * b + s) * o.map_stride] = d * float(blk.scales[s] & 0xF);
      o.offset[(16 * b + s) * o.map_stride] = -dmin * float(blk.scales[s] >> 4);
      o.qsum[16 * b + s] = sum_of(q + 16 * s, 16);
    }
  }
}

void unpack_q3_K(const void* row, int64_t nb, const Int8Row& o) {
  for (int64_t b = 0; b < nb; ++b) {
    const auto blk = block_at<BlockQ3_K>(row, b);
    const float d = f16_to_f32(blk.d);
    int8_t scales[16];
    q3k_unpack_scales(blk.scales, scales);
    int8_t* q = o.q + 256 * b;
    for (int half = 0; half < 2; ++half)
      for (int shift = 0; shift < 4; ++shift)
        for (int l = 0; l < 32; ++l) {
          const int j = 128 * half + 32 * shift + l;
          const int low = (blk.qs[32 * half + l] >> (2 * shift)) & 3;
          const int high = (blk.hmask[j % 32] >> (j / 32)) & 1;
          q[j] = int8_t(low + 4 * high - 4);  // d * (scale - 32) * (q - 4)
        }
    for (int s = 0; s < 16; ++s) {
      o.scale[(16 * b + s) * o.map_stride] = d * float(scales[s]);
      o.qsum[16 * b + s] = sum_of(q + 16 * s, 16);
    }
  }
}

void unpack_q4_K(const void* row, int64_t nb, const Int8Row& o) {
  for (int64_t b = 0; b < nb; ++b) {
    const auto blk = block_at<BlockQ4_K>(row, b);
    const float d = f16_to_f32(blk.d), dmin = f16_to_f32(blk.dmin);
    int8_t* q = o.q + 256 * b;
    for (int g = 0; g < 4; ++g)
      for (int l = 0; l < 32; ++l) {
        q[64 * g + l] = int8_t(blk.qs[32 * g + l] & 0xF);
        q[64 * g + 32 + l] = int8_t(blk.qs[32 * g + l] >> 4);
      }
    for (int s = 0; s < 8; ++s) {  // d * scale * q - dmin * min
      uint8_t sc, mn;
      kquant_scale_min(s, blk.scales, &sc, &mn);
      o.scale[(8 * b + s) * o.map_stride] = d * float(sc);
      o.offset[(8 * b + s) * o.map_stride] = -dmin * float(mn);
      o.qsum[8 * b + s] = sum_of(q + 32 * s, 32);
    }
  }
}

void unpack_q5_K(const void* row, int64_t nb, const Int8Row& o) {
  for (int64_t b = 0; b < nb; ++b) {
    const auto blk = block_at<BlockQ5_K>(row, b);
    const float d = f16_to_f32(blk.d), dmin = f16_to_f32(blk.dmin);
    int8_t* q = o.q + 256 * b;
    for (int g = 0; g < 4; ++g)
      for (int l = 0; l < 32; ++l) {
        const int h_lo = (blk.qh[l] >> (2 * g)) & 1, h_hi = (blk.qh[l] >> (2 * g + 1)) & 1;
        q[64 * g + l] = int8_t((blk.qs[32 * g + l] & 0xF) + 16 * h_lo);
        q[64 * g + 32 + l] = int8_t((blk.qs[32 * g + l] >> 4) + 16 * h_hi);
      }
    for (int s = 0; s < 8; ++s) {
      uint8_t sc, mn;
      kquant_scale_min(s, blk.scales, &sc, &mn);
      o.scale[(8 * b + s) * o.map_stride] = d * float(sc);
      o.offset[(8 * b + s) * o.map_stride] = -dmin * float(mn);
      o.qsum[8 * b + s] = sum_of(q + 32 * s, 32);
    }
  }
}

void unpack_q6_K(const void* row, int64_t nb, const Int8Row& o) {
  for (int64_t b = 0; b < nb; ++b) {
    const auto blk = block_at<BlockQ6_K>(row, b);
    const float d = f16_to_f32(blk.d);
    int8_t* q = o.q + 256 * b;
    for (int half = 0; half < 2; ++half) {
      const uint8_t* ql = blk.ql + 64 * half;
      const uint8_t* qh = blk.qh + 32 * half;
      int8_t* out = q + 128 * half;
      for (int l = 0; l < 32; ++l) {  // d * scale * (q - 32)
        out[l] = int8_t(((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
        out[l + 32] = int8_t(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
        out[l + 64] = int8_t(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
        out[l + 96] = int8_t(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
      }
    }
    for (int s = 0; s < 16; ++s) {
      o.scale[(16 * b + s) * o.map_stride] = d * float(blk.scales[s]);
      o.qsum[16 * b + s] = sum_of(q + 16 * s, 16);
    }
  }
}

using UnpackFn = void (*)(const void* row, int64_t n_blocks, const Int8Row& out);

struct Entry {
  Int8Layout layout;
  int block_size;
  UnpackFn unpack;
};

Entry entry_of(GgmlType type) {
  switch (type) {
    case GgmlType::Q4_0: return {{32, false}, 32, unpack_q4_0};
    case GgmlType::Q4_1: return {{32, true}, 32, unpack_q4_1};
    case GgmlType::Q5_0: return {{32, false}, 32, unpack_q5_0};
    case GgmlType::Q5_1: return {{32, true}, 32, unpack_q5_1};
    case GgmlType::Q8_0: return {{32, false}, 32, unpack_q8_0};
    case GgmlType::IQ4_NL: return {{32, false}, 32, unpack_iq4_nl};
    case GgmlType::IQ4_XS: return {{32, false}, 256, unpack_iq4_xs};
    case GgmlType::Q2_K: return {{16, true}, 256, unpack_q2_K};
    case GgmlType::Q3_K: return {{16, false}, 256, unpack_q3_K};
    case GgmlType::Q4_K: return {{32, true}, 256, unpack_q4_K};
    case GgmlType::Q5_K: return {{32, true}, 256, unpack_q5_K};
    case GgmlType::Q6_K: return {{16, false}, 256, unpack_q6_K};
    default: return {{0, false}, 0, nullptr};
  }
}

}  // namespace

Int8Layout int8_layout(GgmlType type) { return entry_of(type).layout; }

void unpack_int8_row(GgmlType type, const void* row, int64_t cols, const Int8Row& out) {
  const Entry e = entry_of(type);
  if (!e.unpack) fail("unpack_int8_row: type {} has no int8 form", type_name(type));
  if (cols % e.block_size != 0)
    fail("unpack_int8_row: {} columns is not a whole number of {} blocks", cols, type_name(type));
  e.unpack(row, cols / e.block_size, out);
}

}  // namespace kiln::cpu
