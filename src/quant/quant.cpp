#include "quant/quant.h"

#include <array>

#include "core/error.h"
#include "quant/codec.h"

namespace kiln {
namespace {

struct CodecTable {
  std::array<const RowCodec*, 64> by_id{};
  CodecTable() {
    for (auto family : {float_codecs(), legacy_codecs(), kquant_codecs(), iquant_codecs(),
                        ternary_codecs(), fp4_codecs(), lowbit_codecs()})
      for (const RowCodec& c : family) by_id.at(static_cast<uint32_t>(c.type)) = &c;
  }
};

const RowCodec& codec_or_fail(GgmlType type, const char* what) {
  const RowCodec* c = find_codec(type);
  if (!c) fail("{}: kiln has no codec for tensor type {}", what, type_name(type));
  return *c;
}

void check_length(GgmlType type, int64_t n) {
  if (!row_bytes(type, n))
    fail("row of {} elements is not a whole number of {} blocks ({} elements each)", n,
         type_name(type), traits(type).block_size);
}

}  // namespace

const RowCodec* find_codec(GgmlType type) {
  static const CodecTable table;
  const uint32_t id = static_cast<uint32_t>(type);
  return id < table.by_id.size() ? table.by_id[id] : nullptr;
}

void dequantize_row_reference(GgmlType type, const void* src, float* dst, int64_t n) {
  check_length(type, n);
  codec_or_fail(type, "dequantize").dequantize_reference(src, dst, n);
}

void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n) {
  check_length(type, n);
  const RowCodec& c = codec_or_fail(type, "dequantize");
  (c.dequantize_fast ? c.dequantize_fast : c.dequantize_reference)(src, dst, n);
}

bool can_quantize(GgmlType type) {
  const RowCodec* c = find_codec(type);
  return c && c->quantize;
}

void quantize_row(GgmlType type, const float* src, void* dst, int64_t n, const float* importance) {
  check_length(type, n);
  const RowCodec& c = codec_or_fail(type, "quantize");
  if (!c.quantize) fail("quantize: kiln cannot quantize into {}", type_name(type));
  c.quantize(src, dst, n, importance);
}

}  // namespace kiln
