// The parsing of the CUDA backend's measuring switches (env_switch.h), on the host: every
// KILN_CUDA_* variable goes through these two functions, so a switch set to "0", "2" or a
// number means the same everywhere. Variables of this test's own, set and cleared here.
#include <gtest/gtest.h>

#include <cstdlib>

#include "backend/cuda/env_switch.h"

namespace kiln::cuda {
namespace {

constexpr const char* kVar = "KILN_ENV_SWITCH_TEST";

struct ScopedVar {
  explicit ScopedVar(const char* value) { setenv(kVar, value, 1); }
  ~ScopedVar() { unsetenv(kVar); }
};

TEST(CudaEnvSwitch, IsMatchesTheWholeValueOnly) {
  unsetenv(kVar);
  EXPECT_FALSE(env_is(kVar, "0"));
  {
    ScopedVar v("0");
    EXPECT_TRUE(env_is(kVar, "0"));
    EXPECT_FALSE(env_is(kVar, "1"));
  }
  {
    ScopedVar v("00");
    EXPECT_FALSE(env_is(kVar, "0"));
  }
  {
    ScopedVar v("");
    EXPECT_FALSE(env_is(kVar, "0"));
    EXPECT_TRUE(env_is(kVar, ""));
  }
}

TEST(CudaEnvSwitch, IntTakesWholeNumbersInRangeElseTheFallback) {
  unsetenv(kVar);
  EXPECT_EQ(env_int(kVar, 7), 7);
  const struct {
    const char* value;
    int want;
  } cases[] = {{"0", 0}, {"12", 12}, {"1048576", 1 << 20}, {"1048577", 7}, {"-1", 7},
               {"", 7},  {"3x", 7},  {"x", 7},             {" 5", 5},       {"08", 8}};
  for (const auto& c : cases) {
    ScopedVar v(c.value);
    EXPECT_EQ(env_int(kVar, 7), c.want) << "value \"" << c.value << "\"";
  }
}

}  // namespace
}  // namespace kiln::cuda
