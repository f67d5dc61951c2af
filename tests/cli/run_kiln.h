#pragma once
// Runs the kiln binary (path in $KILN_BINARY, set by ctest) and captures what it prints.
#include <gtest/gtest.h>

#include <string>

namespace kiln::testing {

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// The kiln binary, or "" when $KILN_BINARY is not set (tests then skip).
std::string kiln_binary();

// Runs `kiln <args>` through the shell; `args` must already be quoted where needed.
CommandResult run_kiln(const std::string& args);

// Quotes a path for the shell.
std::string shell_quote(const std::string& s);

}  // namespace kiln::testing

#define KILN_REQUIRE_BINARY()                                                            \
  if (::kiln::testing::kiln_binary().empty()) GTEST_SKIP() << "KILN_BINARY not set (run through ctest)"
