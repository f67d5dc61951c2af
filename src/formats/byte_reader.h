#pragma once
// A bounds-checked little-endian reader over a byte span, for parsing untrusted files.
// Every read checks the remaining length first; errors name the file and the offset.
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

#include "core/error.h"

namespace kiln {

class ByteReader {
 public:
  ByteReader(std::span<const uint8_t> bytes, std::string source)
      : bytes_(bytes), source_(std::move(source)) {}

  size_t offset() const { return pos_; }
  size_t remaining() const { return bytes_.size() - pos_; }
  size_t size() const { return bytes_.size(); }
  const std::string& source() const { return source_; }

  template <typename T>
  T read(std::string_view what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  // `n` raw bytes as a view into the underlying span.
  std::string_view read_bytes(uint64_t n, std::string_view what) {
    need(n, what);
    std::string_view s(reinterpret_cast<const char*>(bytes_.data() + pos_), size_t(n));
    pos_ += size_t(n);
    return s;
  }

  void skip(uint64_t n, std::string_view what) {
    need(n, what);
    pos_ += size_t(n);
  }

  void seek(size_t pos) {
    if (pos > bytes_.size()) error("seek to {} past the end ({} bytes)", pos, bytes_.size());
    pos_ = pos;
  }

  template <typename... Args>
  [[noreturn]] void error(fmt::format_string<Args...> format, Args&&... args) const {
    fail("{}: at offset {}: {}", source_, pos_, fmt::format(format, std::forward<Args>(args)...));
  }

 private:
  void need(uint64_t n, std::string_view what) const {
    if (n > remaining())
      error("file truncated: {} needs {} bytes, only {} left", what, n, remaining());
  }

  std::span<const uint8_t> bytes_;
  std::string source_;
  size_t pos_ = 0;
};

}  // namespace kiln
