// `kiln tensor FILE NAME -o OUT.f32`: one tensor dequantized to raw little-endian float32,
// row after row (ne[0] innermost), for comparing against other tools.
#include <fmt/core.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"
#include "formats/gguf.h"
#include "quant/quant.h"

namespace kiln::cli {
namespace {

void write_tensor(const std::string& path, const std::string& name, const std::string& out_path) {
  auto f = gguf::File::open(path);
  const gguf::TensorInfo* t = f->find_tensor(name);
  if (!t) fail("{}: no tensor named '{}' (kiln info lists them)", path, name);
  const int64_t cols = t->shape.empty() ? 1 : t->shape[0];
  const int64_t rows = t->rows();
  const size_t row_size = *row_bytes(t->type, cols);

  std::unique_ptr<FILE, int (*)(FILE*)> out(std::fopen(out_path.c_str(), "wb"), &std::fclose);
  if (!out) fail("{}: cannot create: {}", out_path, std::strerror(errno));
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    dequantize_row(t->type, t->data + size_t(r) * row_size, row.data(), cols);
    if (std::fwrite(row.data(), sizeof(float), row.size(), out.get()) != row.size())
      fail("{}: write failed: {}", out_path, std::strerror(errno));
  }
  if (std::fflush(out.get()) != 0) fail("{}: write failed: {}", out_path, std::strerror(errno));
  fmt::print(stderr, "{}: {} {} values ({} rows x {}) -> {}\n", name, type_name(t->type), rows * cols, rows, cols,
             out_path);
}

}  // namespace

void register_tensor(CLI::App& app) {
  auto* cmd = app.add_subcommand("tensor", "Dequantize one tensor of a GGUF file to raw float32");
  auto file = std::make_shared<std::string>();
  auto name = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  cmd->add_option("file", *file, "GGUF file")->required();
  cmd->add_option("name", *name, "Tensor name, e.g. blk.0.attn_q.weight")->required();
  cmd->add_option("-o,--output", *out, "Output file of little-endian float32 values")->required();
  cmd->callback([file, name, out] { write_tensor(*file, *name, *out); });
}

}  // namespace kiln::cli
