#pragma once
// rope on a token's query and key heads and the store of its keys and values into the KV
// cache, as one kernel (a decode layer's rope q, rope k and kv_store were three launches).
// The same values as rope() twice then kv_store(): the rotated keys are written both back to
// k and, rounded for an f16 cache, into the cache.
#include <cuda_runtime_api.h>

#include <string>

#include "backend/cuda/ops.h"
#include "backend/cuda/ops_extra.h"
#include "backend/cuda/status.h"

namespace kiln::cuda {

// q and k share positions, token count and every rope parameter; k's heads are packed
// (head_stride == head_dim) and k.x / store.k are the same rows (store.k_width = heads x dim).
// With `angles` (a rope_table of these positions and parameters) the blocks read their
// angles instead of computing them. With head norms (Qwen3's q/k norms: weights [head_dim],
// head_dim <= 256, packed heads) each head is RMS-normalized in place first, as rmsnorm()
// over heads as rows would (the sum of squares added in another order: ~1 ulp apart).
constexpr int64_t kMaxHeadNormDim = 256;
struct HeadNorms {
  const float* q = nullptr;  // [head_dim] or null: q heads not normalized
  const float* k = nullptr;
  float eps = 0.0f;
};
Status rope_store(const RopeArgs& q, const RopeArgs& k, const KvStoreArgs& store, cudaStream_t stream,
                  const float* angles = nullptr, const HeadNorms& norms = {});

// Prefill (many tokens): the same as rope_store() with the angles of a rope_table, one warp
// per head row of q and k (loaded in 16-byte pieces, normed and rotated in registers) or per
// 128 values of v, 8 rows a block (rope_store_rows.cu). Takes head_dim 64, 128 or 256, packed
// heads, n_rot <= head_dim, rows 16-byte aligned (8 bytes for head_dim 64): see the refusal.
std::string rope_store_rows_refusal(const RopeArgs& q, const RopeArgs& k, const KvStoreArgs& store,
                                    const float* angles, const HeadNorms& norms);
Status rope_store_rows(const RopeArgs& q, const RopeArgs& k, const KvStoreArgs& store, const float* angles,
                       const HeadNorms& norms, cudaStream_t stream);

// The rotation angles of every token of a batch, computed once per pass for all layers that
// rope with these parameters (the q/k/v products' epilogue reads them; see PairEpilogue):
// table + t * n_rot holds cos(theta_i) * mscale for i < n_rot / 2, then the sines, as rope()
// computes them (angles in double). Reads only the positions; x is not used.
Status rope_table(const RopeArgs& rope, float* table, cudaStream_t stream);

}  // namespace kiln::cuda
