// GPU kernel benchmarks (a plain program, not a test): times kiln's CUDA kernels with CUDA
// events -- the median of many samples, each a batch of launches replayed from a CUDA graph
// where the kernels are small -- over weight copies rotated so that their total exceeds
// the L2 cache. Prints GB/s of bytes that must move (weights, caches) or TFLOP/s, against
// the device-to-device copy bandwidth it measures first.
//
//   bench_cuda_kernels_bench [--quick | --profile | --matvec | --matvec-f16]
//     --profile: a few launches for ncu; --matvec: only the decode matvecs of Llama-3-8B's
//     layer shapes for q4_0 / q8_0 / q4_K (e.g. to compare KILN_MATVEC_STAGES settings);
//     --matvec-f16: those shapes in f16, the general float kernel and the grouped 16-bit one
#include <cublas_v2.h>
#include <cuda_runtime.h>  // the typed cudaMalloc overloads

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "backend/cuda/attention.h"
#include "backend/cuda/dequant.h"
#include "backend/cuda/device.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/matvec.h"
#include "backend/cuda/matvec_f16_grouped.h"
#include "backend/cuda/ops.h"
#include "core/half.h"
#include "quant/types.h"
#include "cuda_bench_util.h"

namespace {

using namespace kiln;
using namespace kiln::cuda;
using namespace kiln::bench;

constexpr size_t kRotateBytes = size_t(256) << 20;  // > 50-60 MB of L2, several times

// Device copies of one weight matrix, enough of them to exceed kRotateBytes.
struct Rotation {
  std::vector<void*> copies;
  size_t bytes = 0;
  Rotation(const std::vector<uint8_t>& host, size_t min_copies = 2) : bytes(host.size()) {
    const size_t n = std::max(min_copies, (kRotateBytes + bytes - 1) / bytes);
    for (size_t i = 0; i < n; ++i) {
      void* p = nullptr;
      check(cudaMalloc(&p, bytes + 16), "cudaMalloc weights");
      if (i == 0)
        check(cudaMemcpy(p, host.data(), bytes, cudaMemcpyHostToDevice), "upload");
      else
        check(cudaMemcpy(p, copies[0], bytes, cudaMemcpyDeviceToDevice), "replicate");
      copies.push_back(p);
    }
  }
  ~Rotation() {
    for (void* p : copies) cudaFree(p);
  }
  void* operator[](size_t i) const { return copies[i % copies.size()]; }
};

// As time_graph (cuda_bench_util.h), launching directly (for cuBLAS calls, which are long enough).
double time_direct(cudaStream_t s, int batch, int samples, const std::function<void(int)>& launch) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int i = 0; i < 2; ++i) launch(i);
  check(cudaStreamSynchronize(s), "warm-up");
  std::vector<float> ms;
  for (int i = 0; i < samples; ++i) {
    cudaEventRecord(a, s);
    for (int j = 0; j < batch; ++j) launch(j);
    cudaEventRecord(b, s);
    check(cudaEventSynchronize(b), "timed batch");
    float t = 0;
    cudaEventElapsedTime(&t, a, b);
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return double(median(ms)) * 1000.0 / batch;
}

struct Row {
  std::string kernel, shape, detail;
  double us, rate;  // GB/s or TFLOP/s
  std::string unit;
  double pct;       // of the copy bandwidth or of the bf16 peak
};
std::vector<Row> g_rows;
double g_copy_gbs = 0;
constexpr double kBf16PeakTflops = 790.0;  // measured on an H200 of this workplace (device KINDS.md)

void report(const Row& r) {
  g_rows.push_back(r);
  std::printf("%-22s %-22s %-16s %10.2f us %9.1f %-7s %5.1f%%\n", r.kernel.c_str(), r.shape.c_str(), r.detail.c_str(),
              r.us, r.rate, r.unit.c_str(), r.pct);
  std::fflush(stdout);
}

