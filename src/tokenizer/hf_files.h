#pragma once
// Tokenizers from the files Hugging Face model repositories ship:
//   vocab.json + merges.txt (+ added_tokens.json, tokenizer_config.json): GPT-2, Qwen2
//   tokenizer.model as tiktoken ranks (base64 token, space, rank per line): Llama 3
//   tokenizer.model as a SentencePiece ModelProto (protobuf): Llama 2, Mistral
//   tokenizer.json (Hugging Face tokenizers): any of the above, SentencePiece unigram, BERT
// Each gives the same ids as llama.cpp's conversion of the same files to GGUF.
#include <filesystem>
#include <string>

#include "tokenizer/tokenizer.h"
#include "tokenizer/vocab.h"

namespace kiln {

// Byte-level BPE from vocab.json and merges.txt. `pre` names the pre-tokenizer (see
// pretokenizer.h); empty: "qwen2" when tokenizer_config.json says Qwen2Tokenizer, else
// "gpt-2". Added tokens come from added_tokens.json and tokenizer_config.json beside them.
VocabSpec read_bpe_vocab_files(const std::filesystem::path& vocab_json,
                               const std::filesystem::path& merges_txt, std::string pre = {});

// Llama 3's tiktoken ranks; the 256 special tokens from id 128000 are added with Llama 3.1's
// names. Merges follow from the ranks (a pair merges at the rank of its concatenation).
VocabSpec read_tiktoken_model(const std::filesystem::path& file);

// A SentencePiece model (BPE type): pieces, scores, types and the special ids.
VocabSpec read_sentencepiece_model(const std::filesystem::path& file);

// A Hugging Face tokenizer.json (BPE, Unigram or WordPiece model, with its normalizer,
// pre-tokenizer, decoder, added tokens and post-processor), with the special-token
// settings of tokenizer_config.json beside it (hf_tokenizer_json.cpp).
VocabSpec read_tokenizer_json(const std::filesystem::path& file);

// Whether a tokenizer.model file holds tiktoken ranks (text) rather than a protobuf.
bool is_tiktoken_file(const std::filesystem::path& file);

// Any tokenizer kiln reads: a GGUF file, one of the files above, or a model directory
// holding them (tokenizer.json first, then tokenizer.model, then vocab.json + merges.txt).
Tokenizer load_tokenizer(const std::filesystem::path& path);

}  // namespace kiln
