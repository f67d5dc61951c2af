// Views of a tensor's data (backend/tensor.h): heads seen as rows, as the cache store takes
// k's heads, both where they are packed (a separate k) and where each token's row sits
// inside a wider one (q/k/v as column ranges of one buffer).
#include <gtest/gtest.h>

#include <vector>

#include "backend/tensor.h"
#include "core/error.h"

namespace kiln {
namespace {

TEST(TensorViews, HeadsAsRowsKeepsTheTokensStride) {
  // 5 tokens of [q: 4 heads of 8 | k: 2 heads of 8 | v: 16] side by side, 64 floats a token.
  const int64_t T = 5, head = 8, width = 4 * head + 2 * head + 16;
  std::vector<float> buf(size_t(T * width));
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = float(i);
  Tensor k;
  k.dtype = GgmlType::F32, k.n_dims = 3;
  k.ne[0] = head, k.ne[1] = 2, k.ne[2] = T;
  k.nb[0] = 4, k.nb[1] = 4 * head, k.nb[2] = 4 * width, k.nb[3] = k.nb[2] * T;
  k.data = buf.data() + 4 * head;
  ASSERT_TRUE(heads_packed(k));
  ASSERT_FALSE(k.is_contiguous());
  const Tensor rows = heads_as_rows(k);
  EXPECT_EQ(rows.n_dims, 2);
  EXPECT_EQ(rows.ne[0], 2 * head);
  EXPECT_EQ(rows.ne[1], T);
  EXPECT_EQ(rows.nb[1], size_t(4 * width));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < 2 * head; ++i)
      EXPECT_EQ(rows.f32_row(t)[i], buf[size_t(t * width + 4 * head + i)]) << "token " << t << " [" << i << "]";

  // Packed heads of a tensor of their own: the same rows, contiguous.
  const Tensor own = Tensor::contiguous(GgmlType::F32, {head, 2, T}, buf.data());
  ASSERT_TRUE(heads_packed(own));
  const Tensor own_rows = heads_as_rows(own);
  EXPECT_EQ(own_rows.ne[0], 2 * head);
  EXPECT_EQ(own_rows.nb[1], size_t(4 * 2 * head));
  EXPECT_TRUE(own_rows.is_contiguous());

  // A token's heads apart from each other (a gap after each head): no rows to make.
  Tensor gapped = k;
  gapped.nb[1] = 4 * (head + 4);
  EXPECT_FALSE(heads_packed(gapped));
  EXPECT_THROW(heads_as_rows(gapped), Error);
}

}  // namespace
}  // namespace kiln
