#include "support/testdata.h"

#include <cstdlib>

namespace kiln::testing {

std::filesystem::path testdata_root() {
  if (const char* env = std::getenv("KILN_TESTDATA"); env && *env) {
    if (std::filesystem::is_directory(env)) return env;
    return {};
  }
  const std::filesystem::path beside = std::filesystem::path(KILN_SOURCE_DIR) / ".." / "shared" / "testdata";
  if (std::filesystem::is_directory(beside)) return beside;
  return {};
}

std::filesystem::path testdata_path(const std::string& relative) {
  const std::filesystem::path root = testdata_root();
  if (root.empty()) return {};
  std::filesystem::path p = root / relative;
  if (!std::filesystem::exists(p)) return {};
  return p;
}

}  // namespace kiln::testing
