#include "cli/run_kiln.h"

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>

namespace kiln::testing {

std::string kiln_binary() {
  const char* b = std::getenv("KILN_BINARY");
  return b ? b : "";
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

CommandResult run_kiln(const std::string& args) {
  CommandResult r;
  const std::string cmd = shell_quote(kiln_binary()) + " " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace kiln::testing
