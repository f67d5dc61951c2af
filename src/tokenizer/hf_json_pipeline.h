#pragma once
// The text handling sections of a Hugging Face tokenizer.json -- normalizer,
// pre_tokenizer, decoder, post_processor -- translated into VocabSpec settings.
// Internal to hf_tokenizer_json.cpp.
#include <nlohmann/json.hpp>

#include <string>

#include "tokenizer/vocab.h"

namespace kiln::hf_json {

// The error-message context: the file being read.
struct Context {
  std::string file;
};

// Appends the normalizer's steps to spec.normalizer. Unicode NFC is accepted and not
// applied (kiln has no composition tables; text that is already NFC, as nearly all text
// is, comes out the same). NFKC, NFKD and Precompiled charsmaps are refused.
void read_normalizer(const nlohmann::json& normalizer, VocabSpec& spec, const Context& ctx);

// Fills spec.split_rules (and, for Metaspace / ByteLevel prefixes, spec.normalizer).
// Returns whether a ByteLevel pre-tokenizer is among them.
bool read_pre_tokenizer(const nlohmann::json& pre_tokenizer, VocabSpec& spec, const Context& ctx);

// What the decoder says, checked against the model kind.
struct DecoderFacts {
  bool byte_level = false;         // ByteLevel: tokens are in the GPT-2 byte alphabet
  bool strips_first_space = false; // Strip(" ", 1, 0) or Metaspace with a prefix
  bool wordpiece_cleanup = false;  // WordPiece decoder's cleanup
};
DecoderFacts read_decoder(const nlohmann::json& decoder, const Context& ctx);

// The tokens a TemplateProcessing / BertProcessing / RobertaProcessing post-processor puts
// around a single sequence (empty strings: none).
struct Wrapping {
  std::string before;
  std::string after;
};
Wrapping read_post_processor(const nlohmann::json& post_processor, const Context& ctx);

// A literal string as a PCRE2 pattern.
std::string regex_quote(std::string_view literal);

}  // namespace kiln::hf_json
