#include "tokenizer/tokenizer.h"

#include <algorithm>

#include "core/error.h"
#include "tokenizer/byte_alphabet.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/tokenizer_model.h"
#include "tokenizer/unicode.h"

namespace kiln {

namespace {

constexpr std::string_view kSpaceMark = "\xE2\x96\x81";  // U+2581, SentencePiece's space

// Replaces every ' ' with U+2581.
void append_escaped_spaces(std::string& out, std::string_view text) {
  for (char c : text) {
    if (c == ' ') {
      out += kSpaceMark;
    } else {
      out.push_back(c);
    }
  }
}

std::string unescape_spaces(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    if (text.substr(pos, kSpaceMark.size()) == kSpaceMark) {
      out.push_back(' ');
      pos += kSpaceMark.size();
    } else {
      out.push_back(text[pos++]);
    }
  }
  return out;
}

// The value of a byte token "<0xNN>", or -1.
int parse_byte_token(std::string_view text) {
  if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>') return -1;
  int value = 0;
  for (char c : text.substr(3, 2)) {
    value *= 16;
    if (c >= '0' && c <= '9') value += c - '0';
    else if (c >= 'A' && c <= 'F') value += c - 'A' + 10;
    else if (c >= 'a' && c <= 'f') value += c - 'a' + 10;
    else return -1;
  }
  return value;
}

// C isspace: what llama.cpp strips next to lstrip/rstrip special tokens.
bool is_ascii_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

}  // namespace

Tokenizer::Tokenizer(VocabSpec source) : vocab_(std::make_unique<Vocabulary>()) {
  vocab_->spec = std::move(source);
  VocabSpec& spec = vocab_->spec;
  TokenIndex& index = vocab_->index;
  const size_t n = spec.tokens.size();
  KILN_CHECK(n > 0, "tokenizer: the vocabulary is empty");
  KILN_CHECK(n < size_t(INT32_MAX), "tokenizer: vocabulary of {} tokens is too large", n);
  KILN_CHECK(spec.scores.empty() || spec.scores.size() == n,
             "tokenizer: {} scores for {} tokens", spec.scores.size(), n);
  if (spec.types.empty()) spec.types.assign(n, TokenType::kNormal);
  KILN_CHECK(spec.types.size() == n, "tokenizer: {} token types for {} tokens", spec.types.size(), n);
  index.reserve(n);
  for (size_t id = 0; id < n; ++id) {
    // The first of duplicate texts wins, as in Hugging Face's vocab maps.
    index.emplace(spec.tokens[id], int32_t(id));
  }
  auto valid = [&](int32_t& id) {
    if (id < 0 || size_t(id) >= n) id = kNoToken;
  };
  SpecialIds& s = spec.special;
  for (int32_t* id : {&s.bos, &s.eos, &s.eot, &s.eom, &s.unk, &s.pad, &s.sep, &s.cls, &s.mask}) valid(*id);
  KILN_CHECK(!spec.add_bos || s.bos != kNoToken, "tokenizer: add_bos is set but there is no BOS token");
  KILN_CHECK(!spec.add_eos || s.eos != kNoToken, "tokenizer: add_eos is set but there is no EOS token");

  build_pieces();
  build_special_tokens();
  build_end_of_generation();
  switch (spec.kind) {
    case TokenizerKind::kSentencePiece: model_ = make_sentencepiece_model(spec, index); break;
    case TokenizerKind::kBytePairBpe: model_ = make_byte_level_bpe_model(spec, index); break;
    case TokenizerKind::kWordPiece: model_ = make_wordpiece_model(spec, index); break;
    case TokenizerKind::kUnigram: model_ = make_unigram_model(spec, index); break;
  }
  if (spec.hf_pipeline || !spec.normalizer.empty()) normalizer_ = std::make_unique<TextNormalizer>(spec.normalizer);
}

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

void Tokenizer::build_pieces() {
  pieces_.resize(vocab_->spec.tokens.size());
  for (size_t id = 0; id < vocab_->spec.tokens.size(); ++id) {
    const std::string& text = vocab_->spec.tokens[id];
    std::string& piece = pieces_[id];
    switch (vocab_->spec.types[id]) {
      case TokenType::kByte: {
        const int value = parse_byte_token(text);
        piece = value >= 0 ? std::string(1, char(value)) : text;
        break;
      }
      case TokenType::kNormal:
        if (vocab_->spec.kind == TokenizerKind::kBytePairBpe) {
          byte_alphabet::decode(text, piece);
        } else {
          piece = unescape_spaces(text);
        }
        break;
      default:  // control, user-defined, unknown, unused: the text as written
        piece = text;
        break;
    }
  }
}

