#pragma once
// The CUDA backend: backend/backend.h on one NVIDIA GPU.
//
//   - Weights are uploaded once, at load, in their GGUF block layout, through a pinned
//     staging buffer in chunks (progress reported through CudaOptions::progress).
//   - KV cache, recurrent state and scratch are device buffers allocated up front.
//   - Ops go to the kernel library (matvec / gemm / ops / attention / dequant) or to the
//     backend's own kernels (ops_extra.h). Decode passes are recorded and replayed as CUDA
//     graphs (graph.h); prefill runs eagerly.
//   - Exact mode: no int8 activations and no bf16 rounding — every matmul dequantizes its
//     weights to f32 and runs an f32 product, so logits follow the CPU backend to ~1e-6.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/graph.h"
#include "backend/cuda/layout_roles.h"
#include "backend/cuda/matvec_grouped.h"
#include "backend/cuda/moe.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/rope_store.h"
#include "backend/cuda/step_io.h"

namespace kiln {

struct CudaOptions {
  int device = 0;
  bool exact = false;        // f32 everywhere (see above)
  bool graphs = true;        // capture and replay decode passes
  int graph_max_tokens = 8;  // passes of at most this many tokens are graphed
  // Fused decode paths: matmul_parts as one launch, int8 copies written by rmsnorm / glu.
  // The environment's KILN_CUDA_FUSED=0 turns them off (to measure what they save).
  bool fused = true;
  // q4_K and q6_K parts of one rmsnorm_matmul_parts (a Q4_K_M layer's q/k/v) as one launch
  // that can take rope_kv_store into its epilogue; else one launch per type. The
  // environment's KILN_CUDA_MIXED_PARTS=0 turns it off (to measure what it saves).
  bool mixed_parts = true;
  // Prefill: q/k/v and gate/up outputs as column ranges of one buffer, and the products of
  // weights loaded side by side as one (cuda_backend_prefill.cpp). The environment's
  // KILN_CUDA_PREFILL_JOIN=0 turns it off (to measure what it saves).
  bool joined_parts = true;
  // Prefill: glu_matmul_add's glu writes the down product's half-precision input (no f32
  // activation written and read back). KILN_CUDA_PREFILL_GLU_HALF=0 runs glu + matmul_add.
  bool glu_half_input = true;
  // Prefill: the norms before q/k/v and gate/up and the attention before o also write their
  // output rounded for the product after them, which then skips its own rounding pass
  // (CudaBackend::PendingHalfSource). KILN_CUDA_PREFILL_HALF_COPY=0 turns it off.
  bool half_copies = true;
  // f16 / bf16 decode: which ops run in the epilogue of the grouped products before them
  // (matvec_f16_pairs.cu), bits of kHalfEpilogueRope (rope + cache store after q/k/v) and
  // kHalfEpilogueGlu (glu after gate/up). KILN_CUDA_HALF_EPILOGUE=N (0..3) sets it, 0: none.
  static constexpr int kHalfEpilogueRope = 1, kHalfEpilogueGlu = 2;
  int half_epilogues = kHalfEpilogueRope | kHalfEpilogueGlu;
  // q4_0 / q8_0 / q4_K / q6_K decode: glu after gate/up products over f32 x (the norm inside)
  // in their launch, which also writes the activation's int8 copy for the down product
  // (matvec_grouped_glu.cu): the kernel's copy stages per warp (2 or 1), or 0: the glu as
  // its own kernel. KILN_CUDA_GLU_EPILOGUE_Q8=N (0..2) sets it.
  int int8_glu_epilogue = 2;
  // q4_0 / q8_0 weights are permuted at load into the warp-interleaved layout that the decode
  // products load straight into registers (decode_layout.h; prefill's dequantization and
  // get_rows read it too). KILN_CUDA_INTERLEAVED=0 keeps the block layout.
  bool interleaved_decode = true;
  // Which q4_K and q6_K matrices take it too, by role (layout_roles.h). q4_K: gate / up only.
  // Measured (docs/perf-notes.md, round 18), ms a step, none / gate_up / all: Llama-3-8B Q4_K_M
  // 1.883 / 1.876 / 1.936; an all-q4_K Llama-3-8B 1.708 / 1.684 / 1.680; Qwen3-30B-A3B Q4_K_M
  // (no q4_K gate / up outside the experts) 1.964 / - / 1.982. q6_K (rows of a multiple of
  // 2048 weights): every product but the head and the other matrices; round 19, ms a step:
  // Llama-3-8B Q4_K_M (q6_K: half the layers' down and v, and the head) none 1.880, down
  // 1.870, down + qkv 1.870, down + head 1.889; an all-q6_K Llama-3-8B none 2.417, down 2.331,
  // gate_up + down + qkv + o 2.145, all 2.136. KILN_CUDA_INTERLEAVED_Q4K / _Q6K = none, all,
  // or roles joined by ',' (gate_up, down, qkv, o, head, other) set them.
  unsigned interleaved_q4_k = cuda::kLayoutGateUp;
  unsigned interleaved_q6_k = cuda::kLayoutGateUp | cuda::kLayoutDown | cuda::kLayoutQkv | cuda::kLayoutO;
  // Only matrices of rows at least this wide: rows of at most 8 groups (2048 weights) run on
  // 8 lanes a row, which read the layout slower than the copy stages (docs/perf-notes.md).
  int64_t interleaved_min_cols = 2304;
  // Stacked q4_K / q6_K experts (ffn_*_exps of rows a multiple of 32) are permuted at load into
  // the row-tile layout that the MoE decode kernels load straight into registers
  // (expert_tiles.h; the prefill GEMM reads it too). Not with `exact` (its f32 kernels read
  // blocks). KILN_CUDA_EXPERT_TILES=0 keeps the block layout. Measured (docs/perf-notes.md,
  // round 26), Qwen3-30B-A3B Q4_K_M: 1.7502 -> 1.6697 ms a decode step; pp512 -6.4%.
  bool expert_tiles = true;
  // A decode step of one token over experts in that layout folds the MoE front (norm, router,
  // routing) into its neighbours: the attention output product adds each expert's router sum
  // (matvec_grouped.h's RouterSums) and the experts' gate / up kernel routes from them
  // (moe.h's MoeFoldedFront), one launch fewer a layer. KILN_CUDA_MOE_FOLD_FRONT=0 keeps the
  // front's own launch.
  bool fold_moe_front = true;
  // Small per-pass uploads and download_async() as kernels inside the pass's graph, through
  // mapped host memory (step_io.h), instead of copies on the stream between two graphs.
  // KILN_CUDA_STEP_IO=0 turns it off (to measure what it saves).
  bool step_io_in_graph = true;
  // Called after each uploaded chunk of weights with the bytes uploaded so far.
  std::function<void(size_t uploaded_bytes)> progress;
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const CudaOptions& options = {});
  ~CudaBackend() override;

