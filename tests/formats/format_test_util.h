#pragma once
// Helpers for the format tests: a scratch directory, hand-built GGUF bytes, and a check
// that a call throws kiln::Error whose message names what it should.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace kiln::testing {

// A fresh directory under the system temp dir, removed with everything in it at scope end.
class ScratchDir {
 public:
  ScratchDir() {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() / ("kiln-formats-" + std::to_string(rd()) + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline void write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  ASSERT_TRUE(out.good()) << "cannot write " << path;
}

inline void write_file(const std::string& path, std::string_view text) {
  write_file(path, std::vector<uint8_t>(text.begin(), text.end()));
}

// Runs `call`, requires it to throw kiln::Error, and requires the message to contain every
// one of `words`. Returns the message (empty when it did not throw).
inline std::string expect_error(const std::function<void()>& call, std::initializer_list<std::string_view> words) {
  try {
    call();
  } catch (const kiln::Error& e) {
    const std::string message = e.what();
    for (std::string_view w : words)
      EXPECT_NE(message.find(w), std::string::npos) << "error message lacks '" << w << "': " << message;
    return message;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a non-kiln exception: " << e.what();
    return {};
  }
  ADD_FAILURE() << "no error thrown (expected one mentioning '" << *words.begin() << "')";
  return {};
}

// Appends little-endian GGUF fields, for hand-built (and deliberately broken) files.
class GgufBytes {
 public:
  template <typename T>
  GgufBytes& pod(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    bytes.insert(bytes.end(), p, p + sizeof(T));
    return *this;
  }
  GgufBytes& u32(uint32_t v) { return pod(v); }
  GgufBytes& u64(uint64_t v) { return pod(v); }
  GgufBytes& str(std::string_view s) {
    u64(s.size());
    bytes.insert(bytes.end(), s.begin(), s.end());
    return *this;
  }
  // "GGUF", version, tensor count, metadata count.
  GgufBytes& header(uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    return u32(0x46554747).u32(version).u64(n_tensors).u64(n_kv);
  }
  GgufBytes& kv_u32(std::string_view key, uint32_t v) { return str(key).u32(4).u32(v); }
  GgufBytes& kv_str(std::string_view key, std::string_view v) { return str(key).u32(8).str(v); }
  // A tensor info: name, dims (innermost first), type id, data offset.
  GgufBytes& tensor(std::string_view name, std::vector<uint64_t> dims, uint32_t type, uint64_t offset) {
    str(name).u32(uint32_t(dims.size()));
    for (uint64_t d : dims) u64(d);
    return u32(type).u64(offset);
  }
  GgufBytes& pad_to(size_t alignment) {
    bytes.resize((bytes.size() + alignment - 1) / alignment * alignment, 0);
    return *this;
  }
  GgufBytes& zeros(size_t n) {
    bytes.resize(bytes.size() + n, 0);
    return *this;
  }

  std::vector<uint8_t> bytes;
};

// Deterministic pseudo-random bytes.
inline std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> out(n);
  for (auto& b : out) b = uint8_t(rng());
  return out;
}

}  // namespace kiln::testing