void Tokenizer::build_special_tokens() {
  // llama.cpp's phi-3 quirk: its special tokens eat the whitespace after them.
  std::string name = vocab_->spec.model_name;
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  const bool phi3 = name.find("phi-3") != std::string::npos || name.find("phi3") != std::string::npos;
  for (size_t id = 0; id < vocab_->spec.tokens.size(); ++id) {
    const TokenType t = vocab_->spec.types[id];
    const std::string& text = vocab_->spec.tokens[id];
    const bool special = t == TokenType::kControl || t == TokenType::kUserDefined || t == TokenType::kUnknown;
    if (!special || text.empty()) continue;
    bool rstrip = phi3;
    if (phi3 && (text == "<unk>" || text == "<s>" || text == "<|endoftext|>")) rstrip = false;
    const auto listed = [&](const std::vector<int32_t>& ids) {
      return std::find(ids.begin(), ids.end(), int32_t(id)) != ids.end();
    };
    rstrip = rstrip || listed(vocab_->spec.rstrip_ids);
    special_tokens_.push_back({int32_t(id), listed(vocab_->spec.lstrip_ids), rstrip});
  }
  std::stable_sort(special_tokens_.begin(), special_tokens_.end(), [&](const SpecialToken& a, const SpecialToken& b) {
    return vocab_->spec.tokens[a.id].size() > vocab_->spec.tokens[b.id].size();
  });
}

void Tokenizer::build_end_of_generation() {
  static constexpr std::string_view kEndTexts[] = {
      "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>",
      "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>", "<|return|>", "<|call|>",
  };
  const SpecialIds& s = vocab_->spec.special;
  for (int32_t id : {s.eos, s.eot, s.eom}) {
    if (id != kNoToken) eog_ids_.push_back(id);
  }
  for (std::string_view text : kEndTexts) {
    const int32_t id = find_token(text);
    if (id != kNoToken) eog_ids_.push_back(id);
  }
  std::sort(eog_ids_.begin(), eog_ids_.end());
  eog_ids_.erase(std::unique(eog_ids_.begin(), eog_ids_.end()), eog_ids_.end());
}

void Tokenizer::check_id(int32_t id) const {
  KILN_CHECK(id >= 0 && size_t(id) < vocab_->spec.tokens.size(), "tokenizer: token id {} is outside the vocabulary of {}",
             id, vocab_->spec.tokens.size());
}

const std::string& Tokenizer::piece(int32_t id) const {
  check_id(id);
  return pieces_[id];
}

const std::string& Tokenizer::token_text(int32_t id) const {
  check_id(id);
  return vocab_->spec.tokens[id];
}

TokenType Tokenizer::token_type(int32_t id) const {
  check_id(id);
  return vocab_->spec.types[id];
}

int32_t Tokenizer::find_token(std::string_view text) const {
  const auto it = vocab_->index.find(text);
  return it == vocab_->index.end() ? kNoToken : it->second;
}

bool Tokenizer::is_end_of_generation(int32_t id) const {
  return std::binary_search(eog_ids_.begin(), eog_ids_.end(), id);
}

