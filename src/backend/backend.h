#pragma once
// The operations a model's forward pass is made of, at the level of fused ops, and the
// memory they work on. Model code calls only this interface; each device implements it
// (backend/cpu, later backend/cuda). An op a backend lacks throws an Error naming the op
// and the backend; supports() answers "can you run this, and if not, why" up front.
//
// Conventions, chosen so that a GPU backend can record a whole decode step into one graph:
//   - every op writes into outputs the caller passes in (views of buffers allocated once);
//   - ops never read device data back to the host; the only host<->device traffic is
//     upload() of the batch description before the pass and download() of the logits after;
//   - activations are f32, laid out ne = {features, tokens}; weights are any ggml type;
//   - an output may alias an input only where the op says so.
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backend/tensor.h"

namespace kiln::gguf {
struct TensorInfo;
}

namespace kiln {

enum class Op : uint8_t {
  GetRows, RmsNorm, AddRmsNorm, Matmul, Rope, KvStore, Attention, Glu, Softmax, Add, Scale,
  SoftCap, MoeRoute, MoeFfn, Argmax,
  // hybrid (linear-attention) models, see the GatedDeltaNet section below
  CausalConvSilu, GatedDeltaRule, RmsNormGated, SigmoidMul,
};
std::string_view op_name(Op op);

// ---- parameters of the ops ----------------------------------------------------------

// Which elements rotate together: Normal pairs neighbours (x[2i], x[2i+1]) — llama's GGUF
// layout; Neox pairs the two halves (x[i], x[i + n_rot/2]) — qwen, gemma, HF layout.
enum class RopeStyle : uint8_t { Normal, Neox };

// YaRN context extension (ggml's formulation). ext_factor 0 leaves plain (scaled) rope.
struct YarnParams {
  float ext_factor = 0.0f;
  float attn_factor = 1.0f;  // multiplies sin and cos
  float beta_fast = 32.0f;
  float beta_slow = 1.0f;
  int n_ctx_orig = 0;        // training context the corrections refer to
  bool truncate = true;      // round the ramp's correction dims to whole dims (ggml, HF default)
};

struct RopeParams {
  RopeStyle style = RopeStyle::Normal;
  int n_rot = 0;                        // leading dims of each head that rotate; the rest pass
  float freq_base = 10000.0f;           // theta_i = pos * freq_base^(-2i/n_rot) ...
  float freq_scale = 1.0f;              // ... * freq_scale (linear position interpolation)
  const Tensor* freq_factors = nullptr; // ... / freq_factors[i]  (f32 [n_rot/2], Llama 3.1)
  YarnParams yarn;
};

struct AttentionParams {
  int n_head = 0, n_head_kv = 0;   // grouped-query: query head h reads kv head h / (n_head / n_head_kv)
  int head_dim_k = 0, head_dim_v = 0;
  float scale = 1.0f;              // scores = scale * q.k
  float softcap = 0.0f;            // > 0: scores = softcap * tanh(scores / softcap)
  int sliding_window = 0;          // > 0: a query at position p sees keys at p-window+1 .. p
  const Tensor* sinks = nullptr;   // f32 [n_head]: logit of a virtual key whose value is 0
};

// One layer's slice of the paged KV cache. Rows are slots: slot = block * block_size + i.
// k and v are both f32 or both f16; kv_store rounds to f16 (nearest even), and attention over
// an f16 cache rounds the query to f16 as well (see backend/cpu/ops_attention.cpp).
struct KvLayer {
  Tensor k;  // ne {n_head_kv * head_dim_k, n_slots}
  Tensor v;  // ne {n_head_kv * head_dim_v, n_slots}
  int block_size = 0;
};

// Where each token of a batch lives: all device tensors of I32, filled by upload().
struct BatchIndex {
  Tensor positions;     // [T]  position of token t in its sequence
  Tensor seq_rows;      // [T]  row of block_tables holding token t's sequence
  Tensor slots;         // [T]  cache slot that receives token t's K and V
  Tensor block_tables;  // [max_blocks, n_rows] physical block of each logical block
  int max_position = 0; // largest position in the batch (host-known; sizes GPU grids)
  // Host-known shape of the batch: every token of one sequence, at positions
  // first_position, first_position + 1, ... in batch order (a prompt chunk). Lets a backend
  // take whole tiles of queries against the same keys.
  bool one_sequence_in_order = false;
  int first_position = 0;
};

enum class Activation : uint8_t {
  Silu,       // silu(gate) * up
  GeluTanh,   // gelu_tanh(gate) * up
  SwigluOai,  // gpt-oss: clamp, gate * sigmoid(alpha * gate) * (up + 1)
};
struct GluParams {
  Activation act = Activation::Silu;
  float alpha = 1.702f;  // SwigluOai only
  float limit = 7.0f;    // SwigluOai only: gate <= limit, |up| <= limit
};

enum class MoeGating : uint8_t {
  Softmax,      // probabilities over all experts, then pick the top k
  Sigmoid,      // independent sigmoid per expert, then pick the top k
  SoftmaxTopK,  // pick the top k logits, then softmax over those k
};
struct MoeRouteParams {
  int n_used = 0;
  MoeGating gating = MoeGating::Softmax;
  bool normalize = false;                 // divide the k weights by their sum
  float scale = 1.0f;                     // then multiply by this
  const Tensor* selection_bias = nullptr; // f32 [n_expert], added for choosing only
};

// Stacked expert matrices: gate/up ne {n_embd, n_ff, n_expert}, down ne {n_ff, n_embd, n_expert};
// biases (optional, empty views when absent) ne {n_ff or n_embd, n_expert}.
struct ExpertWeights {
  Tensor gate, up, down;
  Tensor gate_bias, up_bias, down_bias;
};

// ---- GatedDeltaNet (linear attention of hybrid models: Qwen3-Next, Qwen3.5) ----------
// Recurrent layers keep per-sequence state on the device (runtime/recurrent_state.h):
// row s of a state tensor belongs to the sequence whose seq_rows entry is s. A token at
// position 0 starts its sequence afresh: the state it would read is taken as zero. The
// tokens of one sequence must appear in the batch in position order.

struct DeltaRuleParams {
  int n_k_heads = 0, n_v_heads = 0;  // n_v_heads is a multiple of n_k_heads
  int head_dim_k = 0, head_dim_v = 0;
  // Which key head value head h reads: h % n_k_heads when tiled (llama.cpp's Qwen3.5
  // files reorder the value heads so), else h / (n_v_heads / n_k_heads) (HF order).
  bool tiled_heads = false;
  float l2_eps = 1e-6f;              // q, k <- x / sqrt(sum x^2 + l2_eps)
  int chunk_size = 64;               // prefill in chunks of this many tokens; 0: token by token
};

// ---- memory ---------------------------------------------------------------------------

// Device memory owned by whoever holds the Buffer.
class Buffer {
 public:
  virtual ~Buffer() = default;
  void* data() const { return data_; }
  size_t size() const { return size_; }
  Device device() const { return device_; }
  // A contiguous tensor at byte `offset` of this buffer.
  Tensor view(GgmlType dtype, std::initializer_list<int64_t> shape, size_t offset = 0,
              std::string_view name = {}) const;

