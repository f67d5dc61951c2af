#pragma once
// A progress bar on stderr for long work (quantizing, loading). On a terminal it redraws
// one line; otherwise it prints a line at every tenth of the way, so logs stay readable.
#include <chrono>
#include <cstdint>
#include <string>

namespace kiln::cli {

class ProgressBar {
 public:
  explicit ProgressBar(std::string label);
  // Reports `done` of `total` units; `detail` (e.g. a tensor name) is shown beside the bar.
  void update(uint64_t done, uint64_t total, const std::string& detail = {});
  // Ends the line (call once when the work is over).
  void finish();

 private:
  std::string label_;
  bool tty_;
  int last_tenth_ = -1;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace kiln::cli
