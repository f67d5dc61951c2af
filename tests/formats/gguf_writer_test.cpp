// GGUF writer -> reader round trips: every value type, nested arrays, every tensor type,
// alignments, streamed data, split files, and a version 2 file built by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/mapped_file.h"
#include "formats/gguf.h"
#include "formats/gguf_writer.h"
#include "format_test_util.h"

namespace kiln {
namespace {

using gguf::MetaValue;
using gguf::ValueType;
using testing::expect_error;
using testing::random_bytes;
using testing::ScratchDir;

// Fills a writer with one key of every scalar type (extremes included), strings and arrays.
void add_all_value_types(gguf::Writer& w) {
  w.set_u8("t.u8", 255);
  w.set_i8("t.i8", -128);
  w.set_u16("t.u16", 65535);
  w.set_i16("t.i16", -32768);
  w.set_u32("t.u32", 4000000000u);
  w.set_i32("t.i32", std::numeric_limits<int32_t>::min());
  w.set_u64("t.u64", std::numeric_limits<uint64_t>::max());
  w.set_i64("t.i64", std::numeric_limits<int64_t>::min());
  w.set_f32("t.f32", -1.5e-7f);
  w.set_f64("t.f64", 3.141592653589793);
  w.set_bool("t.true", true);
  w.set_bool("t.false", false);
  w.set_string("t.string", "héllo, wörld ✓");
  w.set_string("t.empty", "");
  w.set("t.strings", MetaValue::strings({"<s>", "</s>", "", "▁the"}));
  w.set_array("t.f32s", ValueType::F32, {MetaValue::f32(1.0f), MetaValue::f32(-2.5f), MetaValue::f32(INFINITY)});
  w.set_array("t.i64s", ValueType::I64, {MetaValue::i64(-1), MetaValue::i64(1ll << 40)});
  w.set_array("t.empty_array", ValueType::U32, {});
  w.set_array("t.nested", ValueType::ARRAY,
              {MetaValue::array(ValueType::I32, {MetaValue::i32(1), MetaValue::i32(2)}),
               MetaValue::array(ValueType::I32, {}),
               MetaValue::array(ValueType::I32, {MetaValue::i32(-3)})});
  w.set_array("t.nested_strings", ValueType::ARRAY,
              {MetaValue::array(ValueType::ARRAY, {MetaValue::strings({"a", "b"})})});
}

void check_all_value_types(const gguf::File& f) {
  EXPECT_EQ(f.get("t.u8").type, ValueType::U8);
  EXPECT_EQ(f.get_int("t.u8"), 255);
  EXPECT_EQ(f.get("t.i8").type, ValueType::I8);
  EXPECT_EQ(f.get_int("t.i8"), -128);
  EXPECT_EQ(f.get("t.u16").type, ValueType::U16);
  EXPECT_EQ(f.get_int("t.u16"), 65535);
  EXPECT_EQ(f.get("t.i16").type, ValueType::I16);
  EXPECT_EQ(f.get_int("t.i16"), -32768);
  EXPECT_EQ(f.get("t.u32").type, ValueType::U32);
  EXPECT_EQ(f.get_int("t.u32"), 4000000000ll);
  EXPECT_EQ(f.get("t.i32").type, ValueType::I32);
  EXPECT_EQ(f.get_int("t.i32"), std::numeric_limits<int32_t>::min());
  EXPECT_EQ(f.get("t.u64").type, ValueType::U64);
  EXPECT_EQ(f.get("t.u64").num.u, std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(f.get("t.i64").type, ValueType::I64);
  EXPECT_EQ(f.get_int("t.i64"), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(f.get("t.f32").type, ValueType::F32);
  EXPECT_EQ(float(f.get_float("t.f32")), -1.5e-7f);
  EXPECT_EQ(f.get("t.f64").type, ValueType::F64);
  EXPECT_EQ(f.get_float("t.f64"), 3.141592653589793);
  EXPECT_TRUE(f.get_bool("t.true", false));
  EXPECT_FALSE(f.get_bool("t.false", true));
  EXPECT_EQ(f.get_string("t.string"), "héllo, wörld ✓");
  EXPECT_EQ(f.get_string("t.empty"), "");

  const auto& strings = f.get("t.strings").as_array();
  ASSERT_EQ(strings.size(), 4u);
  EXPECT_EQ(strings[0].as_string(), "<s>");
  EXPECT_EQ(strings[2].as_string(), "");
  EXPECT_EQ(strings[3].as_string(), "▁the");
  const auto& f32s = f.get("t.f32s");
  EXPECT_EQ(f32s.elem_type, ValueType::F32);
  ASSERT_EQ(f32s.items.size(), 3u);
  EXPECT_EQ(f32s.items[1].as_float(), -2.5);
  EXPECT_TRUE(std::isinf(f32s.items[2].as_float()));
  const auto& i64s = f.get("t.i64s").as_array();
  ASSERT_EQ(i64s.size(), 2u);
  EXPECT_EQ(i64s[1].as_int(), 1ll << 40);
  EXPECT_EQ(f.get("t.empty_array").elem_type, ValueType::U32);
  EXPECT_TRUE(f.get("t.empty_array").items.empty());

  const auto& nested = f.get("t.nested");
  EXPECT_EQ(nested.elem_type, ValueType::ARRAY);
  ASSERT_EQ(nested.items.size(), 3u);
  EXPECT_EQ(nested.items[0].elem_type, ValueType::I32);
  ASSERT_EQ(nested.items[0].items.size(), 2u);
  EXPECT_EQ(nested.items[0].items[1].as_int(), 2);
  EXPECT_TRUE(nested.items[1].items.empty());
  EXPECT_EQ(nested.items[2].items[0].as_int(), -3);
  const auto& deep = f.get("t.nested_strings").items.at(0).items.at(0).items;
  ASSERT_EQ(deep.size(), 2u);
  EXPECT_EQ(deep[1].as_string(), "b");
}

TEST(GgufWriter, EveryValueTypeRoundTrips) {
  gguf::Writer w;
  add_all_value_types(w);
  const auto bytes = w.to_bytes();
  const auto f = gguf::File::open_memory(bytes, "values.gguf");
  EXPECT_EQ(f->version(), 3u);
  ASSERT_EQ(f->metadata().size(), w.metadata().size());
  for (size_t k = 0; k < w.metadata().size(); ++k) EXPECT_EQ(f->metadata()[k].first, w.metadata()[k].first);
  check_all_value_types(*f);
  EXPECT_TRUE(f->tensors().empty());
}

TEST(GgufWriter, SettingAKeyAgainReplacesItInPlaceAndRemoveDeletes) {
  gguf::Writer w;
  w.set_u32("a", 1);
  w.set_string("b", "x");
  w.set_f32("a", 2.0f);
  EXPECT_TRUE(w.remove("b"));
  EXPECT_FALSE(w.remove("b"));
  w.set_bool("c", true);
  const auto bytes = w.to_bytes();
  const auto f = gguf::File::open_memory(bytes, "set.gguf");
  ASSERT_EQ(f->metadata().size(), 2u);
  EXPECT_EQ(f->metadata()[0].first, "a");
  EXPECT_EQ(f->get("a").type, ValueType::F32);
  EXPECT_EQ(f->metadata()[1].first, "c");
}

// One tensor of every known type, with random bytes, at alignments 32 (default), 64, 1 and 4096.
void round_trip_all_tensor_types(uint32_t alignment) {
  SCOPED_TRACE("alignment " + std::to_string(alignment));
  gguf::Writer w;
  if (alignment != 32) w.set_alignment(alignment);
  w.set_string("general.architecture", "test");
  size_t count = 0;
  const TypeTraits* types = all_types(&count);
  std::vector<std::vector<uint8_t>> payloads;
  for (size_t k = 0; k < count; ++k) {
    const TypeTraits& tt = types[k];
    const int64_t row = int64_t(tt.block_size) * int64_t(1 + k % 3);
    const std::vector<int64_t> shape = k % 2 ? std::vector<int64_t>{row, 3} : std::vector<int64_t>{row, 2, 1, 2};
    const size_t bytes = *row_bytes(tt.type, row) * size_t(shape.size() == 2 ? 3 : 4);
    payloads.push_back(random_bytes(bytes, uint32_t(k)));
    w.add_tensor(fmt::format("t.{}", tt.name), tt.type, shape, payloads.back());
  }
  w.add_tensor("scalar", GgmlType::F32, {}, random_bytes(4, 99));
  w.add_tensor("empty", GgmlType::F16, {0, 5}, std::vector<uint8_t>{});

  const auto bytes = w.to_bytes();
  EXPECT_EQ(bytes.size() % alignment, 0u);
  const auto f = gguf::File::open_memory(bytes, "types.gguf");
  EXPECT_EQ(f->alignment(), alignment);
  ASSERT_EQ(f->tensors().size(), count + 2);
  for (size_t k = 0; k < count; ++k) {
    const auto& t = f->tensors()[k];
    SCOPED_TRACE(t.name);
    EXPECT_EQ(t.type, types[k].type);
    EXPECT_EQ(t.shape, w.tensors()[k].shape);
    EXPECT_EQ(t.file_offset % alignment, 0u);
    ASSERT_EQ(t.bytes, payloads[k].size());
    EXPECT_EQ(std::memcmp(t.data, payloads[k].data(), t.bytes), 0);
  }
  EXPECT_TRUE(f->find_tensor("scalar")->shape.empty());
  EXPECT_EQ(f->find_tensor("scalar")->elements(), 1);
  EXPECT_EQ(f->find_tensor("empty")->bytes, 0u);
}

TEST(GgufWriter, EveryTensorTypeRoundTripsAtDefaultAlignment) { round_trip_all_tensor_types(32); }
TEST(GgufWriter, EveryTensorTypeRoundTripsAtOtherAlignments) {
  round_trip_all_tensor_types(64);
  round_trip_all_tensor_types(1);
  round_trip_all_tensor_types(4096);
}

TEST(GgufWriter, StreamedDataInPiecesMatchesTheInMemoryFile) {
  ScratchDir dir;
  gguf::Writer w;
  w.set_string("general.architecture", "test");
  w.set_alignment(64);
  const auto a = random_bytes(4 * 100, 1), b = random_bytes(34 * 3, 2), c = random_bytes(2 * 7, 3);
  w.add_tensor("a", GgmlType::F32, {100});
  w.add_tensor("b", GgmlType::Q8_0, {32, 3});
  w.add_tensor("none", GgmlType::F32, {0});
  w.add_tensor("c", GgmlType::F16, {7});
  {
    auto out = w.begin(dir.file("streamed.gguf"));
    EXPECT_EQ(out.current_tensor(), "a");
    out.write(std::span(a).first(7));  // pieces that straddle tensor boundaries
    out.write(std::span(a).subspan(7));
    EXPECT_EQ(out.current_tensor(), "b");
    std::vector<uint8_t> rest(b);
    rest.insert(rest.end(), c.begin(), c.begin() + 5);
    out.write(rest);
    out.write(std::span(c).subspan(5));
    EXPECT_EQ(out.current_tensor(), "");
    EXPECT_FALSE(std::filesystem::exists(dir.file("streamed.gguf"))) << "the file appears only on finish()";
    out.finish();
  }
  gguf::Writer same;
  same.set_string("general.architecture", "test");
  same.set_alignment(64);
  same.add_tensor("a", GgmlType::F32, {100}, a);
  same.add_tensor("b", GgmlType::Q8_0, {32, 3}, b);
  same.add_tensor("none", GgmlType::F32, {0}, std::span<const uint8_t>());
  same.add_tensor("c", GgmlType::F16, {7}, c);
  const auto expected = same.to_bytes();
  const MappedFile written(dir.file("streamed.gguf"));
  ASSERT_EQ(written.size(), expected.size());
  EXPECT_EQ(std::memcmp(written.data(), expected.data(), expected.size()), 0);
  EXPECT_FALSE(std::filesystem::exists(dir.file("streamed.gguf.tmp")));

  // write_tensor() checks the order and the size.
  auto out = w.begin(dir.file("checked.gguf"));
  expect_error([&] { out.write_tensor("b", b); }, {"checked.gguf", "'b'", "'a'"});
  expect_error([&] { out.write_tensor("a", b); }, {"checked.gguf", "'a'", "bytes"});
  out.write_tensor("a", a);
  out.write_tensor("b", b);
  expect_error([&] { out.finish(); }, {"checked.gguf", "tensor 'c'", "0 of its 14 bytes"});
}

TEST(GgufWriter, AStreamDroppedBeforeFinishLeavesNoFile) {
  ScratchDir dir;
  gguf::Writer w;
  w.add_tensor("a", GgmlType::F32, {4});
  {
    auto out = w.begin(dir.file("dropped.gguf"));
    out.write(random_bytes(8, 1));
  }
  EXPECT_FALSE(std::filesystem::exists(dir.file("dropped.gguf")));
  EXPECT_FALSE(std::filesystem::exists(dir.file("dropped.gguf.tmp")));
  auto out = w.begin(dir.file("toomuch.gguf"));
  expect_error([&] { out.write(random_bytes(20, 1)); }, {"toomuch.gguf", "beyond the last tensor"});
}

TEST(GgufWriter, RefusesBadTensorsAndValues) {
  gguf::Writer w;
  w.add_tensor("x", GgmlType::F32, {4});
  expect_error([&] { w.add_tensor("x", GgmlType::F32, {4}); }, {"duplicate", "'x'"});
  expect_error([&] { w.add_tensor("q", GgmlType::Q4_0, {31}); }, {"'q'", "31", "block size 32"});
  expect_error([&] { w.add_tensor("d", GgmlType::F32, {1, 1, 1, 1, 1}); }, {"'d'", "5 dimensions"});
  expect_error([&] { w.add_tensor("n", GgmlType::F32, {-1}); }, {"'n'", "negative"});
  expect_error([&] { w.add_tensor("o", GgmlType::F32, {1ll << 40, 1ll << 40}); }, {"'o'", "overflow"});
  expect_error([&] { w.add_tensor("u", GgmlType(77), {4}); }, {"'u'", "unknown type"});
  expect_error([&] { w.add_tensor("s", GgmlType::F32, {4}, random_bytes(15, 1)); }, {"'s'", "15", "16"});
  expect_error([&] { w.add_tensor("\xff", GgmlType::F32, {4}); }, {"UTF-8"});
  expect_error([&] { w.set_alignment(48); }, {"alignment", "48"});
  expect_error([&] { w.set_u8("", 1); }, {"empty"});
  expect_error([&] { MetaValue::array(ValueType::U8, {MetaValue::i8(1)}); }, {"item 0", "i8", "u8"});
  expect_error([&] { w.to_bytes(); }, {"'x'", "no data"});

  gguf::Writer bad_string;
  bad_string.set_string("k", "\xc0\x80");  // an overlong encoding
  expect_error([&] { bad_string.to_bytes(); }, {"'k'", "UTF-8"});
  gguf::Writer bad_alignment;
  bad_alignment.set_u64("general.alignment", 64);
  expect_error([&] { bad_alignment.to_bytes(); }, {"general.alignment", "u32"});
}

TEST(GgufWriter, CopyMetadataFromAFileKeepsEverythingButSplitKeys) {
  gguf::Writer w;
  add_all_value_types(w);
  w.set_u16("split.no", 0);
  w.set_u16("split.count", 1);
  w.set_string("general.name", "source");
  const auto bytes = w.to_bytes();
  const auto source = gguf::File::open_memory(bytes, "source.gguf");

  gguf::Writer copy;
  copy.set_string("general.name", "replaced below");
  copy.copy_metadata_from(*source, [](std::string_view key) { return key == "t.empty"; });
  EXPECT_EQ(copy.find("split.no"), nullptr);
  EXPECT_EQ(copy.find("split.count"), nullptr);
  EXPECT_EQ(copy.find("t.empty"), nullptr);
  ASSERT_NE(copy.find("general.name"), nullptr);
  EXPECT_EQ(copy.find("general.name")->str, "source");
  copy.set_string("t.empty", "");
  const auto copied_bytes = copy.to_bytes();
  const auto copied = gguf::File::open_memory(copied_bytes, "copy.gguf");
  check_all_value_types(*copied);
}

// A version 2 file, written byte by byte: v2 differs from v3 only in the version field.
TEST(GgufReader, ReadsAHandWrittenVersion2File) {
  testing::GgufBytes g;
  g.header(2, 2, 3);
  g.kv_str("general.architecture", "llama");
  g.kv_u32("llama.block_count", 7);
  g.str("tokenizer.ggml.scores").u32(9).u32(6).u64(2).pod(0.5f).pod(-1.0f);  // array of f32
  g.tensor("a", {3}, 0, 0);
  g.tensor("b", {2, 2}, 1, 32);
  g.pad_to(32);
  g.pod(1.0f).pod(2.0f).pod(3.0f).zeros(20);
  g.pod(uint16_t(0x3c00)).pod(uint16_t(0)).pod(uint16_t(0)).pod(uint16_t(0xbc00));
  const auto f = gguf::File::open_memory(g.bytes, "v2.gguf");
  EXPECT_EQ(f->version(), 2u);
  EXPECT_EQ(f->architecture(), "llama");
  EXPECT_EQ(f->get_int("llama.block_count"), 7);
  EXPECT_EQ(f->get("tokenizer.ggml.scores").items.at(1).as_float(), -1.0);
  const auto* a = f->find_tensor("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->shape, std::vector<int64_t>{3});
  float third = 0;
  std::memcpy(&third, a->data + 8, 4);
  EXPECT_EQ(third, 3.0f);
  const auto* b = f->find_tensor("b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->type, GgmlType::F16);
  EXPECT_EQ(b->bytes, 8u);
  EXPECT_EQ(b->data[7], 0xbc);
}

}  // namespace
}  // namespace kiln
