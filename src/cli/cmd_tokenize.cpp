// `kiln tokenize -m MODEL [--no-bos] [--parse-special] [--pieces] (-f FILE | TEXT)`:
// prints the token ids of a text, or one "id piece" line per token with --pieces.
// MODEL: a GGUF file, a Hugging Face tokenizer file (tokenizer.json, tokenizer.model,
// vocab.json + merges.txt), or a directory holding one.
#include <fmt/core.h>

#include <fstream>
#include <memory>
#include <sstream>

#include "cli/commands.h"
#include "core/error.h"
#include "tokenizer/hf_files.h"
#include "tokenizer/tokenizer.h"

namespace kiln::cli {
namespace {

struct TokenizeCli {
  std::string model, text, text_file;
  bool no_bos = false;
  bool parse_special = false;
  bool pieces = false;
};

// A piece as a readable, unambiguous string: printable ASCII and whole UTF-8 characters
// as is, the rest escaped.
std::string escape_piece(const std::string& piece) {
  std::string out;
  for (size_t i = 0; i < piece.size(); ++i) {
    const unsigned char c = piece[i];
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '\r') out += "\\r";
    else if (c < 0x20 || c == 0x7F) out += fmt::format("\\x{:02x}", c);
    else if (c < 0x80) out.push_back(char(c));
    else {
      // Copy a whole multi-byte character if it is complete, else escape the byte.
      const size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
      bool whole = len > 1 && i + len <= piece.size();
      for (size_t k = 1; whole && k < len; ++k) whole = (uint8_t(piece[i + k]) & 0xC0) == 0x80;
      if (whole) {
        out.append(piece, i, len);
        i += len - 1;
      } else {
        out += fmt::format("\\x{:02x}", c);
      }
    }
  }
  return out;
}

void run(const TokenizeCli& cli) {
  const Tokenizer tokenizer = load_tokenizer(cli.model);  // GGUF, HF file or HF directory
  std::string text = cli.text;
  if (!cli.text_file.empty()) {
    std::ifstream in(cli.text_file, std::ios::binary);
    if (!in) fail("cannot open text file {}", cli.text_file);
    std::ostringstream s;
    s << in.rdbuf();
    text = s.str();
  }
  const std::vector<int32_t> ids = tokenizer.encode(text, !cli.no_bos, cli.parse_special);
  if (cli.pieces) {
    for (int32_t id : ids) fmt::print("{} {}\n", id, escape_piece(tokenizer.piece(id)));
    return;
  }
  std::string line;
  for (int32_t id : ids) line += (line.empty() ? "" : " ") + std::to_string(id);
  fmt::print("{}\n", line);
}

}  // namespace

void register_tokenize(CLI::App& app) {
  auto cli = std::make_shared<TokenizeCli>();
  auto* cmd = app.add_subcommand("tokenize", "Print the token ids of a text");
  cmd->add_option("-m,--model", cli->model, "GGUF file, or Hugging Face tokenizer.json / tokenizer.model / vocab.json / model directory")->required();
  auto* file = cmd->add_option("-f,--file", cli->text_file, "Read the text from this file");
  auto* text = cmd->add_option("text", cli->text, "The text to tokenize");
  file->excludes(text);
  cmd->add_flag("--no-bos", cli->no_bos, "Do not add BOS/EOS (or CLS/SEP) as the model would");
  cmd->add_flag("--parse-special", cli->parse_special, "Text like <|eot_id|> becomes that control token");
  cmd->add_flag("--pieces", cli->pieces, "Print one 'id piece' line per token");
  cmd->callback([cli] { run(*cli); });
}

}  // namespace kiln::cli
