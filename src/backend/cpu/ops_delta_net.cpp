// The gated delta rule (GatedDeltaNet linear attention), the gated RMSNorm on its output,
// and the sigmoid gate of hybrid models.
//
// Per value head, with a state S[key][value] (head_dim_k x head_dim_v) per sequence:
//   S <- exp(g_t) S;   S <- S + k_t (x) b_t (v_t - S^T k_t);   o_t = S^T q_t
// Decode runs that recurrence token by token. Prefill runs it in chunks of C tokens (the
// formulation of HF transformers' torch_chunk_gated_delta_rule): inside a chunk, with
// G_i the cumulative log decay up to token i,
//   W = (I - A)^-1,  A_ij = -b_i (k_i . k_j) exp(G_i - G_j)  for j < i
//   u_i = sum_j W_ij b_j v_j,   w_i = sum_j W_ij b_j exp(G_j) k_j
//   v'_i = u_i - S^T w_i                        (what each token writes, given the chunk's start state)
//   o_i  = exp(G_i) S^T q_i + sum_{j<=i} (q_i . k_j) exp(G_i - G_j) v'_j
//   S    <- exp(G_last) S + sum_j exp(G_last - G_j) k_j (x) v'_j
// Both forms compute in double from the f32 state and agree to rounding (tested).
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/ops_delta_net.h"