 protected:
  void* data_ = nullptr;
  size_t size_ = 0;
  Device device_ = Device::Cpu;
};

// ---- the backend ----------------------------------------------------------------------

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  virtual Device device() const = 0;

  // nullopt when `op` can run with these weight/cache types here, else the reason.
  virtual std::optional<std::string> supports(Op op, std::span<const GgmlType> types) const;

  // Memory. allocate() is for long-lived buffers (scratch, KV cache): call it up front,
  // never per token.
  virtual std::unique_ptr<Buffer> allocate(size_t bytes) = 0;
  // A model weight on this device. CPU: a view into the mapped file, no copy.
  virtual Tensor weight(const gguf::TensorInfo& info) = 0;
  // Weights that one input is multiplied with (a layer's q/k/v, gate/up), in one allocation
  // one after the other where the backend can, so that a product over all of them can read
  // them as one matrix (see prefers_joined_parts). The default loads each with weight().
  virtual std::vector<Tensor> weights_side_by_side(std::span<const gguf::TensorInfo* const> infos);
  // A weight derived at load time from host data (e.g. a repacked or adjusted tensor); the
  // backend keeps it for its lifetime.
  virtual Tensor owned_weight(const Tensor& host_source, std::string_view name) = 0;
  virtual void upload(const void* host, const Tensor& dst, size_t bytes) = 0;
  virtual void download(const Tensor& src, void* host, size_t bytes) = 0;
  virtual void synchronize() {}
  // A download that does not wait: the copy is queued behind the ops recorded so far, and
  // finish_download() waits for it and hands the bytes over. Meant for a few bytes per step
  // (sampled tokens), so that the host can queue the next step before this one is done.
  // Tickets complete in order; at most kMaxPendingDownloads may be unfinished at once.
  static constexpr int kMaxPendingDownloads = 8;
  static constexpr size_t kMaxAsyncDownloadBytes = 4096;
  virtual uint64_t download_async(const Tensor& src, size_t bytes);
  virtual void finish_download(uint64_t ticket, void* host, size_t bytes);

  // Ops. Shapes are written ne-innermost-first; T = tokens in the batch.

