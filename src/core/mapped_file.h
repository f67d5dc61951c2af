#pragma once
// A read-only memory mapping of a whole file. Model weights are views into such mappings:
// loading a model touches only the pages its tensors use, and never copies them.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace kiln {

class MappedFile {
 public:
  // Maps `path` read-only; throws kiln::Error naming the file when it cannot.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace kiln