void bench_copy(cudaStream_t s) {
  const size_t bytes = size_t(1) << 30;
  void *a = nullptr, *b = nullptr;
  check(cudaMalloc(&a, bytes), "malloc");
  check(cudaMalloc(&b, bytes), "malloc");
  cudaMemsetAsync(a, 1, bytes, s);
  const double us = time_direct(s, 1, 15, [&](int) { cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s); });
  g_copy_gbs = 2.0 * bytes / us / 1e3;
  report({"copy d2d", "1 GiB", "read+write", us, g_copy_gbs, "GB/s", 100.0});
  cudaFree(a);
  cudaFree(b);
}

// Times the product with x already quantized (the kernel; one quantized x serves several
// matvecs of a layer) and, on the main shapes, the whole call with the quantization.
void bench_matvec(cudaStream_t s, GgmlType type, int64_t rows, int64_t cols, int rows_per_warp, int warps_per_row,
                  bool quick, bool with_quantize = false) {
  Rng rng{uint64_t(type) * 7919 + uint64_t(rows)};
  const std::vector<uint8_t> host = random_weights(type, rows, cols, rng);
  const Rotation w(host);
  std::vector<float> xh(static_cast<size_t>(cols));
  for (float& v : xh) v = rng.uniform();
  float *x = nullptr, *y = nullptr;
  void* scratch = nullptr;
  check(cudaMalloc(&x, cols * 4), "malloc");
  check(cudaMalloc(&y, rows * 4), "malloc");
  const size_t scratch_bytes = std::max<size_t>(16, matvec_scratch_bytes(type, cols));
  check(cudaMalloc(&scratch, scratch_bytes), "malloc");
  cudaMemcpy(x, xh.data(), cols * 4, cudaMemcpyHostToDevice);
  MatvecArgs a;
  a.type = type;
  a.w_row_bytes = int64_t(host.size() / rows);
  a.rows = rows;
  a.cols = cols;
  a.x = x;
  a.y = y;
  a.rows_per_warp = rows_per_warp;
  a.warps_per_row = warps_per_row;
  const bool quant = traits(type).is_quantized;
  const Q8Vector xq = q8_vector_in(scratch, cols);
  if (quant) check(quantize_q8(x, cols, xq, s), "quantize");
  std::string name = quant ? "matvec_q8" : "matvec";
  if (rows_per_warp || warps_per_row)
    name += " r" + std::to_string(rows_per_warp) + "w" + std::to_string(warps_per_row);
  const std::string shape = std::to_string(rows) + "x" + std::to_string(cols);
  const double us = time_graph(s, 20, quick ? 5 : 15, [&](int i) {
    MatvecArgs c = a;
    c.w = w[size_t(i)];
    if (quant)
      check(matvec_q8(c, xq, s), "matvec_q8");
    else
      check(matvec(c, scratch, scratch_bytes, s), "matvec");
  });
  const double gbs = double(host.size()) / us / 1e3;
  report({name, shape, std::string(type_name(type)), us, gbs, "GB/s", 100.0 * gbs / g_copy_gbs});
  if (quant && with_quantize) {
    const double us2 = time_graph(s, 20, quick ? 5 : 15, [&](int i) {
      MatvecArgs c = a;
      c.w = w[size_t(i)];
      check(matvec(c, scratch, scratch_bytes, s), "matvec");
    });
    const double gbs2 = double(host.size()) / us2 / 1e3;
    report({"  + quantize x", shape, std::string(type_name(type)), us2, gbs2, "GB/s", 100.0 * gbs2 / g_copy_gbs});
  }
  cudaFree(x);
  cudaFree(y);
  cudaFree(scratch);
}