  // out[t] = table[ids[t]] as f32. table: any type ne {D, V}; ids: I32 [T]; out: {D, T}.
  virtual void get_rows(const Tensor& table, const Tensor& ids, Tensor& out);
  // out = x / rms(x) * weight, per row. weight f32 [D] or empty (no scale). out may be x.
  virtual void rmsnorm(const Tensor& x, const Tensor& weight, float eps, Tensor& out);
  // Fused residual: residual += x; out = rmsnorm(residual) * weight.
  virtual void add_rmsnorm(const Tensor& x, Tensor& residual, const Tensor& weight, float eps, Tensor& out);
  // out = x @ w^T (+ bias). x f32 {K, T}; w any type {K, N}; bias f32 [N] or empty; out {N, T}.
  virtual void matmul(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& out);
  // Several products of one input: *outs[i] = x @ ws[i]^T (+ biases[i]), for q/k/v or
  // gate/up. A backend may run them as one launch (CUDA decode does); the default
  // (backend_fused.cpp) calls matmul() for each. Biases may be empty tensors.
  struct MatmulPart {
    const Tensor* w = nullptr;
    const Tensor* bias = nullptr;
    Tensor* out = nullptr;
  };
  virtual void matmul_parts(const Tensor& x, std::span<const MatmulPart> parts);
  // A pre-norm block's products: normed = rmsnorm(x) * norm_weight, then matmul_parts(normed,
  // parts). normed is always written (later ops may read it). A backend may compute the
  // norm inside the products' kernel (CUDA decode does); the default runs the two ops.
  virtual void rmsnorm_matmul_parts(const Tensor& x, const Tensor& norm_weight, float eps, Tensor& normed,
                                    std::span<const MatmulPart> parts);
  // Whether matmul_parts over `tokens` rows runs faster when the parts' outputs are
  // neighbouring column ranges of one buffer (views sharing one row stride, part i right
  // after part i-1): a backend can then run parts whose weights lie side by side as one
  // product. Every op takes either layout; this is only a preference. Default: no.
  virtual bool prefers_joined_parts(int64_t tokens) const;
  // A product added to a residual stream: out = x @ w^T (+ bias), then residual += out.
  // out and residual {N, T}, distinct. Default: matmul() then add().
  virtual void matmul_add(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& out, Tensor& residual);
  // Rotates x {head_dim, n_heads, T} in place by the positions [T].
  virtual void rope(Tensor& x, const Tensor& positions, const RopeParams& params);
  // Writes k {n_head_kv*head_dim_k, T} and v into the cache slots of the batch.
  virtual void kv_store(const Tensor& k, const Tensor& v, KvLayer& cache, const Tensor& slots);
  // rope on q and k (heads as rows, {head_dim, heads, T}, in place) with the same positions
  // and parameters, then kv_store of k (as rows {heads * head_dim, T}) and v. A backend may
  // do all three in one pass (CUDA does); the default runs rope, rope, kv_store.
  virtual void rope_kv_store(Tensor& q_heads, Tensor& k_heads, const Tensor& v, const Tensor& positions,
                             const RopeParams& params, KvLayer& cache, const Tensor& slots);
  // The same after per-head RMS norms of q and k (Qwen3's: weights f32 [head_dim], either may
  // be empty for none). The default runs rmsnorm on the heads, then rope_kv_store. A backend
  // may instead do it all inside the attention over q right after (CUDA decode of one token):
  // q_heads and k_heads then keep their raw values, so a caller that reads them afterwards
  // (a debug hook) runs rmsnorm and rope_kv_store itself.
  virtual void norm_rope_kv_store(Tensor& q_heads, Tensor& k_heads, const Tensor& v, const Tensor& q_norm,
                                  const Tensor& k_norm, float eps, const Tensor& positions, const RopeParams& params,
                                  KvLayer& cache, const Tensor& slots);
  // Causal attention of q {n_head*head_dim_k, T} over the cache; out {n_head*head_dim_v, T}.
  virtual void attention(const Tensor& q, const KvLayer& cache, const BatchIndex& batch,
                         const AttentionParams& params, Tensor& out);
  // out = act(gate) * up, elementwise. out may be gate.
  virtual void glu(const Tensor& gate, const Tensor& up, const GluParams& params, Tensor& out);
  // A gated FFN's tail: act = glu(gate, up), then matmul_add(act, w, bias, out, residual).
  // act may be gate. A backend may hand the glu's values to the product in the product's own
  // input format without writing act (CUDA prefill does): act's contents afterwards are
  // unspecified, so callers that read it (a debug hook) run the two ops. Default: the two ops.
  virtual void glu_matmul_add(const Tensor& gate, const Tensor& up, const GluParams& params, Tensor& act,
                              const Tensor& w, const Tensor& bias, Tensor& out, Tensor& residual);
  // Row-wise softmax. out may be x.
  virtual void softmax(const Tensor& x, Tensor& out);
  // out = a + b (same shapes; b may also be a single row broadcast over a's rows). out may alias.
  virtual void add(const Tensor& a, const Tensor& b, Tensor& out);
  virtual void scale(const Tensor& x, float factor, Tensor& out);
  // out = cap * tanh(x / cap).
  virtual void softcap(const Tensor& x, float cap, Tensor& out);
  // Picks experts: logits f32 {E, T} -> ids I32 {k, T}, weights f32 {k, T}.
  virtual void moe_route(const Tensor& logits, const MoeRouteParams& params, Tensor& ids, Tensor& weights);
  // A MoE layer's front: normed = rmsnorm(x) * norm_weight, logits = router · normed (+ bias,
  // router {D, E}), then moe_route. The default runs rmsnorm, matmul, moe_route; a backend
  // may run them as one kernel (CUDA decode does). normed must not alias x.
  virtual void rmsnorm_moe_route(const Tensor& x, const Tensor& norm_weight, float eps, Tensor& normed,
                                 const Tensor& router, const Tensor& router_bias, const MoeRouteParams& params,
                                 Tensor& logits, Tensor& ids, Tensor& weights);
  // out[t] = sum_j weights[t][j] * FFN_{ids[t][j]}(x[t]). x, out f32 {D, T}.
  virtual void moe_ffn(const Tensor& x, const ExpertWeights& experts, const Tensor& ids, const Tensor& weights,
                       const GluParams& act, Tensor& out);
  // The same, then residual += out (the residual stream; distinct from x and out). A backend
  // may add inside the experts' last kernel (CUDA decode does); the default runs moe_ffn, add.
  virtual void moe_ffn_add(const Tensor& x, const ExpertWeights& experts, const Tensor& ids, const Tensor& weights,
                           const GluParams& act, Tensor& out, Tensor& residual);
  // out[t] = index of the largest element of row t. x f32 {N, T}; out I32 [T].
  virtual void argmax(const Tensor& x, Tensor& out);

