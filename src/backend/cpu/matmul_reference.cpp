#include <vector>

#include "backend/cpu/matmul.h"
#include "quant/quant.h"

namespace kiln::cpu {

void matmul_reference(const MatmulArgs& a) {
  std::vector<float> row(size_t(a.cols));
  for (int64_t o = 0; o < a.rows; ++o) {
    dequantize_row_reference(a.type, static_cast<const uint8_t*>(a.w) + size_t(o) * a.w_row_bytes, row.data(), a.cols);
    for (int64_t t = 0; t < a.n_tokens; ++t) {
      const float* x = a.x + t * a.x_stride;
      double sum = 0;
      for (int64_t i = 0; i < a.cols; ++i) sum += double(row[i]) * double(x[i]);
      a.y[t * a.y_stride + o] = float(sum);
    }
  }
}

}  // namespace kiln::cpu
