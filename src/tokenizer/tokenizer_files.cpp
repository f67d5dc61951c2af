// load_tokenizer: picks the reader for a GGUF file, a Hugging Face tokenizer file or a
// model directory.
#include <fstream>

#include "core/error.h"
#include "tokenizer/hf_files.h"

namespace kiln {

namespace {

namespace fs = std::filesystem;

bool has_gguf_magic(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  in.read(magic, 4);
  return in.gcount() == 4 && std::string_view(magic, 4) == "GGUF";
}

Tokenizer from_tokenizer_model(const fs::path& file) {
  return Tokenizer(is_tiktoken_file(file) ? read_tiktoken_model(file) : read_sentencepiece_model(file));
}

}  // namespace

Tokenizer load_tokenizer(const fs::path& path) {
  if (fs::is_directory(path)) {
    // tokenizer.json is the complete description (what transformers loads by default).
    if (fs::exists(path / "tokenizer.json")) return Tokenizer(read_tokenizer_json(path / "tokenizer.json"));
    if (fs::exists(path / "tokenizer.model")) return from_tokenizer_model(path / "tokenizer.model");
    if (fs::exists(path / "vocab.json") && fs::exists(path / "merges.txt")) {
      return Tokenizer(read_bpe_vocab_files(path / "vocab.json", path / "merges.txt"));
    }
    fail("tokenizer: {} holds no tokenizer.json, tokenizer.model nor vocab.json + merges.txt", path.string());
  }
  if (!fs::exists(path)) fail("tokenizer: {} does not exist", path.string());
  if (has_gguf_magic(path)) return Tokenizer::from_gguf(path.string());
  const std::string name = path.filename().string();
  if (name == "tokenizer.json" || name.ends_with(".tokenizer.json")) return Tokenizer(read_tokenizer_json(path));
  if (name == "vocab.json") return Tokenizer(read_bpe_vocab_files(path, path.parent_path() / "merges.txt"));
  if (name == "merges.txt") return Tokenizer(read_bpe_vocab_files(path.parent_path() / "vocab.json", path));
  if (path.extension() == ".model") return from_tokenizer_model(path);
  fail("tokenizer: {} is neither a GGUF file nor a tokenizer file kiln reads (tokenizer.model, vocab.json, "
       "merges.txt, tokenizer.json, or a directory holding them)", path.string());
}

}  // namespace kiln
