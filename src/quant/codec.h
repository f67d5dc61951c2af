#pragma once
// The per-type row codecs behind quant.h. Each format family lives in its own file and
// lists its codecs; quant.cpp gathers the lists into one table indexed by type.
#include <cstdint>
#include <span>

#include "quant/types.h"

namespace kiln {

using DequantizeFn = void (*)(const void* src, float* dst, int64_t n);
using QuantizeFn = void (*)(const float* src, void* dst, int64_t n, const float* importance);

struct RowCodec {
  GgmlType type;
  DequantizeFn dequantize_reference;  // scalar, bit-exact with ggml; never null
  DequantizeFn dequantize_fast;       // SIMD path with identical results; null = use reference
  QuantizeFn quantize;                // null when kiln cannot produce this type
};

// One list per family, each defined in the file named beside it.
std::span<const RowCodec> float_codecs();    // quant/float_types.cpp: f32 f16 bf16 (and f64, i8..i64 read-only)
std::span<const RowCodec> legacy_codecs();   // quant/legacy.cpp: q4_0 q4_1 q5_0 q5_1 q8_0 q8_1
std::span<const RowCodec> kquant_codecs();   // quant/kquants.cpp: q2_K..q6_K q8_K
std::span<const RowCodec> iquant_codecs();   // quant/iquants.cpp: iq1_s iq1_m iq2_* iq3_* iq4_nl iq4_xs
std::span<const RowCodec> ternary_codecs();  // quant/ternary.cpp: tq1_0 tq2_0
std::span<const RowCodec> fp4_codecs();      // quant/fp4.cpp: mxfp4 nvfp4
std::span<const RowCodec> lowbit_codecs();   // quant/lowbit.cpp: q1_0 q2_0

// The codec of `type`, or null when kiln has none.
const RowCodec* find_codec(GgmlType type);

}  // namespace kiln
