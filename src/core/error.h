#pragma once
// kiln reports failures as exceptions of one type carrying a complete, human-readable
// message (what went wrong, in which file, at which offset or key). Front ends catch it,
// print the message and exit non-zero.
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace kiln {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace kiln

// Checks an invariant that input data could break; throws kiln::Error with the message.
#define KILN_CHECK(cond, ...)                  \
  do {                                         \
    if (!(cond)) ::kiln::fail(__VA_ARGS__);    \
  } while (0)