  // -- GatedDeltaNet ops (see the section above) --
  // Causal depthwise convolution along each sequence, then SiLU:
  //   out[c, t] = silu(sum_j weight[j, c] * x[c, t - K + 1 + j]),
  // where inputs before the batch come from `state`, which is then advanced.
  // x f32 {C, T} (rows may be a strided view); weight f32 {K, C}; state f32 {K-1, C, n_seqs}
  // holding each channel's last K-1 inputs, oldest first; out f32 {C, T}.
  virtual void causal_conv_silu(const Tensor& x, const Tensor& weight, Tensor& state, const BatchIndex& batch,
                                Tensor& out);
  // The gated delta rule, per value head h with key head kh (DeltaRuleParams):
  //   q <- l2norm(q) / sqrt(head_dim_k), k <- l2norm(k)
  //   decay = exp(ssm_a[h] * softplus(alpha + dt_bias[h])), b = sigmoid(beta)
  //   S <- decay * S;  S <- S + k (x) b * (v - S^T k);  out = S^T q
  // q, k f32 {head_dim_k * n_k_heads, T}, v f32 {head_dim_v * n_v_heads, T} (rows may be
  // strided views); alpha, beta: per value head logits as 3-D views {n0, n1, T} with
  // n0 * n1 = n_v_heads, head h at (h % n0, h / n0); ssm_a (= -exp(A_log)) and dt_bias
  // f32 [n_v_heads]; state f32 {head_dim_v, head_dim_k, n_v_heads, n_seqs} (S[key][value]);
  // out f32 {head_dim_v * n_v_heads, T}.
  virtual void gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& alpha,
                                const Tensor& beta, const Tensor& ssm_a, const Tensor& dt_bias, Tensor& state,
                                const BatchIndex& batch, const DeltaRuleParams& params, Tensor& out);
  // out = rmsnorm(x) * weight * silu(z), per row of ne[0]. weight f32 [ne0]. out may be x.
  virtual void rmsnorm_gated(const Tensor& x, const Tensor& z, const Tensor& weight, float eps, Tensor& out);
  // out = x * sigmoid(gate): gate of x's shape, or one value per row (ne[0] == 1). out may be x.
  virtual void sigmoid_mul(const Tensor& x, const Tensor& gate, Tensor& out);

 protected:
  [[noreturn]] void unsupported(Op op) const;

 private:
  // download_async() of backends whose download() completes at once (the CPU): the bytes
  // are copied when asked for and kept here until finish_download().
  struct HostCopy {
    uint64_t ticket = 0;
    std::vector<uint8_t> bytes;
  };
  std::vector<HostCopy> host_copies_;
  uint64_t next_ticket_ = 1;
};

}  // namespace kiln
