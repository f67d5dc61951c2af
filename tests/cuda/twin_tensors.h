#pragma once
// The same host data as a tensor on the CPU backend and on another backend (the GPU), for
// tests that run an op on both and compare.
#include <gtest/gtest.h>

#include <initializer_list>
#include <memory>
#include <vector>

#include "backend/backend.h"

namespace kiln::testing {

struct Twin {
  std::unique_ptr<Buffer> cpu_buf, gpu_buf;
  Tensor cpu, gpu;
};

// Allocates `shape` of `type` on both backends and uploads `data` to each.
template <typename T>
Twin make_twin(Backend& cpu, Backend& gpu, GgmlType type, std::initializer_list<int64_t> shape,
               const std::vector<T>& data) {
  Twin t;
  const size_t bytes = data.size() * sizeof(T);
  t.cpu_buf = cpu.allocate(bytes);
  t.gpu_buf = gpu.allocate(bytes);
  t.cpu = t.cpu_buf->view(type, shape);
  t.gpu = t.gpu_buf->view(type, shape);
  EXPECT_EQ(t.cpu.bytes(), bytes);
  cpu.upload(data.data(), t.cpu, bytes);
  gpu.upload(data.data(), t.gpu, bytes);
  return t;
}

}  // namespace kiln::testing
