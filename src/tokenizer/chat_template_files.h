#pragma once
// Finding the chat template a model ships with: in a GGUF file, the metadata key
// tokenizer.chat_template (BOS/EOS from its vocabulary); in a Hugging Face model directory,
// chat_template.jinja, else tokenizer_config.json's chat_template (BOS/EOS from that config).
#include <optional>
#include <string>

#include "tokenizer/chat_template.h"

namespace kiln {

class Tokenizer;

// The model's template, or nullopt when it ships none. `tokenizer`, when given, supplies
// BOS/EOS for a GGUF file instead of reading its vocabulary again. Throws kiln::Error for
// unreadable or malformed files.
std::optional<ChatTemplate> find_chat_template(const std::string& model_path, const Tokenizer* tokenizer = nullptr);

}  // namespace kiln
