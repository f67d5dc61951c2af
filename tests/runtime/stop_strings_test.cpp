// Stop strings: held back while they may still match, never shown.
#include <gtest/gtest.h>

#include "runtime/stop_strings.h"

namespace kiln {
namespace {

TEST(StopStrings, HoldsBackAPossibleStartThenStops) {
  StopStringMatcher m({"\nUser:"});
  EXPECT_EQ(m.push("Hello\nUs"), "Hello");
  EXPECT_FALSE(m.stopped());
  EXPECT_EQ(m.push("er: hi"), "");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.matched(), "\nUser:");
  EXPECT_EQ(m.push("more"), "");
  EXPECT_EQ(m.flush(), "");
}

TEST(StopStrings, ReleasesTextThatStopsMatching) {
  StopStringMatcher m({"\nUser:"});
  EXPECT_EQ(m.push("Hello\nUs"), "Hello");
  EXPECT_EQ(m.push("a is"), "\nUsa is");
  EXPECT_FALSE(m.stopped());
}

TEST(StopStrings, FlushReleasesTheHeldTail) {
  StopStringMatcher m({"</s>"});
  EXPECT_EQ(m.push("abc</"), "abc");
  EXPECT_EQ(m.flush(), "</");
}

TEST(StopStrings, TextBeforeTheStopInTheSamePieceIsShown) {
  StopStringMatcher m({"END"});
  EXPECT_EQ(m.push("one END two"), "one ");
  EXPECT_TRUE(m.stopped());
}

TEST(StopStrings, EarliestOfSeveralWins) {
  StopStringMatcher m({"cd", "bc"});
  EXPECT_EQ(m.push("abcd"), "a");
  EXPECT_EQ(m.matched(), "bc");
}

TEST(StopStrings, CharacterByCharacterEqualsWhole) {
  const std::string text = "The end is near. ### Next: the end.";
  for (const std::string stop : {"###", "near. #", "xyz", "end."}) {
    StopStringMatcher whole({stop}), pieces({stop});
    std::string a = whole.push(text) + whole.flush();
    std::string b;
    for (char c : text) b += pieces.push(std::string(1, c));
    b += pieces.flush();
    EXPECT_EQ(a, b) << "stop string '" << stop << "'";
    const size_t at = text.find(stop);
    EXPECT_EQ(a, at == std::string::npos ? text : text.substr(0, at)) << "stop string '" << stop << "'";
  }
}

TEST(StopStrings, NoStopsPassEverything) {
  StopStringMatcher m;
  EXPECT_EQ(m.push("abc"), "abc");
  EXPECT_EQ(m.flush(), "");
}

TEST(StopStrings, MultiByteCharactersAreNotSplit) {
  StopStringMatcher m({"\xC3\xA9t\xC3\xA9"});  // "été"
  EXPECT_EQ(m.push("caf\xC3\xA9"), "caf");  // "é" may begin the stop string
  EXPECT_EQ(m.push("!"), "\xC3\xA9!");
}

}  // namespace
}  // namespace kiln
