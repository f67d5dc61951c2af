#include "quant/zoo.h"

#include <cstring>
#include <fstream>
#include <sstream>

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