// The grouped 16-bit float kernel (matvec_f16_grouped.h) as a decode step launches it: x
// RMS-normalized inside the launch (`norm`, as for q/k/v and gate/up) or the product added to
// a residual (`accumulate`, as for o and down). One matrix of all the rows: the stacked parts
// of a layer move the same bytes.
void bench_half_grouped(cudaStream_t s, GgmlType type, int64_t rows, int64_t cols, bool norm, bool accumulate) {
  Rng rng{uint64_t(type) * 7919 + uint64_t(rows) + 1};
  const std::vector<uint8_t> host = random_weights(type, rows, cols, rng);
  const Rotation w(host);
  std::vector<float> xh(static_cast<size_t>(cols)), ones(static_cast<size_t>(cols), 1.0f);
  for (float& v : xh) v = rng.uniform();
  float *x = nullptr, *y = nullptr, *residual = nullptr, *norm_w = nullptr, *normed = nullptr;
  check(cudaMalloc(&x, cols * 4), "malloc");
  check(cudaMalloc(&norm_w, cols * 4), "malloc");
  check(cudaMalloc(&normed, cols * 4), "malloc");
  check(cudaMalloc(&y, rows * 4), "malloc");
  check(cudaMalloc(&residual, rows * 4), "malloc");
  cudaMemcpy(x, xh.data(), cols * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(norm_w, ones.data(), cols * 4, cudaMemcpyHostToDevice);
  cudaMemset(residual, 0, rows * 4);
  F32Input in;
  in.x = x;
  if (norm) in.norm_weight = norm_w, in.eps = 1e-5f, in.normed = normed;
  const int64_t row_bytes = int64_t(host.size() / rows);
  const double us = time_graph(s, 20, 15, [&](int i) {
    const MatvecPart part{w[size_t(i)], rows, nullptr, y, accumulate ? residual : nullptr};
    check(matvec_half_parts(type, cols, row_bytes, std::span(&part, 1), in, s), "matvec_half_parts");
  });
  const double gbs = double(host.size()) / us / 1e3;
  const std::string shape = std::to_string(rows) + "x" + std::to_string(cols);
  const std::string detail = std::string(type_name(type)) + (norm ? " +norm" : "") + (accumulate ? " +acc" : "");
  report({"matvec_half_grouped", shape, detail, us, gbs, "GB/s", 100.0 * gbs / g_copy_gbs});
  for (float* p : {x, y, residual, norm_w, normed}) cudaFree(p);
}

void bench_gemm(cudaStream_t s, cublasHandle_t blas, GgmlType type, int64_t t, int64_t n, int64_t k, bool quick) {
  Rng rng{uint64_t(type) * 104729 + uint64_t(n)};
  const std::vector<uint8_t> host = random_weights(type, n, k, rng);
  const Rotation w(host, 2);
  std::vector<float> xh(size_t(t * k));
  for (float& v : xh) v = rng.uniform();
  float *x = nullptr, *y = nullptr;
  void* scratch = nullptr;
  check(cudaMalloc(&x, xh.size() * 4), "malloc");
  check(cudaMalloc(&y, size_t(t * n) * 4), "malloc");
  cudaMemcpy(x, xh.data(), xh.size() * 4, cudaMemcpyHostToDevice);
  GemmArgs a;
  a.type = type;
  a.w_row_bytes = int64_t(host.size() / n);
  a.n = n;
  a.k = k;
  a.x = x;
  a.x_stride = k;
  a.t = t;
  a.y = y;
  a.y_stride = n;
  const size_t scratch_bytes = gemm_scratch_bytes(a);
  check(cudaMalloc(&scratch, std::max<size_t>(256, scratch_bytes)), "malloc");
  const double flop = 2.0 * double(t) * double(n) * double(k);
  const std::string shape = std::to_string(t) + "x" + std::to_string(n) + "x" + std::to_string(k);
  const double us = time_direct(s, 5, quick ? 3 : 9, [&](int i) {
    GemmArgs c = a;
    c.w = w[size_t(i)];
    check(gemm(c, blas, scratch, scratch_bytes, s), "gemm");
  });
  report({"gemm", shape, std::string(type_name(type)), us, flop / us / 1e6, "TFLOP/s", 100.0 * flop / us / 1e6 / kBf16PeakTflops});
  if (traits(type).is_quantized) {
    // The dequantization pass alone, and the bytes it moves (weights in, bf16 out).
    const double dus = time_direct(s, 5, quick ? 3 : 9, [&](int i) {
      DequantArgs d;
      d.type = type;
      d.src = w[size_t(i)];
      d.src_row_bytes = a.w_row_bytes;
      d.rows = n;
      d.cols = k;
      d.dst = static_cast<uint8_t*>(scratch) + ((size_t(t) * k * 2 + 255) / 256 * 256);
      d.dst_stride = k;
      d.out = OutType::BF16;
      check(dequantize_rows(d, s), "dequantize");
    });
    const double moved = double(host.size()) + double(n) * double(k) * 2.0;
    report({"  dequant->bf16", std::to_string(n) + "x" + std::to_string(k), std::string(type_name(type)), dus,
            moved / dus / 1e3, "GB/s", 100.0 * moved / dus / 1e3 / g_copy_gbs});
  }
  cudaFree(x);
  cudaFree(y);
  cudaFree(scratch);
}

void bench_attention(cudaStream_t s, int n_seq, int ctx, bool quick) {
  const int n_head = 32, n_kv = 8, D = 128, bs = 16;
  const int blocks_per_seq = (ctx + bs - 1) / bs;
  const size_t slot_bytes = size_t(n_kv) * D * 2;
  const size_t layer_bytes = size_t(n_seq) * blocks_per_seq * bs * slot_bytes;  // one of K, V
  const int layers = int(std::max<size_t>(2, (kRotateBytes + 2 * layer_bytes - 1) / (2 * layer_bytes)));
  void *k = nullptr, *v = nullptr, *scratch = nullptr;
  float *q = nullptr, *out = nullptr;
  int32_t *tables = nullptr, *pos = nullptr;
  check(cudaMalloc(&k, layer_bytes * layers), "malloc k");
  check(cudaMalloc(&v, layer_bytes * layers), "malloc v");
  cudaMemset(k, 0x3c, layer_bytes * layers);  // f16 values near 1: finite, not zero
  cudaMemset(v, 0x3a, layer_bytes * layers);
  std::vector<int32_t> th(size_t(n_seq) * blocks_per_seq), ph(size_t(n_seq), ctx - 1);
  for (size_t i = 0; i < th.size(); ++i) th[i] = int32_t((i * 7919) % th.size());  // scattered blocks
  std::vector<float> qh(size_t(n_seq) * n_head * D);
  Rng rng{42};
  for (float& x : qh) x = rng.uniform();
  check(cudaMalloc(&tables, th.size() * 4), "malloc");
  check(cudaMalloc(&pos, ph.size() * 4), "malloc");
  check(cudaMalloc(&q, qh.size() * 4), "malloc");
  check(cudaMalloc(&out, qh.size() * 4), "malloc");
  cudaMemcpy(tables, th.data(), th.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(pos, ph.data(), ph.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(q, qh.data(), qh.size() * 4, cudaMemcpyHostToDevice);
  DecodeAttentionArgs a;
  a.q = q;
  a.q_stride = n_head * D;
  a.k_slot_stride = a.v_slot_stride = n_kv * D;
  a.cache_type = GgmlType::F16;
  a.block_tables = tables;
  a.block_table_stride = blocks_per_seq;
  a.block_size = bs;
  a.positions = pos;
  a.n_seq = n_seq;
  a.n_head = n_head;
  a.n_head_kv = n_kv;
  a.head_dim = D;
  a.max_context = ctx;
  a.scale = 1.0f / std::sqrt(float(D));
  a.out = out;
  a.out_stride = n_head * D;
  const size_t scratch_bytes = std::max<size_t>(16, decode_attention_scratch_bytes(a));
  check(cudaMalloc(&scratch, scratch_bytes), "malloc");
  const double us = time_graph(s, 10, quick ? 5 : 15, [&](int i) {
    DecodeAttentionArgs c = a;
    c.k_cache = static_cast<uint8_t*>(k) + size_t(i % layers) * layer_bytes;
    c.v_cache = static_cast<uint8_t*>(v) + size_t(i % layers) * layer_bytes;
    check(decode_attention(c, scratch, scratch_bytes, s), "attention");
  });
  const double bytes = 2.0 * n_seq * double(ctx) * slot_bytes;
  report({"decode attention", "seq " + std::to_string(n_seq) + " ctx " + std::to_string(ctx), "f16 32/8x128", us,
          bytes / us / 1e3, "GB/s", 100.0 * bytes / us / 1e3 / g_copy_gbs});
  for (void* p : {k, v, scratch, static_cast<void*>(q), static_cast<void*>(out), static_cast<void*>(tables),
                  static_cast<void*>(pos)})
    cudaFree(p);
}

void bench_small_ops(cudaStream_t s) {
  const int64_t T = 512, D = 4096, F = 14336, V = 128256;
  float *x = nullptr, *h = nullptr, *y = nullptr, *wgt = nullptr, *g = nullptr, *u = nullptr, *logits = nullptr;
  int32_t *pos = nullptr, *ids = nullptr, *am = nullptr;
  check(cudaMalloc(&x, T * D * 4), "malloc");
  check(cudaMalloc(&h, T * D * 4), "malloc");
  check(cudaMalloc(&y, T * D * 4), "malloc");
  check(cudaMalloc(&wgt, D * 4), "malloc");
  check(cudaMalloc(&g, T * F * 4), "malloc");
  check(cudaMalloc(&u, T * F * 4), "malloc");
  check(cudaMalloc(&logits, 32 * V * 4), "malloc");
  check(cudaMalloc(&pos, T * 4), "malloc");
  check(cudaMalloc(&ids, T * 4), "malloc");
  check(cudaMalloc(&am, 32 * 4), "malloc");
  cudaMemset(x, 0x3f, T * D * 4);
  cudaMemset(h, 0x3e, T * D * 4);
  cudaMemset(wgt, 0x3f, D * 4);
  cudaMemset(g, 0x3f, T * F * 4);
  cudaMemset(u, 0x3e, T * F * 4);
  cudaMemset(logits, 0x3d, 32 * V * 4);
  std::vector<int32_t> ph(T);
  for (int64_t i = 0; i < T; ++i) ph[i] = int32_t(i * 37 % 8192);
  cudaMemcpy(pos, ph.data(), T * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(ids, ph.data(), T * 4, cudaMemcpyHostToDevice);

  for (int64_t rows : {int64_t(1), T}) {
    RmsNormArgs a;
    a.x = x, a.x_stride = D, a.residual = h, a.residual_stride = D, a.weight = wgt, a.rows = rows, a.dim = D, a.y = y,
    a.y_stride = D;
    const double us = time_graph(s, 20, 15, [&](int) { check(rmsnorm(a, s), "rmsnorm"); });
    const double bytes = double(rows) * D * 4 * 4;  // x, residual in and out, y
    report({"add+rmsnorm", std::to_string(rows) + "x" + std::to_string(D), "f32", us, bytes / us / 1e3, "GB/s",
            100.0 * bytes / us / 1e3 / g_copy_gbs});
  }
  {
    RopeArgs a;
    a.x = x, a.token_stride = D, a.head_stride = 128, a.n_tokens = T, a.n_heads = 32, a.head_dim = 128,
    a.positions = pos, a.n_rot = 128, a.neox = false, a.freq_base = 500000.0f;
    const double us = time_graph(s, 20, 15, [&](int) { check(rope(a, s), "rope"); });
    const double bytes = double(T) * D * 8;
    report({"rope", "512x32x128", "normal", us, bytes / us / 1e3, "GB/s", 100.0 * bytes / us / 1e3 / g_copy_gbs});
  }
  for (int64_t rows : {int64_t(1), T}) {
    GluArgs a;
    a.gate = g, a.gate_stride = F, a.up = u, a.up_stride = F, a.rows = rows, a.n = F, a.out = g, a.out_stride = F;
    const double us = time_graph(s, 20, 15, [&](int) { check(glu(a, s), "glu"); });
    const double bytes = double(rows) * F * 12;
    report({"silu*mul", std::to_string(rows) + "x" + std::to_string(F), "f32", us, bytes / us / 1e3, "GB/s",
            100.0 * bytes / us / 1e3 / g_copy_gbs});
  }
  {
    Rng rng{5};
    const std::vector<uint8_t> table = random_weights(GgmlType::Q4_K, 32000, D, rng);
    void* tab = nullptr;
    check(cudaMalloc(&tab, table.size() + 16), "malloc");
    cudaMemcpy(tab, table.data(), table.size(), cudaMemcpyHostToDevice);
    const double us = time_graph(s, 20, 15, [&](int) {
      check(get_rows(GgmlType::Q4_K, tab, int64_t(table.size() / 32000), 32000, D, ids, T, y, D, s), "get_rows");
    });
    const double bytes = double(T) * D * (4.0 + 144.0 / 256.0);
    report({"get_rows", "512 of 32000x4096", "q4_K", us, bytes / us / 1e3, "GB/s", 100.0 * bytes / us / 1e3 / g_copy_gbs});
    cudaFree(tab);
  }
  void* am_scratch = nullptr;
  const size_t am_bytes = argmax_scratch_bytes(32, V);
  check(cudaMalloc(&am_scratch, am_bytes), "malloc");
  for (int64_t rows : {int64_t(1), int64_t(32)}) {
    const double us = time_graph(s, 20, 15, [&](int) {
      check(argmax_rows(logits, V, rows, V, am, am_scratch, am_bytes, s), "argmax");
    });
    const double bytes = double(rows) * V * 4;
    report({"argmax", std::to_string(rows) + "x" + std::to_string(V), "f32", us, bytes / us / 1e3, "GB/s",
            100.0 * bytes / us / 1e3 / g_copy_gbs});
  }
  for (void* p : {static_cast<void*>(x), static_cast<void*>(h), static_cast<void*>(y), static_cast<void*>(wgt),
                  static_cast<void*>(g), static_cast<void*>(u), static_cast<void*>(logits), static_cast<void*>(pos),
                  static_cast<void*>(ids), static_cast<void*>(am), am_scratch})
    cudaFree(p);
}

}  // namespace

// For a profiler (ncu): a few direct launches of the kernels under study, nothing timed.
void profile_launches(cudaStream_t s) {
  for (GgmlType type : {GgmlType::Q4_0, GgmlType::Q4_K}) {
    Rng rng{7};
    const int64_t rows = 14336, cols = 4096;
    const std::vector<uint8_t> host = random_weights(type, rows, cols, rng);
    void *w = nullptr, *scratch = nullptr;
    float *x = nullptr, *y = nullptr;
    check(cudaMalloc(&w, host.size() + 16), "malloc");
    check(cudaMalloc(&x, cols * 4), "malloc");
    check(cudaMalloc(&y, rows * 4), "malloc");
    check(cudaMalloc(&scratch, matvec_scratch_bytes(type, cols)), "malloc");
    cudaMemcpy(w, host.data(), host.size(), cudaMemcpyHostToDevice);
    cudaMemset(x, 0x3c, cols * 4);
    const Q8Vector xq = q8_vector_in(scratch, cols);
    check(quantize_q8(x, cols, xq, s), "quantize");
    MatvecArgs a;
    a.type = type, a.w = w, a.w_row_bytes = int64_t(host.size() / rows), a.rows = rows, a.cols = cols, a.x = x, a.y = y;
    for (int i = 0; i < 2; ++i) check(matvec_q8(a, xq, s), "matvec_q8");
    check(cudaStreamSynchronize(s), "sync");
    for (void* p : {w, scratch, static_cast<void*>(x), static_cast<void*>(y)}) cudaFree(p);
  }
  bench_attention(s, 1, 32768, true);
}

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const bool profile = argc > 1 && std::strcmp(argv[1], "--profile") == 0;
  const bool matvec_only = argc > 1 && std::strcmp(argv[1], "--matvec") == 0;
  const bool matvec_f16 = argc > 1 && std::strcmp(argv[1], "--matvec-f16") == 0;
  std::string why;
  const auto devices = list_devices(&why);
  if (devices.empty()) {
    std::printf("bench: no CUDA device (%s)\n", why.c_str());
    return 0;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("device: %s, %d SMs, L2 %d MB, %.0f GB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20,
              double(prop.totalGlobalMem) / 1e9);
  cudaStream_t s;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  cublasHandle_t blas;
  if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "bench: cublasCreate failed\n");
    return 1;
  }

  bench_copy(s);
  if (profile) {
    profile_launches(s);
    return 0;
  }
  if (matvec_only) {
    const int64_t layer_shapes[4][2] = {{6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}};
    for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_K})
      for (const auto& sh : layer_shapes) bench_matvec(s, t, sh[0], sh[1], 0, 0, false);
    return 0;
  }
  if (matvec_f16) {
    // Rows x cols and where the step takes them: q/k/v and gate/up with the norm inside,
    // o and down adding into the residual, then the lm_head.
    const int64_t shapes[5][2] = {{6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}, {128256, 4096}};
    const bool with_norm[5] = {true, false, true, false, false}, with_residual[5] = {false, true, false, true, false};
    for (const auto& sh : shapes) bench_matvec(s, GgmlType::F16, sh[0], sh[1], 0, 0, false);
    for (int i = 0; i < 5; ++i)
      bench_half_grouped(s, GgmlType::F16, shapes[i][0], shapes[i][1], with_norm[i], with_residual[i]);
    bench_half_grouped(s, GgmlType::BF16, 28672, 4096, true, false);
    return 0;
  }
  const int64_t shapes[3][2] = {{4096, 4096}, {14336, 4096}, {4096, 14336}};
  const GgmlType main_types[] = {GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::F16, GgmlType::BF16};
  const GgmlType more_types[] = {GgmlType::Q5_K, GgmlType::Q3_K, GgmlType::Q2_K, GgmlType::Q5_0,
                                 GgmlType::Q4_1, GgmlType::IQ4_NL, GgmlType::IQ4_XS, GgmlType::MXFP4};
  for (GgmlType t : main_types)
    for (const auto& sh : shapes) bench_matvec(s, t, sh[0], sh[1], 0, 0, quick, sh[0] == 14336);
  for (GgmlType t : more_types) bench_matvec(s, t, 14336, 4096, 0, 0, quick);
  // Tuning knobs: rows per warp x warps per row, on a big and a small (k/v projection) shape.
  for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q4_K})
    for (int64_t rows : {int64_t(4096), int64_t(1024)})
      for (int rpw : {1, 2})
        for (int wpr : {1, 2, 4}) bench_matvec(s, t, rows, 4096, rpw, wpr, quick);
  for (int rpw : {1, 2}) bench_matvec(s, GgmlType::F16, 4096, 4096, rpw, 0, quick);

  for (GgmlType t : {GgmlType::BF16, GgmlType::F16, GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K})
    for (const auto& sh : shapes) bench_gemm(s, blas, t, 512, sh[0], sh[1], quick);

  for (int n_seq : {1, 8})
    for (int ctx : {1024, 4096, 16384, 32768}) bench_attention(s, n_seq, ctx, quick);
  bench_small_ops(s);

  std::printf("\n== summary (%s) ==\n", prop.name);
  for (const Row& r : g_rows)
    std::printf("%-22s %-22s %-12s %9.2f us %8.1f %-7s %5.1f%%\n", r.kernel.c_str(), r.shape.c_str(), r.detail.c_str(), r.us,
                r.rate, r.unit.c_str(), r.pct);
  cublasDestroy(blas);
  cudaStreamDestroy(s);
  return 0;
}
