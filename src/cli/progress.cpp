#include "cli/progress.h"

#include <fmt/core.h>
#include <unistd.h>

#include <cstdio>

namespace kiln::cli {

ProgressBar::ProgressBar(std::string label)
    : label_(std::move(label)), tty_(::isatty(STDERR_FILENO)), start_(std::chrono::steady_clock::now()) {}

void ProgressBar::update(uint64_t done, uint64_t total, const std::string& detail) {
  const double fraction = total ? double(done) / double(total) : 1.0;
  const auto now = std::chrono::steady_clock::now();
  const double seconds = std::chrono::duration<double>(now - start_).count();
  if (tty_) {
    // Redraw at most 20 times a second, and always at the end.
    if (done < total && now - last_draw_ < std::chrono::milliseconds(50)) return;
    last_draw_ = now;
    constexpr int kWidth = 30;
    const int filled = int(fraction * kWidth);
    std::string bar(size_t(filled), '=');
    if (filled < kWidth) bar += '>' + std::string(size_t(kWidth - filled - 1), ' ');
    std::string shown = detail.size() > 40 ? detail.substr(0, 37) + "..." : detail;
    fmt::print(stderr, "\r{} [{}] {:3.0f}% {:5.1f}s {:<40}", label_, bar, fraction * 100, seconds, shown);
    std::fflush(stderr);
  } else {
    const int tenth = int(fraction * 10);
    if (tenth == last_tenth_) return;
    last_tenth_ = tenth;
    fmt::print(stderr, "{}: {:3.0f}% ({:.1f}s)\n", label_, fraction * 100, seconds);
  }
}

void ProgressBar::finish() {
  if (tty_) fmt::print(stderr, "\n");
}

}  // namespace kiln::cli
