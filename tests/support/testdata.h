#pragma once
// Locating the reference data (../shared/testdata, or $KILN_TESTDATA) from tests.
// Tests that need it call KILN_REQUIRE_TESTDATA(path) and are reported as skipped,
// never passed, when it is absent.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

namespace kiln::testing {

// The reference-data root, or an empty path when none is present.
std::filesystem::path testdata_root();

// root / relative, or empty when the root or that file is missing.
std::filesystem::path testdata_path(const std::string& relative);

}  // namespace kiln::testing

#define KILN_REQUIRE_TESTDATA(var, relative)                                          \
  const std::filesystem::path var = ::kiln::testing::testdata_path(relative);        \
  if (var.empty()) GTEST_SKIP() << "reference data absent: " << (relative)           \
                                << " (set KILN_TESTDATA or provide ../shared/testdata)"
