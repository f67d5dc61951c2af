#include "quant/zoo.h"

#include <cstring>
#include <fstream>
#include <sstream>

#include "quant/quant.h"
#include "support/testdata.h"

namespace kiln::testing {

std::vector<ZooEntry> zoo_index() {
  std::vector<ZooEntry> entries;
  const std::filesystem::path path = testdata_path("quant/zoo/index.tsv");
  if (path.empty()) return entries;
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);  // header: type id blck_size type_size rows cols bytes uses_imatrix rmse
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    std::istringstream fields(line);
    ZooEntry e;
    int64_t block, type_size, bytes;
    int imatrix;
    fields >> e.name >> e.id >> block >> type_size >> e.rows >> e.cols >> bytes >> imatrix >> e.rmse;
    e.uses_imatrix = imatrix != 0;
    entries.push_back(e);
  }
  return entries;
}

std::optional<ZooEntry> zoo_entry(const std::string& name) {
  for (const ZooEntry& e : zoo_index())
    if (e.name == name) return e;
  return std::nullopt;
}

std::vector<GgmlType> types_where(bool (*keep)(GgmlType)) {
  std::vector<GgmlType> out;
  size_t count;
  const TypeTraits* all = all_types(&count);
  for (size_t i = 0; i < count; ++i)
    if (keep(all[i].type)) out.push_back(all[i].type);
  return out;
}

std::vector<uint8_t> quantize_round_trip(GgmlType type, const std::vector<float>& src, int64_t rows, int64_t cols,
                                         const float* importance, std::vector<float>* back) {
  const size_t row_size = *row_bytes(type, cols);
  std::vector<uint8_t> bytes(row_size * size_t(rows));
  back->assign(size_t(rows * cols), 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    quantize_row(type, src.data() + r * cols, bytes.data() + r * row_size, cols, importance);
    dequantize_row_reference(type, bytes.data() + r * row_size, back->data() + r * cols, cols);
  }
  return bytes;
}

std::vector<uint8_t> read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

std::vector<float> read_floats(const std::filesystem::path& path) {
  const std::vector<uint8_t> bytes = read_bytes(path);
  std::vector<float> values(bytes.size() / sizeof(float));
  std::memcpy(values.data(), bytes.data(), values.size() * sizeof(float));
  return values;
}

std::string test_name_of(const std::string& type_name) {
  std::string out;
  for (char c : type_name)
    if (std::isalnum(static_cast<unsigned char>(c)) || c == '_') out += c;
  return out;
}

}  // namespace kiln::testing
