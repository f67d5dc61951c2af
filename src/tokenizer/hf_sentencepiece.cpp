// SentencePiece tokenizer.model: a protobuf ModelProto, read with a minimal wire-format
// reader. Fields used (sentencepiece_model.proto):
//   ModelProto      1: repeated SentencePiece pieces, 2: TrainerSpec, 3: NormalizerSpec
//   SentencePiece   1: piece (string), 2: score (float), 3: type (enum, GGUF's numbering)
//   TrainerSpec     3: model_type (1 unigram, 2 BPE), 40: unk_id, 41: bos_id, 42: eos_id,
//                   43: pad_id
//   NormalizerSpec  3: add_dummy_prefix (default true)
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "tokenizer/hf_files.h"

namespace kiln {

namespace {

namespace fs = std::filesystem;

enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

// Reads protobuf fields from a byte range; every read is bounds-checked.
class ProtoReader {
 public:
  ProtoReader(std::string_view data, std::string_view what) : data_(data), what_(what) {}

  bool done() const { return pos_ >= data_.size(); }

  // Reads the next field's tag; returns its number and sets `wire`.
  uint32_t next_field(WireType& wire) {
    const uint64_t tag = varint();
    wire = WireType(tag & 7);
    return uint32_t(tag >> 3);
  }

  uint64_t varint() {
    uint64_t value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      KILN_CHECK(pos_ < data_.size(), "tokenizer: {}: truncated varint at byte {}", what_, pos_);
      const uint8_t b = uint8_t(data_[pos_++]);
      value |= uint64_t(b & 0x7F) << shift;
      if (!(b & 0x80)) return value;
    }
    fail("tokenizer: {}: varint longer than 10 bytes at byte {}", what_, pos_);
  }

  float fixed32_float() {
    KILN_CHECK(pos_ + 4 <= data_.size(), "tokenizer: {}: truncated float at byte {}", what_, pos_);
    float f;
    std::memcpy(&f, data_.data() + pos_, 4);
    pos_ += 4;
    return f;
  }

  std::string_view bytes() {
    const uint64_t n = varint();
    KILN_CHECK(n <= data_.size() - pos_, "tokenizer: {}: field of {} bytes at byte {} runs past the end", what_, n,
               pos_);
    const std::string_view out = data_.substr(pos_, n);
    pos_ += n;
    return out;
  }

  void skip(WireType wire) {
    switch (wire) {
      case kVarint: varint(); break;
      case kFixed64: advance(8); break;
      case kLengthDelimited: bytes(); break;
      case kFixed32: advance(4); break;
      default: fail("tokenizer: {}: unsupported protobuf wire type {} at byte {}", what_, uint32_t(wire), pos_);
    }
  }

 private:
  void advance(size_t n) {
    KILN_CHECK(n <= data_.size() - pos_, "tokenizer: {}: truncated field at byte {}", what_, pos_);
    pos_ += n;
  }

  std::string_view data_;
  std::string_view what_;
  size_t pos_ = 0;
};

}  // namespace

VocabSpec read_sentencepiece_model(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) fail("tokenizer: cannot open {}", file.string());
  std::ostringstream buffer;
  buffer << in.rdbuf();
  const std::string data = buffer.str();
  const std::string what = file.string();

  VocabSpec spec;
  spec.kind = TokenizerKind::kSentencePiece;
  int64_t model_type = 1, unk = 0, bos = 1, eos = 2, pad = -1;  // proto defaults
  bool add_dummy_prefix = true;

  ProtoReader model(data, what);
  while (!model.done()) {
    WireType wire;
    const uint32_t field = model.next_field(wire);
    if (field == 1 && wire == kLengthDelimited) {
      ProtoReader piece(model.bytes(), what);
      std::string text;
      float score = 0.0f;
      int64_t type = 1;
      while (!piece.done()) {
        WireType w;
        const uint32_t f = piece.next_field(w);
        if (f == 1 && w == kLengthDelimited) text = std::string(piece.bytes());
        else if (f == 2 && w == kFixed32) score = piece.fixed32_float();
        else if (f == 3 && w == kVarint) type = int64_t(piece.varint());
        else piece.skip(w);
      }
      spec.tokens.push_back(std::move(text));
      spec.scores.push_back(score);
      spec.types.push_back(type >= 1 && type <= 6 ? TokenType(type) : TokenType::kUndefined);
    } else if (field == 2 && wire == kLengthDelimited) {
      ProtoReader trainer(model.bytes(), what);
      while (!trainer.done()) {
        WireType w;
        const uint32_t f = trainer.next_field(w);
        if (w != kVarint) {
          trainer.skip(w);
          continue;
        }
        // Ids are int32: negative values arrive as 64-bit two's complement varints.
        const int64_t v = int64_t(int32_t(trainer.varint()));
        if (f == 3) model_type = v;
        else if (f == 40) unk = v;
        else if (f == 41) bos = v;
        else if (f == 42) eos = v;
        else if (f == 43) pad = v;
      }
    } else if (field == 3 && wire == kLengthDelimited) {
      ProtoReader normalizer(model.bytes(), what);
      while (!normalizer.done()) {
        WireType w;
        const uint32_t f = normalizer.next_field(w);
        if (f == 3 && w == kVarint) add_dummy_prefix = normalizer.varint() != 0;
        else normalizer.skip(w);
      }
    } else {
      model.skip(wire);
    }
  }
  KILN_CHECK(!spec.tokens.empty(), "tokenizer: {} holds no SentencePiece pieces", what);
  KILN_CHECK(model_type == 2, "tokenizer: {}: SentencePiece model type {} is not supported (only BPE, 2)", what,
             model_type);
  const auto id = [&](int64_t v) { return (v >= 0 && size_t(v) < spec.tokens.size()) ? int32_t(v) : kNoToken; };
  spec.special.unk = id(unk);
  spec.special.bos = id(bos);
  spec.special.eos = id(eos);
  spec.special.pad = id(pad);
  spec.add_space_prefix = add_dummy_prefix;
  spec.add_bos = spec.special.bos != kNoToken;
  return spec;
}

}  // namespace kiln
