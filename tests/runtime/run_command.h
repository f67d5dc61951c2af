#pragma once
// Runs the kiln binary (path in $KILN_BINARY, set by ctest) and captures its stdout alone,
// so that tests can compare the generated text byte for byte.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace kiln::testing {

struct Captured {
  int exit_code = -1;
  std::string out;
};

inline std::string kiln_binary_path() {
  const char* b = std::getenv("KILN_BINARY");
  return b ? b : "";
}

inline std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// `kiln <args> 2>/dev/null`; `args` must already be quoted where needed.
inline Captured run_kiln_stdout(const std::string& args, const std::string& stdin_text = {}) {
  Captured r;
  std::string cmd = quote(kiln_binary_path()) + " " + args + " 2>/dev/null";
  if (!stdin_text.empty()) cmd = "printf '%s' " + quote(stdin_text) + " | " + cmd;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace kiln::testing

#define KILN_REQUIRE_KILN_BINARY()                    \
  if (::kiln::testing::kiln_binary_path().empty()) \
  GTEST_SKIP() << "KILN_BINARY not set (run through ctest)"