namespace kiln::cpu {

std::vector<SequenceRun> sequence_runs(const BatchIndex& batch, int64_t n_tokens, int64_t n_state_rows,
                                       const char* op) {
  KILN_CHECK(batch.positions.dtype == GgmlType::I32 && batch.seq_rows.dtype == GgmlType::I32 &&
                 batch.positions.elements() == n_tokens && batch.seq_rows.elements() == n_tokens,
             "{}: the batch index describes {} tokens, the inputs have {}", op, batch.positions.elements(), n_tokens);
  const int32_t* pos = batch.positions.as<int32_t>();
  const int32_t* seq = batch.seq_rows.as<int32_t>();
  std::vector<SequenceRun> runs;
  for (int64_t t = 0; t < n_tokens; ++t) {
    KILN_CHECK(seq[t] >= 0 && seq[t] < n_state_rows && pos[t] >= 0,
               "{}: token {} (position {}) names sequence row {}, the state holds {}", op, t, pos[t], seq[t],
               n_state_rows);
    const bool continues = !runs.empty() && seq[t] == runs.back().seq_row && pos[t] == pos[t - 1] + 1;
    if (continues) {
      ++runs.back().n_tokens;
    } else {
      runs.push_back(SequenceRun{t, 1, seq[t], pos[t] == 0});
    }
  }
  return runs;
}

namespace delta_rule {

// The element of a per-head, per-token 3-D view {n0, n1, T} for head h (see backend.h).
inline float head_value(const Tensor& t, int64_t h, int64_t token) {
  const uint8_t* p = static_cast<const uint8_t*>(t.data) + size_t(h % t.ne[0]) * t.nb[0] +
                     size_t(h / t.ne[0]) * t.nb[1] + size_t(token) * t.nb[2];
  return *reinterpret_cast<const float*>(p);
}

// softplus as torch computes it (beta 1, threshold 20: linear above).
inline double softplus(double x) { return x > 20.0 ? x : std::log1p(std::exp(x)); }

// x <- x / sqrt(sum x^2 + eps)
inline void l2_normalize(double* x, int n, double eps) {
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += x[i] * x[i];
  const double inv = 1.0 / std::sqrt(sum + eps);
  for (int i = 0; i < n; ++i) x[i] *= inv;
}

inline double dot(const double* a, const double* b, int n) {
  double s = 0;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// Everything one value head needs for one run, read from the tensors.
struct HeadJob {
  const Tensor *q, *k, *v, *alpha, *beta;
  int64_t head;             // value head h
  double a, dt_bias;        // ssm_a[h], dt_bias[h]
  int64_t key_offset;       // offset of this head's key head in q and k rows
  int64_t value_offset;     // offset of this head in v and out rows
  int dk, dv;
  double l2_eps;
};

// Per-thread working memory, grown once and reused.
struct Scratch {
  std::vector<double> state;        // dk x dv
  std::vector<double> q, k, v;      // chunk rows (L x dk, L x dk, L x dv)
  std::vector<double> g, b, G;      // log decay, beta, cumulative log decay
  std::vector<double> W;            // L x L
  std::vector<double> u, w, v_new;  // L x dv, L x dk, L x dv
  std::vector<double> o;            // dv
};

// Reads token `t`'s normalized q (scaled), k, v, log decay and beta for the head.
void load_token(const HeadJob& job, int64_t t, double* q, double* k, double* v, double& g, double& b) {
  const float* qr = job.q->f32_row(t) + job.key_offset;
  const float* kr = job.k->f32_row(t) + job.key_offset;
  const float* vr = job.v->f32_row(t) + job.value_offset;
  for (int i = 0; i < job.dk; ++i) q[i] = qr[i], k[i] = kr[i];
  for (int j = 0; j < job.dv; ++j) v[j] = vr[j];
  l2_normalize(q, job.dk, job.l2_eps);
  l2_normalize(k, job.dk, job.l2_eps);
  const double scale = 1.0 / std::sqrt(double(job.dk));
  for (int i = 0; i < job.dk; ++i) q[i] *= scale;
  g = job.a * softplus(double(head_value(*job.alpha, job.head, t)) + job.dt_bias);
  b = 1.0 / (1.0 + std::exp(-double(head_value(*job.beta, job.head, t))));
}

// One token of the recurrence; writes o (dv).
void recurrent_step(double* S, const double* q, const double* k, const double* v, double g, double b, int dk, int dv,
                    double* o) {
  const double decay = std::exp(g);
  for (int i = 0; i < dk * dv; ++i) S[i] *= decay;
  // delta = b (v - S^T k)
  std::fill(o, o + dv, 0.0);
  for (int i = 0; i < dk; ++i)
    for (int j = 0; j < dv; ++j) o[j] += S[i * dv + j] * k[i];
  for (int j = 0; j < dv; ++j) o[j] = b * (v[j] - o[j]);
  for (int i = 0; i < dk; ++i)
    for (int j = 0; j < dv; ++j) S[i * dv + j] += k[i] * o[j];
  std::fill(o, o + dv, 0.0);
  for (int i = 0; i < dk; ++i)
    for (int j = 0; j < dv; ++j) o[j] += S[i * dv + j] * q[i];
}

// One chunk of L tokens (already loaded into the scratch rows); advances S, writes out rows.
void chunk_step(Scratch& s, int L, int dk, int dv, double* S, double* out /* L x dv */) {
  double* G = s.G.data();
  for (int i = 0; i < L; ++i) G[i] = (i ? G[i - 1] : 0.0) + s.g[size_t(i)];
  const double* q = s.q.data();
  const double* k = s.k.data();
  const double* v = s.v.data();
  const double* b = s.b.data();
  double* W = s.W.data();
  // W = (I - A)^-1 by forward substitution, row by row (W is unit lower triangular).
  for (int i = 0; i < L; ++i) {
    double* Wi = W + size_t(i) * L;
    std::fill(Wi, Wi + L, 0.0);
    // A_i. first, kept in Wi, then corrected with the rows above.
    for (int j = 0; j < i; ++j) Wi[j] = -b[i] * dot(k + size_t(i) * dk, k + size_t(j) * dk, dk) * std::exp(G[i] - G[j]);
    for (int j = 0; j < i; ++j) {
      double acc = Wi[j];
      for (int m = j + 1; m < i; ++m) acc += Wi[m] * W[size_t(m) * L + j];
      // Wi[m] for m > j still holds A_im: corrections only read entries right of j.
      Wi[j] = acc;
    }
    Wi[i] = 1.0;
  }
  // Note on the in-place loop above: entry j is finished using A_im (m > j), which are not
  // yet overwritten because j increases; this equals W_ij = A_ij + sum_{j<m<i} A_im W_mj.
  double* u = s.u.data();
  double* w = s.w.data();
  for (int i = 0; i < L; ++i) {
    double* ui = u + size_t(i) * dv;
    double* wi = w + size_t(i) * dk;
    std::fill(ui, ui + dv, 0.0);
    std::fill(wi, wi + dk, 0.0);
    for (int j = 0; j <= i; ++j) {
      const double c = W[size_t(i) * L + j] * b[j];
      const double ce = c * std::exp(G[j]);
      for (int d = 0; d < dv; ++d) ui[d] += c * v[size_t(j) * dv + d];
      for (int d = 0; d < dk; ++d) wi[d] += ce * k[size_t(j) * dk + d];
    }
  }
  double* vn = s.v_new.data();
  for (int i = 0; i < L; ++i) {
    double* vi = vn + size_t(i) * dv;
    const double* wi = w + size_t(i) * dk;
    for (int d = 0; d < dv; ++d) vi[d] = u[size_t(i) * dv + d];
    for (int a = 0; a < dk; ++a)
      for (int d = 0; d < dv; ++d) vi[d] -= wi[a] * S[size_t(a) * dv + d];
  }
  for (int i = 0; i < L; ++i) {
    double* oi = out + size_t(i) * dv;
    const double* qi = q + size_t(i) * dk;
    std::fill(oi, oi + dv, 0.0);
    for (int a = 0; a < dk; ++a)
      for (int d = 0; d < dv; ++d) oi[d] += qi[a] * S[size_t(a) * dv + d];
    const double ei = std::exp(G[i]);
    for (int d = 0; d < dv; ++d) oi[d] *= ei;
    for (int j = 0; j <= i; ++j) {
      const double c = dot(qi, k + size_t(j) * dk, dk) * std::exp(G[i] - G[j]);
      for (int d = 0; d < dv; ++d) oi[d] += c * vn[size_t(j) * dv + d];
    }
  }
  const double last = G[L - 1];
  const double e_last = std::exp(last);
  for (int a = 0; a < dk * dv; ++a) S[a] *= e_last;
  for (int j = 0; j < L; ++j) {
    const double c = std::exp(last - G[j]);
    for (int a = 0; a < dk; ++a) {
      const double ka = c * k[size_t(j) * dk + a];
      for (int d = 0; d < dv; ++d) S[size_t(a) * dv + d] += ka * vn[size_t(j) * dv + d];
    }
  }
}

void run_head(const HeadJob& job, const SequenceRun& run, int chunk_size, float* state_rows /* dk x dv */,
              const Tensor& out, Scratch& s) {
  const int dk = job.dk, dv = job.dv;
  s.state.resize(size_t(dk) * dv);
  double* S = s.state.data();
  for (int64_t i = 0; i < int64_t(dk) * dv; ++i) S[i] = run.starts_sequence ? 0.0 : double(state_rows[i]);

  const int C = chunk_size > 0 && run.n_tokens > 1 ? chunk_size : 1;
  s.q.resize(size_t(C) * dk), s.k.resize(size_t(C) * dk), s.v.resize(size_t(C) * dv);
  s.g.resize(size_t(C)), s.b.resize(size_t(C)), s.G.resize(size_t(C));
  s.o.resize(size_t(C) * dv);
  if (C > 1) {
    s.W.resize(size_t(C) * C), s.u.resize(size_t(C) * dv), s.w.resize(size_t(C) * dk), s.v_new.resize(size_t(C) * dv);
  }
  for (int64_t c0 = 0; c0 < run.n_tokens; c0 += C) {
    const int L = int(std::min<int64_t>(C, run.n_tokens - c0));
    for (int i = 0; i < L; ++i)
      load_token(job, run.first_token + c0 + i, &s.q[size_t(i) * dk], &s.k[size_t(i) * dk], &s.v[size_t(i) * dv],
                 s.g[size_t(i)], s.b[size_t(i)]);
    if (C == 1)
      recurrent_step(S, s.q.data(), s.k.data(), s.v.data(), s.g[0], s.b[0], dk, dv, s.o.data());
    else
      chunk_step(s, L, dk, dv, S, s.o.data());
    for (int i = 0; i < L; ++i) {
      float* o = out.f32_row(run.first_token + c0 + i) + job.value_offset;
      for (int d = 0; d < dv; ++d) o[d] = float(s.o[size_t(i) * dv + d]);
    }
  }
  for (int64_t i = 0; i < int64_t(dk) * dv; ++i) state_rows[i] = float(S[i]);
}

}  // namespace delta_rule

void gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& alpha, const Tensor& beta,
                      const Tensor& ssm_a, const Tensor& dt_bias, Tensor& state, const BatchIndex& batch,
                      const DeltaRuleParams& p, Tensor& out, ThreadPool& pool) {
  const char* op = "gated_delta_rule";
  for (const auto& [t, what] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}, {&alpha, "alpha"}, {&beta, "beta"},
                                {&ssm_a, "ssm_a"}, {&dt_bias, "dt_bias"}, {&state, "state"}, {&out, "out"}})
    require_f32_rows(*t, op, what);
  KILN_CHECK(p.n_k_heads > 0 && p.n_v_heads > 0 && p.n_v_heads % p.n_k_heads == 0 && p.head_dim_k > 0 &&
                 p.head_dim_v > 0 && p.chunk_size >= 0,
             "{}: {} value heads over {} key heads of {} / {} dims, chunk {}", op, p.n_v_heads, p.n_k_heads,
             p.head_dim_k, p.head_dim_v, p.chunk_size);
  const int64_t T = q.ne[1];
  const int64_t key_width = int64_t(p.n_k_heads) * p.head_dim_k, value_width = int64_t(p.n_v_heads) * p.head_dim_v;
  KILN_CHECK(q.ne[0] == key_width && k.ne[0] == key_width && v.ne[0] == value_width && out.ne[0] == value_width &&
                 k.ne[1] == T && v.ne[1] == T && out.ne[1] == T && q.ne[2] == 1 && k.ne[2] == 1 && v.ne[2] == 1,
             "{}: q {} k {} v {} out {} do not fit {} key heads of {} and {} value heads of {}", op, q.describe(),
             k.describe(), v.describe(), out.describe(), p.n_k_heads, p.head_dim_k, p.n_v_heads, p.head_dim_v);
  for (const Tensor* g : {&alpha, &beta})
    KILN_CHECK(g->ne[0] * g->ne[1] == p.n_v_heads && g->ne[2] == T && g->ne[3] == 1,
               "{}: {} {} is not a {{n0, n1, {}}} view of {} value heads", op, g->name, g->describe(), T, p.n_v_heads);
  KILN_CHECK(ssm_a.elements() == p.n_v_heads && dt_bias.elements() == p.n_v_heads,
             "{}: ssm_a {} / dt_bias {} hold {} / {} values for {} value heads", op, ssm_a.name, dt_bias.name,
             ssm_a.elements(), dt_bias.elements(), p.n_v_heads);
  KILN_CHECK(state.ne[0] == p.head_dim_v && state.ne[1] == p.head_dim_k && state.ne[2] == p.n_v_heads &&
                 state.is_contiguous(),
             "{}: state {} {} is not a contiguous {{{}, {}, {}, n_seqs}}", op, state.name, state.describe(),
             p.head_dim_v, p.head_dim_k, p.n_v_heads);
  const std::vector<SequenceRun> runs = sequence_runs(batch, T, state.ne[3], op);
  const int group = p.n_v_heads / p.n_k_heads;

  for (const SequenceRun& run : runs) {
    pool.parallel_for(p.n_v_heads, 1, [&](int64_t begin, int64_t end) {
      thread_local delta_rule::Scratch scratch;
      for (int64_t h = begin; h < end; ++h) {
        const int64_t key_head = p.tiled_heads ? h % p.n_k_heads : h / group;
        delta_rule::HeadJob job{&q, &k, &v, &alpha, &beta, h, double(ssm_a.as<float>()[h]),
                                double(dt_bias.as<float>()[h]), key_head * p.head_dim_k, h * p.head_dim_v,
                                p.head_dim_k, p.head_dim_v, double(p.l2_eps)};
        float* rows = reinterpret_cast<float*>(state.row_ptr(0, h, run.seq_row));
        delta_rule::run_head(job, run, p.chunk_size, rows, out, scratch);
      }
    });
  }
}

