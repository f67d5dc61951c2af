// Row-wise and elementwise ops: gather, norms, matmul wrapper, activations, softmax.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "backend/cpu/activations_avx512.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/ops.h"
#include "core/cpu_features.h"
#include "quant/quant.h"

namespace kiln::cpu {

namespace basic_ops {

// Row r of a tensor of any rank (rows counted over dims 1..3).
inline float* f32_row(const Tensor& t, int64_t r) {
  const int64_t i1 = r % t.ne[1], i2 = (r / t.ne[1]) % t.ne[2], i3 = r / (t.ne[1] * t.ne[2]);
  return reinterpret_cast<float*>(t.row_ptr(i1, i2, i3));
}

void same_shape(const Tensor& a, const Tensor& b, const char* op) {
  KILN_CHECK(a.ne[0] == b.ne[0] && a.rows() == b.rows(), "{}: shapes differ: {} is {}, {} is {}", op, a.name,
             a.describe(), b.name, b.describe());
}

float gelu_tanh(float x) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  return 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * (x + 0.044715f * x * x * x)));
}

}  // namespace basic_ops

using basic_ops::f32_row;

void require_f32_rows(const Tensor& t, const char* op, const char* what) {
  KILN_CHECK(!t.empty(), "{}: {} is missing", op, what);
  KILN_CHECK(t.dtype == GgmlType::F32 && t.nb[0] == sizeof(float), "{}: {} ({} {}) must be f32 with packed rows",
             op, what, t.name, t.describe());
  KILN_CHECK(t.device == Device::Cpu, "{}: {} ({}) is not in CPU memory", op, what, t.name);
}

void get_rows(const Tensor& table, const Tensor& ids, Tensor& out, ThreadPool& pool) {
  require_f32_rows(out, "get_rows", "out");
  KILN_CHECK(ids.dtype == GgmlType::I32 && ids.elements() == out.rows(), "get_rows: {} ids for {} output rows",
             ids.elements(), out.rows());
  KILN_CHECK(table.ne[0] == out.ne[0], "get_rows: table {} {} rows are not {} wide", table.name, table.describe(),
             out.ne[0]);
  const int32_t* id = ids.as<int32_t>();
  const int64_t n_table_rows = table.rows();
  for (int64_t t = 0; t < out.rows(); ++t)
    KILN_CHECK(id[t] >= 0 && id[t] < n_table_rows, "get_rows: id {} at {} outside table {} of {} rows", id[t], t,
               table.name, n_table_rows);
  parallel_items(pool, out.rows(), out.ne[0] * 4, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const uint8_t* src = table.row_ptr(id[t]);
      if (table.dtype == GgmlType::F32)
        std::memcpy(f32_row(out, t), src, size_t(out.ne[0]) * sizeof(float));
      else
        dequantize_row(table.dtype, src, f32_row(out, t), out.ne[0]);
    }
  });
}

namespace basic_ops {

void normalize_row(const float* x, const float* w, float eps, int64_t n, float* y) {
  double sum_sq = 0;
  for (int64_t i = 0; i < n; ++i) sum_sq += double(x[i]) * x[i];
  const float inv = float(1.0 / std::sqrt(sum_sq / double(n) + double(eps)));
  if (w) {
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] * inv * w[i];
  } else {
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] * inv;
  }
}

const float* norm_weight(const Tensor& weight, int64_t n, const char* op) {
  if (weight.empty()) return nullptr;
  require_f32_rows(weight, op, "weight");
  KILN_CHECK(weight.elements() == n, "{}: weight {} has {} elements, rows have {}", op, weight.name,
             weight.elements(), n);
  return weight.as<float>();
}

}  // namespace basic_ops

void rmsnorm(const Tensor& x, const Tensor& weight, float eps, Tensor& out, ThreadPool& pool) {
  require_f32_rows(x, "rmsnorm", "x");
  require_f32_rows(out, "rmsnorm", "out");
  basic_ops::same_shape(x, out, "rmsnorm");
  const float* w = basic_ops::norm_weight(weight, x.ne[0], "rmsnorm");
  parallel_items(pool, x.rows(), x.ne[0] * 4, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) basic_ops::normalize_row(f32_row(x, r), w, eps, x.ne[0], f32_row(out, r));
  });
}

void add_rmsnorm(const Tensor& x, Tensor& residual, const Tensor& weight, float eps, Tensor& out, ThreadPool& pool) {
  require_f32_rows(x, "add_rmsnorm", "x");
  require_f32_rows(residual, "add_rmsnorm", "residual");
  require_f32_rows(out, "add_rmsnorm", "out");
  basic_ops::same_shape(x, residual, "add_rmsnorm");
  basic_ops::same_shape(x, out, "add_rmsnorm");
  const float* w = basic_ops::norm_weight(weight, x.ne[0], "add_rmsnorm");
  parallel_items(pool, x.rows(), x.ne[0] * 4, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* h = f32_row(residual, r);
      const float* a = f32_row(x, r);
      for (int64_t i = 0; i < x.ne[0]; ++i) h[i] += a[i];
      basic_ops::normalize_row(h, w, eps, x.ne[0], f32_row(out, r));
    }
  });
}

