#pragma once
// Human-readable numbers for command output.
#include <cstdint>
#include <string>

namespace kiln::cli {

std::string human_bytes(uint64_t bytes);   // "1.50 GiB"
std::string human_count(int64_t n);        // "1.24 B", "260.1 K"

}  // namespace kiln::cli