namespace gated_norm {

// Row r of a tensor of any rank (rows counted over dims 1..3).
inline float* row(const Tensor& t, int64_t r) {
  const int64_t i1 = r % t.ne[1], i2 = (r / t.ne[1]) % t.ne[2], i3 = r / (t.ne[1] * t.ne[2]);
  return reinterpret_cast<float*>(t.row_ptr(i1, i2, i3));
}

inline float silu(float x) { return x / (1.0f + std::exp(-x)); }

}  // namespace gated_norm

void rmsnorm_gated(const Tensor& x, const Tensor& z, const Tensor& weight, float eps, Tensor& out, ThreadPool& pool) {
  require_f32_rows(x, "rmsnorm_gated", "x");
  require_f32_rows(z, "rmsnorm_gated", "z");
  require_f32_rows(weight, "rmsnorm_gated", "weight");
  require_f32_rows(out, "rmsnorm_gated", "out");
  const int64_t n = x.ne[0];
  KILN_CHECK(z.ne[0] == n && out.ne[0] == n && z.rows() == x.rows() && out.rows() == x.rows() &&
                 weight.elements() == n,
             "rmsnorm_gated: x {} z {} out {} weight {} do not match", x.describe(), z.describe(), out.describe(),
             weight.describe());
  const float* w = weight.as<float>();
  pool.parallel_for(x.rows(), 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* a = gated_norm::row(x, r);
      const float* g = gated_norm::row(z, r);
      float* y = gated_norm::row(out, r);
      double sum_sq = 0;
      for (int64_t i = 0; i < n; ++i) sum_sq += double(a[i]) * a[i];
      const float inv = float(1.0 / std::sqrt(sum_sq / double(n) + double(eps)));
      for (int64_t i = 0; i < n; ++i) y[i] = a[i] * inv * w[i] * gated_norm::silu(g[i]);
    }
  });
}