void linear(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& out, ThreadPool& pool) {
  require_f32_rows(x, "matmul", "x");
  require_f32_rows(out, "matmul", "out");
  KILN_CHECK(w.ne[0] == x.ne[0] && w.ne[2] == 1 && w.ne[3] == 1,
             "matmul: weight {} {} does not take rows of {} (x {})", w.name, w.describe(), x.ne[0], x.name);
  KILN_CHECK(out.ne[0] == w.ne[1] && out.rows() == x.rows(), "matmul: out {} {} is not [{}, {}] for weight {}",
             out.name, out.describe(), w.ne[1], x.rows(), w.name);
  KILN_CHECK(x.ne[2] == 1 && out.ne[2] == 1 && x.ne[3] == 1 && out.ne[3] == 1, "matmul: x and out must be 2-D");
  MatmulArgs args{w.dtype, w.data, w.nb[1], w.ne[1], w.ne[0], x.as<float>(), int64_t(x.nb[1] / sizeof(float)),
                  x.ne[1], out.as<float>(), int64_t(out.nb[1] / sizeof(float))};
  matmul(args, pool);
  if (!bias.empty()) {
    require_f32_rows(bias, "matmul", "bias");
    KILN_CHECK(bias.elements() == w.ne[1], "matmul: bias {} has {} elements for {} outputs", bias.name,
               bias.elements(), w.ne[1]);
    const float* b = bias.as<float>();
    for (int64_t t = 0; t < out.ne[1]; ++t) {
      float* y = out.f32_row(t);
      for (int64_t o = 0; o < out.ne[0]; ++o) y[o] += b[o];
    }
  }
}

void glu(const Tensor& gate, const Tensor& up, const GluParams& params, Tensor& out, ThreadPool& pool) {
  require_f32_rows(gate, "glu", "gate");
  require_f32_rows(up, "glu", "up");
  require_f32_rows(out, "glu", "out");
  basic_ops::same_shape(gate, up, "glu");
  basic_ops::same_shape(gate, out, "glu");
  const int64_t n = gate.ne[0];
  const bool simd = cpu_features().avx512;
  parallel_items(pool, gate.rows(), gate.ne[0] * 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* g = f32_row(gate, r);
      const float* u = f32_row(up, r);
      float* y = f32_row(out, r);
      if (params.act == Activation::Silu && simd) {  // vectorized exp: 4.5% of pp64 when scalar
        avx512::silu_mul(g, u, y, n);
        continue;
      }
      for (int64_t i = 0; i < n; ++i) {
        switch (params.act) {
          case Activation::Silu: y[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i]; break;
          case Activation::GeluTanh: y[i] = basic_ops::gelu_tanh(g[i]) * u[i]; break;
          case Activation::SwigluOai: {
            const float gc = std::min(g[i], params.limit);
            const float uc = std::clamp(u[i], -params.limit, params.limit);
            y[i] = gc / (1.0f + std::exp(-params.alpha * gc)) * (uc + 1.0f);
            break;
          }
        }
      }
    }
  });
}

void softmax(const Tensor& x, Tensor& out) {
  require_f32_rows(x, "softmax", "x");
  require_f32_rows(out, "softmax", "out");
  basic_ops::same_shape(x, out, "softmax");
  for (int64_t r = 0; r < x.rows(); ++r) {
    const float* a = f32_row(x, r);
    float* y = f32_row(out, r);
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < x.ne[0]; ++i) m = std::max(m, a[i]);
    double sum = 0;
    for (int64_t i = 0; i < x.ne[0]; ++i) sum += (y[i] = std::exp(a[i] - m));
    for (int64_t i = 0; i < x.ne[0]; ++i) y[i] = float(y[i] / sum);
  }
}

void add(const Tensor& a, const Tensor& b, Tensor& out) {
  require_f32_rows(a, "add", "a");
  require_f32_rows(b, "add", "b");
  require_f32_rows(out, "add", "out");
  basic_ops::same_shape(a, out, "add");
  KILN_CHECK(b.ne[0] == a.ne[0] && (b.rows() == a.rows() || b.rows() == 1), "add: {} {} does not fit {} {}", b.name,
             b.describe(), a.name, a.describe());
  for (int64_t r = 0; r < a.rows(); ++r) {
    const float* x = f32_row(a, r);
    const float* y = f32_row(b, b.rows() == 1 ? 0 : r);
    float* z = f32_row(out, r);
    for (int64_t i = 0; i < a.ne[0]; ++i) z[i] = x[i] + y[i];
  }
}

void scale(const Tensor& x, float factor, Tensor& out) {
  require_f32_rows(x, "scale", "x");
  require_f32_rows(out, "scale", "out");
  basic_ops::same_shape(x, out, "scale");
  for (int64_t r = 0; r < x.rows(); ++r) {
    const float* a = f32_row(x, r);
    float* y = f32_row(out, r);
    for (int64_t i = 0; i < x.ne[0]; ++i) y[i] = a[i] * factor;
  }
}

void softcap(const Tensor& x, float cap, Tensor& out) {
  require_f32_rows(x, "softcap", "x");
  require_f32_rows(out, "softcap", "out");
  basic_ops::same_shape(x, out, "softcap");
  KILN_CHECK(cap > 0, "softcap: cap {} must be positive", cap);
  for (int64_t r = 0; r < x.rows(); ++r) {
    const float* a = f32_row(x, r);
    float* y = f32_row(out, r);
    for (int64_t i = 0; i < x.ne[0]; ++i) y[i] = cap * std::tanh(a[i] / cap);
  }
}

void argmax(const Tensor& x, Tensor& out) {
  require_f32_rows(x, "argmax", "x");
  KILN_CHECK(out.dtype == GgmlType::I32 && out.elements() == x.rows(), "argmax: out {} {} is not I32 [{}]", out.name,
             out.describe(), x.rows());
  int32_t* o = out.as<int32_t>();
  for (int64_t r = 0; r < x.rows(); ++r) {
    const float* a = f32_row(x, r);
    int64_t best = 0;
    for (int64_t i = 1; i < x.ne[0]; ++i)
      if (a[i] > a[best]) best = i;  // first of equal maxima, like torch.argmax
    o[r] = int32_t(best);
  }
}

}  // namespace kiln::cpu
