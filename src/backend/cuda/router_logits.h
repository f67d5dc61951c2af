#pragma once
// The MoE router's logits for a prefill batch, in f32 (no TF32: the routing decisions are the
// CPU backend's up to the order of the sums):
//
//   logits[t][e] = sum_k x[t][k] * router[e][k] (+ bias[e])     x [T, K], router [E, K] f32
//
// A product of T x K by E = 128 outputs is too narrow for cuBLAS's SGEMM tiles (a Qwen3-30B-A3B
// layer at T = 512: 20 us for 0.27 GFLOP, 4 us of f32 FMA). Here tiles of 64 tokens x 64 experts are split
// over K between the blocks of one thread block cluster (up to 8), each block sums its
// share in registers (4 x 4 outputs per thread), and the cluster adds the shares in rank
// order through distributed shared memory: every SM busy, no scratch, no atomics, the same
// bits on every run.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "backend/cuda/status.h"

namespace kiln::cuda {

// Where the blocks of the clusters go. A cluster's blocks must share a GPC, and with the
// default policy several of them may share an SM (up to 3 fit): at T = 512 the 128 blocks
// then crowd onto a third of the SMs. Spread asks the scheduler to spread a cluster's blocks
// over SMs; one per SM reserves enough shared memory that no SM takes two. Measured at T = 512
// (prefill op profile, H200): default 24.1 us, spread 23.4, one per SM 29.6 - placement is not
// what keeps it at ~3x its estimate (see router_logits.cu), and cuBLAS's 20.3 is still ahead,
// so the backend uses this kernel only when asked (KILN_CUDA_PREFILL_ROUTER=1).
enum class RouterPlacement : uint8_t { Default, Spread, OnePerSm };

struct RouterLogitsArgs {
  const float* x = nullptr;  // [n_tokens][k], row stride x_stride floats
  int64_t x_stride = 0;
  const float* router = nullptr;  // [n_expert][k], row stride router_stride floats
  int64_t router_stride = 0;
  const float* bias = nullptr;  // [n_expert] or null
  float* logits = nullptr;      // [n_tokens][n_expert], row stride logits_stride floats
  int64_t logits_stride = 0;
  int64_t n_tokens = 0, n_expert = 0, k = 0;
  RouterPlacement placement = RouterPlacement::Spread;  // the same bits whichever
};

// Empty when router_logits() takes these sizes and alignments (rows of x and of the router
// 16-byte aligned, k a multiple of 4); else why not.
std::string router_logits_refusal(const RouterLogitsArgs& args);

// How many blocks share one tile's k (the cluster size) and how many k each sums; the sums'
// order, and so the bits of the result, depend on these and on nothing else.
struct RouterSplit {
  int blocks = 1;
  int64_t chunk = 0;
};
RouterSplit router_logits_split(int64_t k);

Status router_logits(const RouterLogitsArgs& args, cudaStream_t stream);

}  // namespace kiln::cuda
