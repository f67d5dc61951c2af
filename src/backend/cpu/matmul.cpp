// First version of the fast path: rows split over threads, each weight row dequantized
// once into a thread-local buffer and dotted with every token. To be replaced by kernels
// that dot quantized blocks directly.
#include <vector>

#include "backend/cpu/matmul.h"
#include "quant/quant.h"

namespace kiln::cpu {

void matmul(const MatmulArgs& a, ThreadPool& pool) {
  pool.parallel_for(a.rows, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> row(size_t(a.cols));
    for (int64_t o = begin; o < end; ++o) {
      dequantize_row(a.type, static_cast<const uint8_t*>(a.w) + size_t(o) * a.w_row_bytes, row.data(), a.cols);
      for (int64_t t = 0; t < a.n_tokens; ++t) {
        const float* x = a.x + t * a.x_stride;
        float sum = 0;
        for (int64_t i = 0; i < a.cols; ++i) sum += row[i] * x[i];
        a.y[t * a.y_stride + o] = sum;
      }
    }
  });
}

}  // namespace kiln::cpu
