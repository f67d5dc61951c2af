#pragma once
// A non-owning view of a tensor on some device: element type, up to four dimensions,
// byte strides and a data pointer. Weights are views into the mapped model file (CPU) or
// into one uploaded copy (GPU); intermediates are views into buffers a Backend allocated.
//
// Dimensions follow ggml: ne[0] is the innermost (contiguous) one. An activation of
// T tokens by D features is ne = {D, T}. For a quantized type nb[0] is the size of one
// block and nb[1] the size of a row, exactly as the blocks lie in the file.
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

#include "core/error.h"
#include "quant/types.h"

namespace kiln {

enum class Device : uint8_t { Cpu, Cuda };

inline std::string_view device_name(Device d) { return d == Device::Cpu ? "cpu" : "cuda"; }

struct Tensor {
  static constexpr int kMaxDims = 4;

  GgmlType dtype = GgmlType::F32;
  int n_dims = 0;
  int64_t ne[kMaxDims] = {1, 1, 1, 1};  // elements along each dimension, innermost first
  size_t nb[kMaxDims] = {0, 0, 0, 0};   // bytes between neighbours along each dimension
  void* data = nullptr;
  Device device = Device::Cpu;
  // For messages and the debug hook. Must point at storage that outlives the view (a
  // string literal, a GGUF tensor name, a key of a buffer pool).
  std::string_view name;

  // A densely packed tensor of `shape` (innermost first) at `data`.
  static Tensor contiguous(GgmlType dtype, std::initializer_list<int64_t> shape, void* data,
                           Device device = Device::Cpu, std::string_view name = {});

  bool empty() const { return data == nullptr; }
  int64_t elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
  int64_t rows() const { return ne[1] * ne[2] * ne[3]; }  // rows of ne[0] elements
  size_t row_bytes() const { return nb[1]; }
  // Bytes spanned by a densely packed tensor of this shape.
  size_t bytes() const { return nb[kMaxDims - 1] * size_t(ne[kMaxDims - 1]); }
  // Whether rows follow each other with no gaps (dims 1..3 can be flattened).
  bool is_contiguous() const;

  template <typename T>
  T* as() const { return static_cast<T*>(data); }
  uint8_t* row_ptr(int64_t i1, int64_t i2 = 0, int64_t i3 = 0) const {
    return static_cast<uint8_t*>(data) + size_t(i1) * nb[1] + size_t(i2) * nb[2] + size_t(i3) * nb[3];
  }
  float* f32_row(int64_t i1) const { return reinterpret_cast<float*>(row_ptr(i1)); }

  // The same (contiguous) data seen with another shape of as many elements.
  Tensor reshape(std::initializer_list<int64_t> shape) const;
  // Rows [begin, begin + count) along dimension 1 (dimensions 2, 3 must be 1).
  Tensor rows_view(int64_t begin, int64_t count) const;
  // The 2-D matrix at index i along dimension 2 (e.g. one expert of a stacked tensor).
  Tensor matrix(int64_t i2) const;
  // "f32 [128, 24]" for messages.
  std::string describe() const;
};

// Heads {head_dim, heads, tokens} seen as rows {heads * head_dim, tokens}, one row a token, the
// tokens as strided as they were (q/k/v as column ranges of one buffer). Each token's heads
// must lie one after the other: heads_packed says whether they do.
bool heads_packed(const Tensor& heads);
Tensor heads_as_rows(const Tensor& heads);

}  // namespace kiln
