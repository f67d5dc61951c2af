#pragma once
// Watches streamed text for stop strings. Text that could still be the beginning of a stop
// string is held back until the next piece decides it; a stop string itself, and anything
// after it, is never released.
//
//   StopStringMatcher m({"\nUser:"});
//   out += m.push("Hello\nUs");   // "Hello"  ("\nUs" might start "\nUser:")
//   out += m.push("er: hi");      // ""       (stopped: m.stopped() is true)
//   out += m.flush();             // ""       (at the end of a stream that did not stop,
//                                 //           flush() releases what was held back)
#include <string>
#include <string_view>
#include <vector>

namespace kiln {

class StopStringMatcher {
 public:
  explicit StopStringMatcher(std::vector<std::string> stops = {});

  // Adds text; returns the part that is now safe to show.
  std::string push(std::string_view text);
  // The held-back text (call when the stream ends for another reason).
  std::string flush();
  bool stopped() const { return stopped_; }
  // The stop string that matched, or "".
  const std::string& matched() const { return matched_; }
  void reset();

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
  std::string matched_;
};

}  // namespace kiln
