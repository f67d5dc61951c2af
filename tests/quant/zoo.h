#pragma once
// The quantization zoo (../shared/testdata/quant/zoo, made by ggml): its index and files.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "quant/types.h"

namespace kiln {
// gtest prints a type parameter by its name.
inline void PrintTo(GgmlType t, std::ostream* os) { *os << type_name(t); }
}  // namespace kiln

namespace kiln::testing {

struct ZooEntry {
  std::string name;  // ggml type name, e.g. "q4_K"
  uint32_t id = 0;   // ggml type id
  int64_t rows = 0, cols = 0;
  bool uses_imatrix = false;
  double rmse = 0;   // ggml's round-trip RMSE on src.f32: the bar for kiln's quantizer
};

// gtest prints parameters with this (by name) instead of dumping their bytes.
inline void PrintTo(const ZooEntry& e, std::ostream* os) { *os << e.name; }

// Entries of zoo/index.tsv; empty when the reference data is absent.
std::vector<ZooEntry> zoo_index();

// The entry of the type named `name`, or nothing.
std::optional<ZooEntry> zoo_entry(const std::string& name);

// Every known type for which `keep` is true (for parameterized tests).
std::vector<GgmlType> types_where(bool (*keep)(GgmlType));

// Quantizes `src` (rows x cols) row by row into `type`, with the importance vector when
// given, and dequantizes the bytes back with the scalar reference into *back.
std::vector<uint8_t> quantize_round_trip(GgmlType type, const std::vector<float>& src, int64_t rows, int64_t cols,
                                         const float* importance, std::vector<float>* back);

std::vector<uint8_t> read_bytes(const std::filesystem::path& path);
std::vector<float> read_floats(const std::filesystem::path& path);

// For parameterized test names: "q4_K" -> "q4_K" (already valid), "(absent)" -> "absent".
std::string test_name_of(const std::string& type_name);

}  // namespace kiln::testing