void sigmoid_mul(const Tensor& x, const Tensor& gate, Tensor& out) {
  require_f32_rows(x, "sigmoid_mul", "x");
  require_f32_rows(gate, "sigmoid_mul", "gate");
  require_f32_rows(out, "sigmoid_mul", "out");
  const int64_t n = x.ne[0];
  const bool per_row = gate.ne[0] == 1 && n != 1;
  KILN_CHECK((gate.ne[0] == n || per_row) && gate.rows() == x.rows() && out.ne[0] == n && out.rows() == x.rows(),
             "sigmoid_mul: x {} gate {} out {} do not match", x.describe(), gate.describe(), out.describe());
  for (int64_t r = 0; r < x.rows(); ++r) {
    const float* a = gated_norm::row(x, r);
    const float* g = gated_norm::row(gate, r);
    float* y = gated_norm::row(out, r);
    for (int64_t i = 0; i < n; ++i) y[i] = a[i] / (1.0f + std::exp(-g[per_row ? 0 : i]));
  }
}

}  // namespace kiln::cpu

namespace kiln {

void CpuBackend::gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& alpha,
                                  const Tensor& beta, const Tensor& ssm_a, const Tensor& dt_bias, Tensor& state,
                                  const BatchIndex& batch, const DeltaRuleParams& params, Tensor& out) {
  cpu::gated_delta_rule(q, k, v, alpha, beta, ssm_a, dt_bias, state, batch, params, out, pool());
}
void CpuBackend::rmsnorm_gated(const Tensor& x, const Tensor& z, const Tensor& weight, float eps, Tensor& out) {
  cpu::rmsnorm_gated(x, z, weight, eps, out, pool());
}
void CpuBackend::sigmoid_mul(const Tensor& x, const Tensor& gate, Tensor& out) { cpu::sigmoid_mul(x, gate, out); }

}  // namespace kiln
