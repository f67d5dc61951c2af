#pragma once
// Reading the CUDA backend's measuring switches (the KILN_CUDA_* environment variables that
// docs/cuda-switches.md lists): each is read once, by its one user, which keeps the value in
// a function-local static. Only these two shapes exist, so that every switch parses alike.
#include <cstdlib>
#include <string_view>

namespace kiln::cuda {

// Whether the variable is set to exactly `value` (e.g. "0" for a switch that turns a
// default path off).
inline bool env_is(const char* name, std::string_view value) {
  const char* v = std::getenv(name);
  return v && value == v;
}

// The variable as a whole number in 0 .. 2^20; `fallback` when it is unset, empty, negative,
// too large or not a number.
inline int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  return *end == '\0' && n >= 0 && n <= (1 << 20) ? int(n) : fallback;
}

}  // namespace kiln::cuda