  std::string_view name() const override { return "cuda"; }
  Device device() const override { return Device::Cuda; }
  std::optional<std::string> supports(Op op, std::span<const GgmlType> types) const override;
  const CudaOptions& options() const { return options_; }
  cudaStream_t stream() const { return stream_; }
  const cuda::StepGraphs& graphs() const { return *graphs_; }
  size_t weight_bytes() const { return weight_bytes_; }
  // Expert stacks permuted into the row-tile layout at load (CudaOptions::expert_tiles).
  size_t tiled_expert_stacks() const { return tiled_experts_.size(); }
  // Ops recorded so far, a fused group counting once (tests see whether a fusion happened).
  int64_t recorded_ops() const { return recorded_ops_; }
  // Products that read a half copy their input's producer wrote (CudaOptions::half_copies).
  int64_t half_copies_taken() const { return half_copies_taken_; }

  std::unique_ptr<Buffer> allocate(size_t bytes) override;
  Tensor weight(const gguf::TensorInfo& info) override;
  std::vector<Tensor> weights_side_by_side(std::span<const gguf::TensorInfo* const> infos) override;
  Tensor owned_weight(const Tensor& host_source, std::string_view name) override;
  void upload(const void* host, const Tensor& dst, size_t bytes) override;
  void download(const Tensor& src, void* host, size_t bytes) override;
  uint64_t download_async(const Tensor& src, size_t bytes) override;
  void finish_download(uint64_t ticket, void* host, size_t bytes) override;
  void synchronize() override;

