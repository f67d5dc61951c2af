#pragma once
// Weight rows rewritten as signed 8-bit integers in groups, each group with one affine map:
//
//   w[g * group + j] = scale[g] * q[g * group + j] + offset[g]
//
// Every integer-coded ggml type (legacy, K-quants, iq4) fits this form with group 32 or
// 16, which lets one int8 kernel (vpdpbusd) multiply any of them. The unpacked row is a
// scratch copy made per row tile, reused by every token of a prefill.
#include <cstdint>

#include "quant/types.h"

namespace kiln::cpu {

struct Int8Layout {
  int group = 0;            // 16 or 32 elements per affine map; 0: type has no int8 form
  bool has_offset = false;  // false: offset[] is all zero (and is not written)
};

// The layout of `type`, group 0 when the type is not supported here.
Int8Layout int8_layout(GgmlType type);

// Where an unpacked row goes. `qsum[g]` = sum of q over group g (for the +128 shift of
// the activations in the int8 kernels).
struct Int8Row {
  int8_t* q;       // cols
  float* scale;    // cols / group, entry g at scale[g * map_stride]
  float* offset;   // cols / group (only when has_offset), likewise strided
  int32_t* qsum;   // cols / group (contiguous)
  int64_t map_stride = 1;
};

// Unpacks one row of `cols` elements (a whole number of blocks). Scalar code, exact: the
// affine maps reproduce the reference dequantization up to float rounding of scale * q.
void unpack_int8_row(GgmlType type, const void* row, int64_t cols, const Int8Row& out);

}  // namespace kiln::cpu
