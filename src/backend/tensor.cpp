#include "backend/tensor.h"

#include <fmt/format.h>

#include <algorithm>

namespace kiln {

Tensor Tensor::contiguous(GgmlType dtype, std::initializer_list<int64_t> shape, void* data, Device device,
                          std::string_view name) {
  KILN_CHECK(shape.size() >= 1 && shape.size() <= size_t(kMaxDims), "tensor {}: {} dimensions (1..4 allowed)",
             name, shape.size());
  Tensor t;
  t.dtype = dtype;
  t.n_dims = int(shape.size());
  int i = 0;
  for (int64_t n : shape) t.ne[i++] = n;
  const TypeTraits& tr = traits(dtype);
  KILN_CHECK(t.ne[0] % tr.block_size == 0, "tensor {}: row of {} elements is not a whole number of {} blocks",
             name, t.ne[0], tr.name);
  t.nb[0] = tr.type_size;
  t.nb[1] = tr.type_size * size_t(t.ne[0] / tr.block_size);
  for (int d = 2; d < kMaxDims; ++d) t.nb[d] = t.nb[d - 1] * size_t(t.ne[d - 1]);
  t.data = data;
  t.device = device;
  t.name = name;
  return t;
}

bool Tensor::is_contiguous() const {
  const TypeTraits& tr = traits(dtype);
  if (nb[0] != tr.type_size || nb[1] != tr.type_size * size_t(ne[0] / tr.block_size)) return false;
  for (int d = 2; d < kMaxDims; ++d)
    if (ne[d] > 1 && nb[d] != nb[d - 1] * size_t(ne[d - 1])) return false;
  return true;
}

Tensor Tensor::reshape(std::initializer_list<int64_t> shape) const {
  KILN_CHECK(is_contiguous(), "reshape of {} {}: not contiguous", name, describe());
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  KILN_CHECK(n == elements(), "reshape of {} {}: {} elements asked", name, describe(), n);
  return contiguous(dtype, shape, data, device, name);
}

Tensor Tensor::rows_view(int64_t begin, int64_t count) const {
  KILN_CHECK(ne[2] == 1 && ne[3] == 1, "rows_view of {} {}: not 2-D", name, describe());
  KILN_CHECK(begin >= 0 && count >= 0 && begin + count <= ne[1], "rows_view of {} {}: rows [{}, {}) out of range",
             name, describe(), begin, begin + count);
  Tensor t = *this;
  t.ne[1] = count;
  t.data = row_ptr(begin);
  for (int d = 2; d < kMaxDims; ++d) t.nb[d] = t.nb[1] * size_t(count);
  return t;
}

Tensor Tensor::matrix(int64_t i2) const {
  KILN_CHECK(i2 >= 0 && i2 < ne[2] && ne[3] == 1, "matrix {} of {} {}: out of range", i2, name, describe());
  Tensor t = *this;
  t.data = row_ptr(0, i2);
  t.n_dims = 2;
  t.ne[2] = 1;
  t.nb[2] = t.nb[1] * size_t(t.ne[1]);
  t.nb[3] = t.nb[2];
  return t;
}

bool heads_packed(const Tensor& heads) {
  return heads.ne[3] == 1 && heads.nb[1] == heads.nb[0] * size_t(heads.ne[0]);
}

Tensor heads_as_rows(const Tensor& heads) {
  KILN_CHECK(heads_packed(heads), "heads {} {}: a token's heads are not packed", heads.name, heads.describe());
  Tensor rows = heads;
  rows.n_dims = 2;
  rows.ne[0] = heads.ne[0] * heads.ne[1];
  rows.ne[1] = heads.ne[2];
  rows.ne[2] = 1;
  rows.nb[1] = heads.nb[2];
  rows.nb[2] = rows.nb[3] = heads.nb[2] * size_t(heads.ne[2]);
  return rows;
}

std::string Tensor::describe() const {
  std::string dims;
  for (int d = 0; d < std::max(n_dims, 1); ++d) dims += fmt::format("{}{}", d ? ", " : "", ne[d]);
  return fmt::format("{} [{}]", type_name(dtype), dims);
}

}  // namespace kiln