  void get_rows(const Tensor& table, const Tensor& ids, Tensor& out) override;
  void rmsnorm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) override;
  void add_rmsnorm(const Tensor& x, Tensor& residual, const Tensor& weight, float eps, Tensor& out) override;
  void matmul(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& out) override;
  void matmul_parts(const Tensor& x, std::span<const MatmulPart> parts) override;
  void rmsnorm_matmul_parts(const Tensor& x, const Tensor& norm_weight, float eps, Tensor& normed,
                            std::span<const MatmulPart> parts) override;
  void matmul_add(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& out, Tensor& residual) override;
  // Prefill batches (cuda_backend_prefill.cpp): parts of neighbouring outputs over weights
  // side by side run as one product.
  bool prefers_joined_parts(int64_t tokens) const override;
  void rope(Tensor& x, const Tensor& positions, const RopeParams& params) override;
  void kv_store(const Tensor& k, const Tensor& v, KvLayer& cache, const Tensor& slots) override;
  void rope_kv_store(Tensor& q_heads, Tensor& k_heads, const Tensor& v, const Tensor& positions,
                     const RopeParams& params, KvLayer& cache, const Tensor& slots) override;
  void norm_rope_kv_store(Tensor& q_heads, Tensor& k_heads, const Tensor& v, const Tensor& q_norm,
                          const Tensor& k_norm, float eps, const Tensor& positions, const RopeParams& params,
                          KvLayer& cache, const Tensor& slots) override;
  void attention(const Tensor& q, const KvLayer& cache, const BatchIndex& batch, const AttentionParams& params,
                 Tensor& out) override;
  void glu(const Tensor& gate, const Tensor& up, const GluParams& params, Tensor& out) override;
  // Prefill (cuda_backend_prefill.cpp): the glu writes the product's rounded input itself.
  void glu_matmul_add(const Tensor& gate, const Tensor& up, const GluParams& params, Tensor& act, const Tensor& w,
                      const Tensor& bias, Tensor& out, Tensor& residual) override;
  void softmax(const Tensor& x, Tensor& out) override;
  void add(const Tensor& a, const Tensor& b, Tensor& out) override;
  void scale(const Tensor& x, float factor, Tensor& out) override;
  void softcap(const Tensor& x, float cap, Tensor& out) override;
  void moe_route(const Tensor& logits, const MoeRouteParams& params, Tensor& ids, Tensor& weights) override;
  void rmsnorm_moe_route(const Tensor& x, const Tensor& norm_weight, float eps, Tensor& normed, const Tensor& router,
                         const Tensor& router_bias, const MoeRouteParams& params, Tensor& logits, Tensor& ids,
                         Tensor& weights) override;
  void moe_ffn(const Tensor& x, const ExpertWeights& experts, const Tensor& ids, const Tensor& weights,
               const GluParams& act, Tensor& out) override;
  void moe_ffn_add(const Tensor& x, const ExpertWeights& experts, const Tensor& ids, const Tensor& weights,
                   const GluParams& act, Tensor& out, Tensor& residual) override;
  void argmax(const Tensor& x, Tensor& out) override;
  void causal_conv_silu(const Tensor& x, const Tensor& weight, Tensor& state, const BatchIndex& batch,
                        Tensor& out) override;
  void gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& alpha, const Tensor& beta,
                        const Tensor& ssm_a, const Tensor& dt_bias, Tensor& state, const BatchIndex& batch,
                        const DeltaRuleParams& params, Tensor& out) override;
  void rmsnorm_gated(const Tensor& x, const Tensor& z, const Tensor& weight, float eps, Tensor& out) override;
  void sigmoid_mul(const Tensor& x, const Tensor& gate, Tensor& out) override;

 private:
  // A device region that only grows; earlier regions stay alive because captured graphs
  // may still point at them.
  struct Scratch {
    void* data = nullptr;
    size_t bytes = 0;
  };
  void* scratch(Scratch& s, size_t bytes);
  // Host -> device through the pinned staging buffer (weights: chunked, synchronous).
  void stage_upload(const void* host, void* dst, size_t bytes);
  // Whether an uploaded weight takes the interleaved layout (decode_layout.h; with
  // options_.interleaved_decode), and its permutation into it, registered until the backend is
  // destroyed.
  bool can_interleave(const Tensor& weight) const;
  void interleave(const Tensor& weight);
  // Whether an uploaded weight is a stack of experts that takes the row-tile layout
  // (expert_tiles.h; with options_.expert_tiles), and its permutation into it, remembered in
  // tiled_experts_ for the MoE launches.
  bool can_tile_experts(const Tensor& weight) const;
  void tile_experts(const Tensor& weight);
  bool has_expert_tiles(const Tensor& w) const;
  void record(const cuda::SignatureHash& sig, int64_t tokens, cuda::StepGraphs::Launch launch, const char* op);
  void matmul_exact(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& out);
  // The grouped-matvec launches of matmul_parts / matmul_add (cuda_backend_fused.cpp), one per
  // weight type; with `residual`, the one part's output is also added to it.
  void record_grouped(const Tensor& x, std::span<const MatmulPart> parts, Tensor* residual);
  // A matmul_add that runs as a plain product leaves its residual add pending: the next
  // rmsnorm of that residual takes it in as one add_rmsnorm (prefill, and float weights in
  // decode, keep the fused add-and-norm they had before the products took the adds). Any
  // other recorded op, upload or download records the add first.
  struct PendingAdd {
    Tensor out, residual;
  };
  std::optional<PendingAdd> pending_add_;
  // An argmax is held back the same way: if the next call downloads its output
  // (download_async, a greedy step's token), the argmax kernel writes it into the step slot
  // itself (step_io.h) instead of a copy kernel after it.
  struct PendingArgmax {
    const float* x = nullptr;
    int64_t stride = 0, rows = 0, n = 0;
    int32_t* out = nullptr;
    void* scratch = nullptr;
    size_t scratch_bytes = 0;
    cuda::SignatureHash sig;
  };
  std::optional<PendingArgmax> pending_argmax_;
  // Records the held argmax (and lets it go), with its host copy at `host_out` if set.
  void record_held_argmax(int32_t* host_out);
  void defer_add(const Tensor& out, Tensor& residual);
  // A decode launch of two or three grouped products (q/k/v, gate/up) is held back the same
  // way, because the op right after it may run in its epilogue (cuda_backend_fused.cpp):
  // rope_kv_store after q/k/v (the rotation and the cache store), and glu after gate/up
  // (f16 / bf16 weights; int8 weights over f32 x, which also write the activation's int8
  // copy), one kernel fewer each.
  // pending_products_take says whether the held launch's outputs are `outs`, in order, and
  // whether it can take `ep`; fuse_into_pending_products then records it with that epilogue
  // (which may write only the products' outputs, the cache and the glu's output). `after`:
  // the int8 copy of x the launch leaves (or none); `half_input`: set for a launch of the
  // f16 / bf16 kernel, its f32 input (token 0's); `int8_over_f32`: a launch of one int8
  // weight type over f32 x (which may take the glu).
  struct PendingProducts;
  struct QuantizedInput;  // below
  // A product that adds into the residual stream (matmul_add of one token over int8 x: the
  // attention output) is held too, with options_.fold_moe_front: an MoE front right after it
  // may fold into it and the experts after (cuda_backend_moe.cpp).
  std::shared_ptr<PendingProducts> pending_products_;
  using ProductsLaunch = std::function<cuda::Status(cudaStream_t, const cuda::PairEpilogue&)>;
  void defer_products(const cuda::SignatureHash& sig, int64_t tokens, std::span<const MatmulPart> parts,
                      int64_t cols, ProductsLaunch launch, const QuantizedInput& after, const char* op,
                      const cuda::F32Input* half_input = nullptr, bool int8_over_f32 = false);
  bool pending_products_take(std::span<const Tensor* const> outs, const cuda::PairEpilogue& ep) const;
  void fuse_into_pending_products(const cuda::PairEpilogue& ep, const cuda::SignatureHash& sig, const char* op);
  void flush_pending_products();
  // glu right after held gate/up products (f16 / bf16, or int8 over f32 x), written over
  // gate's or up's rows: true where it went into their epilogue (recorded), false where
  // nothing was recorded.
  bool fuse_glu_into_products(const Tensor& gate, const Tensor& up, const cuda::GluArgs& glu,
                              const cuda::SignatureHash& sig);
  // Records the held launch with `ep`; with `fused_sig`, its signature extended by that.
  void record_held_products(const cuda::PairEpilogue& ep, const cuda::SignatureHash* fused_sig, const char* op);
  // A decode norm_rope_kv_store of one token (q/k head norms, rope, cache store) is held
  // back as well: the decode attention right after it, over the same q, cache, positions and
  // slots, does its work inside its own kernel (DecodeNewToken, attention.h), one launch
  // fewer. KILN_CUDA_ATTN_HEAD_NORM=0 turns it off. Any other op records it as it is.
  struct PendingHeadNorms {
    cuda::SignatureHash sig;
    cuda::RopeArgs q, k;
    cuda::KvStoreArgs store;
    const float* angles = nullptr;
    cuda::HeadNorms norms;
  };
  std::optional<PendingHeadNorms> pending_head_norms_;
  void hold_head_norms(const PendingHeadNorms& held);
  void flush_pending_head_norms();
  // The held head norms if they are those of this decode attention's token (q, cache,
  // positions, slot, shapes); else null.
  const PendingHeadNorms* held_head_norms_of(const Tensor& q, const KvLayer& cache, const BatchIndex& batch,
                                             const AttentionParams& params) const;
  // rmsnorm_moe_route held back the same way behind a held matmul_add of its x (a decode step of
  // one token): if moe_ffn_add over its output, ids and weights follows, the front folds into
  // the held product and the experts' kernels (MoeFoldedFront) and is never launched; any other
  // op records it as it is (after the product).
  struct PendingFront {
    cuda::MoeNormRouteArgs args;
    cuda::SignatureHash sig;
    Tensor router;
  };
  std::optional<PendingFront> pending_front_;
  // Prefill (options_.half_copies): an op whose f32 output is often the next product's input
  // (a norm before q/k/v or gate/up, the attention before o) is held back the same way. If
  // the next op is a product over exactly that output with f16, bf16 or quantized weights, the
  // held op is recorded also writing the output rounded to the product's half type (gemm.h's
  // x_half: the bits the product's own rounding would give) and the product reads that copy,
  // one pass over the activation fewer; any other op records the held one as it was.
  struct PendingHalfSource {
    cuda::SignatureHash sig;
    int64_t tokens = 0;
    const char* op = nullptr;
    const float* out = nullptr;  // the f32 output: rows of cols, stride apart
    int64_t cols = 0, rows = 0, stride = 0;
    std::function<cuda::Status(cudaStream_t, void* half, bool bf16)> launch;  // half null: no copy
  };
  std::optional<PendingHalfSource> pending_half_source_;
  bool holds_half_sources(int64_t tokens) const;
  // A norm's launch: held as a half source where it can be one (false), else recorded (true).
  bool record_norm(const cuda::RmsNormArgs& a, const cuda::SignatureHash& sig, int64_t tokens, const char* op);
  void hold_half_source(PendingHalfSource held);
  // Records the held source (if any): with a copy for weights of `weight_type`, which it
  // returns, where its output is x (cols x rows, stride apart); else as it was, returning null.
  const void* record_half_source_for(const float* x, int64_t cols, int64_t rows, int64_t stride,
                                     GgmlType weight_type);
  void record_front(const PendingFront& front);  // its launch, and its int8 copy remembered
  // The fold, where moe_ffn's arguments `a` take it: the held product recorded with the router
  // sums, a.front set. False: nothing done.
  bool fold_pending_front(cuda::MoeFfnArgs& a);
  // The held product's residual where it is a matmul_add that can take the router sums (one
  // token, one part over int8 x), with its width; else null.
  const float* held_residual_add(int64_t* cols) const;
  // What the fold keeps per router (by its data): its sums (kRouterSumsMaxExperts doubles,
  // zeroed at allocation; each fold's product sets the sums of the fold recorded before it back
  // to zero: last_router_sums_), and the router transposed ([n_embd][n_expert] f32), made on the
  // stream once a fold of it is sure to be recorded.
  struct FoldedRouter {
    const void* data = nullptr;
    std::unique_ptr<Buffer> sums, transposed;
  };
  std::vector<FoldedRouter> folded_routers_;
  FoldedRouter& folded_router(const Tensor& router);
  const float* transposed_router(FoldedRouter& record, const Tensor& router);
  double* last_router_sums_ = nullptr;
  // Whatever is pending is recorded by this.
  void flush_pending();
  // Rope angle tables (cuda::rope_table) of the current pass, one per positions tensor and
  // rope parameters (`key`): recorded by the first decode rope of a pass, read by every
  // layer's (rope_store or the products' epilogue); an upload (the next pass's positions)
  // makes them stale.
  struct RopeTable {
    uint64_t key = 0;
    std::unique_ptr<Buffer> buffer;
    int64_t rows = 0;  // tokens the buffer holds
    bool current = false;
  };
  std::vector<RopeTable> rope_tables_;
  std::vector<std::unique_ptr<Buffer>> retired_rope_tables_;
  const float* rope_table_for(const cuda::RopeArgs& rope, uint64_t key);
  bool record_rope_store(Tensor& q_heads, Tensor& k_heads, const Tensor& v, const Tensor& positions,
                         const RopeParams& params, KvLayer& cache, const Tensor& slots, const cuda::HeadNorms& norms);
  // Prefill: the head norms, rope and cache store as one rope_store_rows launch; false where
  // it does not take the layout (nothing recorded then).
  bool record_rope_store_rows(Tensor& q_heads, Tensor& k_heads, const Tensor& v, const Tensor& positions,
                              const RopeParams& params, KvLayer& cache, const Tensor& slots,
                              const cuda::HeadNorms& norms);
  // Prefill (cuda_backend_prefill.cpp): several weights over one x as gemm_parts; false
  // where it does not apply (the caller then runs the parts one by one).
  bool matmul_parts_prefill(const Tensor& x, std::span<const MatmulPart> parts);
  struct PrefillLanes;
  std::shared_ptr<PrefillLanes> prefill_lanes_;
  void add_bias(const Tensor& bias, Tensor& out);
  // MoE (cuda_backend_moe.cpp): the routed experts' launches; with `residual`, true where the
  // residual add went into them (else the caller adds).
  bool record_moe_ffn(const Tensor& x, const ExpertWeights& experts, const Tensor& ids, const Tensor& weights,
                      const GluParams& act, Tensor& out, Tensor* residual);
  // Prefill router logits as one router_logits launch (f32 router rows); false: nothing
  // recorded, the layout does not fit.
  static bool prefill_router_enabled();
  bool record_router_logits(const Tensor& x, const Tensor& router, const Tensor& bias, Tensor& logits);
  // Every expert on every token, for expert types the routed kernels refuse (gate and up of
  // different types).
  void moe_ffn_all_experts(const Tensor& x, const ExpertWeights& experts, const Tensor& ids, const Tensor& weights,
                           const GluParams& act, Tensor& out);

  // The int8 copy of the last quantized matmul's input: the next matmul over the same x
  // (q/k/v share the attention norm's output, gate/up the ffn norm's) reuses it instead of
  // quantizing again. Any other recorded op or upload forgets it (it may write x).
  struct QuantizedInput {
    const float* x = nullptr;
    int64_t cols = 0, tokens = 0, stride = 0;
    void* q8 = nullptr;
    bool operator==(const QuantizedInput&) const = default;
  };
  QuantizedInput quantized_input_;
  // Ops whose output feeds a matmul (rmsnorm, glu) also write its int8 copy: the scratch the
  // matmul would quantize into (row stride *row_bytes), or null where it would not take one
  // (exact mode, more than a decode batch of rows, width not a multiple of 32 or too small).
  uint8_t* q8_for_next_matmul(int64_t cols, int64_t rows, int64_t* row_bytes);
  // After recording such an op: the next matmul over x reuses its int8 copy.
  void remember_q8(const float* x, int64_t cols, int64_t rows, int64_t stride, uint8_t* q8);

  CudaOptions options_;
  int64_t recorded_ops_ = 0;
  int64_t half_copies_taken_ = 0;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  std::unique_ptr<cuda::StepGraphs> graphs_;
  void* pinned_ = nullptr;  // staging for weights and per-step uploads
  size_t pinned_bytes_ = 0, pinned_used_ = 0;
  // download_async(): one pinned slot and one event per download in flight, used in turn.
  struct PendingDownload {
    uint64_t ticket = 0;  // 0: free
    cudaEvent_t done = nullptr;
    uint8_t* staged = nullptr;
    size_t bytes = 0;
  };
  PendingDownload downloads_[kMaxPendingDownloads];
  void* download_pinned_ = nullptr;
  uint64_t next_download_ = 1;
  std::unique_ptr<cuda::StepIo> step_io_;  // null with options_.step_io_in_graph off
  // Ends a pass's graph: flushes the recorded ops and closes the step slot they use.
  void flush_graph();
  std::vector<void*> device_allocations_;  // weights, retired scratch
  std::vector<const void*> interleaved_;   // weights registered in the interleaved layout
  std::vector<const void*> tiled_experts_; // expert stacks in the row-tile layout (few: a scan)
  size_t weight_bytes_ = 0;
  Scratch half_copy_scratch_;
  Scratch q8_scratch_, matmul_scratch_, glu_half_scratch_, attention_scratch_, moe_scratch_, argmax_scratch_,
      blas_workspace_;
  // rmsnorm_moe_route's tickets (one per token of a decode batch), zeroed once at start; each
  // launch leaves them zero.
  static constexpr int64_t kMoeRouteMaxTokens = 8;
  Scratch route_tickets_;
  // moe_ffn's h tickets (cuda::MoeFfnArgs::h_tickets): zeroed when (re)allocated; each launch
  // leaves them zero.
  Scratch moe_h_tickets_;
  unsigned* moe_h_tickets(int64_t count);
  int device_sms_ = 0;
  // Where the per-block wait trace goes when this backend is destroyed (KILN_CUDA_BLOCK_TRACE_FILE;
  // block_trace.h); empty: none.
  std::string block_trace_path_;
};

}  // namespace kiln