std::vector<Tokenizer::Fragment> Tokenizer::split_special(std::string_view text, bool parse_special) const {
  std::vector<Fragment> fragments;
  if (!text.empty()) fragments.push_back({text, kNoToken});
  std::vector<Fragment> next;
  for (const SpecialToken& special : special_tokens_) {
    // Control (and unknown) tokens are matched only on request; user-defined ones always,
    // as Hugging Face does with added tokens that are not special.
    if (!parse_special && vocab_->spec.types[special.id] != TokenType::kUserDefined) continue;
    const std::string& needle = vocab_->spec.tokens[special.id];
    next.clear();
    bool changed = false;
    for (const Fragment& f : fragments) {
      if (f.id != kNoToken) {
        next.push_back(f);
        continue;
      }
      std::string_view rest = f.text;
      for (size_t at; (at = rest.find(needle)) != std::string_view::npos;) {
        changed = true;
        std::string_view left = rest.substr(0, at);
        if (special.lstrip) {
          while (!left.empty() && is_ascii_space(left.back())) left.remove_suffix(1);
        }
        if (!left.empty()) next.push_back({left, kNoToken});
        next.push_back({{}, special.id});
        rest.remove_prefix(at + needle.size());
        if (special.rstrip) {
          while (!rest.empty() && is_ascii_space(rest.front())) rest.remove_prefix(1);
        }
      }
      if (!rest.empty()) next.push_back({rest, kNoToken});
    }
    if (changed) fragments.swap(next);
  }
  return fragments;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special, bool parse_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  const SpecialIds& s = vocab_->spec.special;
  const bool word_piece = vocab_->spec.kind == TokenizerKind::kWordPiece;
  if (add_special) {
    if (word_piece) {
      const int32_t cls = s.cls != kNoToken ? s.cls : s.bos;
      KILN_CHECK(cls != kNoToken, "tokenizer: no [CLS] token to add");
      out.push_back(cls);
    } else if (vocab_->spec.add_bos) {
      out.push_back(s.bos);
    }
  }
  std::string escaped;
  bool previous_was_special = true;  // SentencePiece: a space prefix before the first text
  for (const Fragment& f : split_special(text, parse_special)) {
    if (f.id != kNoToken) {
      out.push_back(f.id);
      previous_was_special = true;
      continue;
    }
    if (normalizer_) {
      // tokenizer.json: its normalizer does the space escaping and prefix, if any.
      model_->encode(normalizer_->normalize(f.text, f.text.data() == text.data()), out);
    } else if (uses_space_mark(vocab_->spec.kind)) {
      escaped.clear();
      if (vocab_->spec.add_space_prefix && previous_was_special) escaped += kSpaceMark;
      append_escaped_spaces(escaped, f.text);
      model_->encode(escaped, out);
    } else {
      model_->encode(f.text, out);
    }
    previous_was_special = false;
  }
  if (add_special) {
    if (word_piece) {
      KILN_CHECK(s.sep != kNoToken, "tokenizer: no [SEP] token to add");
      out.push_back(s.sep);
    } else if (vocab_->spec.add_eos) {
      out.push_back(s.eos);
    }
  }
  return out;
}

bool Tokenizer::renders(int32_t id, bool render_special) const {
  switch (vocab_->spec.types[id]) {
    case TokenType::kNormal:
    case TokenType::kByte:
    case TokenType::kUserDefined:
      return true;
    case TokenType::kControl:
    case TokenType::kUnknown:
      return render_special;
    default:
      return false;  // unused and undefined tokens stand for no text
  }
}

std::string Tokenizer::decode(std::span<const int32_t> ids, const DecodeOptions& options) const {
  StreamingDecoder decoder(*this, options);
  std::string out;
  for (int32_t id : ids) out += decoder.push(id);
  out += decoder.flush();
  return options.clean_spaces ? clean_up_spaces(out) : out;
}

StreamingDecoder::StreamingDecoder(const Tokenizer& tokenizer, DecodeOptions options)
    : tokenizer_(tokenizer), options_(options) {}

std::string StreamingDecoder::push(int32_t id) {
  tokenizer_.check_id(id);
  if (!tokenizer_.renders(id, options_.render_special)) return {};
  std::string_view piece = tokenizer_.pieces_[id];
  if (piece.empty()) return {};
  // SentencePiece's decoder drops the space it added in front of the first word.
  if (at_start_ && uses_space_mark(tokenizer_.vocab_->spec.kind) &&
      tokenizer_.vocab_->spec.add_space_prefix && tokenizer_.vocab_->spec.types[id] == TokenType::kNormal &&
      piece.front() == ' ') {
    piece.remove_prefix(1);
  }
  at_start_ = false;
  pending_ += piece;
  const size_t complete = unicode::complete_prefix_length(pending_);
  std::string ready = pending_.substr(0, complete);
  pending_.erase(0, complete);
  return ready;
}

std::string StreamingDecoder::flush() {
  std::string rest;
  rest.swap(pending_);
  return rest;
}

void StreamingDecoder::reset() {
  pending_.clear();
  at_start_ = true;
}

std::string clean_up_spaces(std::string_view text) {
  static constexpr std::pair<std::string_view, std::string_view> kRules[] = {
      {" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"}, {" n't", "n't"},
      {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"},
  };
  std::string out(text);
  for (const auto& [from, to] : kRules) {
    std::string replaced;
    replaced.reserve(out.size());
    size_t pos = 0;
    for (size_t at; (at = out.find(from, pos)) != std::string::npos; pos = at + from.size()) {
      replaced.append(out, pos, at - pos).append(to);
    }
    replaced.append(out, pos, std::string::npos);
    out.swap(replaced);
  }
  return out;
}

}  // namespace kiln
