#pragma once
// Prefill attention on tensor cores, flash-attention style: a CUDA block takes 64 consecutive
// query tokens of one sequence and one query head, and walks that sequence's keys from the
// paged cache (v8, the default: two warp groups on alternate 32-key chunks whose softmax
// states are merged at the end; v6: 4 warps on whole 64-key tiles). Q·Kᵀ and P·V run as f16
// mma.sync with f32 accumulation; the softmax is online, in f32 registers, so no score
// matrix ever reaches memory.
//
// Precision: q, k, v and the softmax weights are rounded to f16 for the products (as
// llama.cpp's and most engines' flash attention do); expect ~1e-3 relative difference
// from f32 attention. The decode kernel (attention.h) and exact mode stay f32.
//
// Semantics are those of decode_attention: token t (position first_position + t) attends
// the keys at positions <= its own (and > position - sliding_window when the window is
// set), scores scaled, optionally soft-capped, optional per-head sink logits.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/status.h"
#include "quant/types.h"

namespace kiln::cuda {

struct PrefillAttentionArgs {
  const float* q = nullptr;  // [n_tokens][q_stride], head h at h * head_dim
  int64_t q_stride = 0;
  const void* k_cache = nullptr;  // slots of n_head_kv * head_dim elements of cache_type
  const void* v_cache = nullptr;
  int64_t k_slot_stride = 0, v_slot_stride = 0;  // elements
  GgmlType cache_type = GgmlType::F32;           // F32 or F16
  // The sequence's block table is row seq_rows[0] of block_tables.
  const int32_t* block_tables = nullptr;
  int64_t block_table_stride = 0;
  const int32_t* seq_rows = nullptr;
  int block_size = 0;
  int first_position = 0;  // position of token 0; token t is at first_position + t
  int n_tokens = 0, n_head = 0, n_head_kv = 0, head_dim = 0;
  float scale = 1.0f, softcap = 0.0f;
  int sliding_window = 0;
  const float* sinks = nullptr;  // [n_head] or null
  float* out = nullptr;          // [n_tokens][out_stride]
  int64_t out_stride = 0;
  // Optional: the output also rounded to f16 (bf16 with out_half_bf16) as packed rows of
  // n_head * head_dim at out_half, 256-byte aligned: the output product's x_half (gemm.h).
  void* out_half = nullptr;
  bool out_half_bf16 = false;
  // Kernel version: 0 the default (v8, or v6 with KILN_CUDA_PREFILL_ATTN_V=6), or 6 or 8 to
  // choose one (tests and benchmarks run both).
  int version = 0;
};

// Head sizes and cache types the kernel is built for (64 and 128; f32 and f16).
bool prefill_attention_supports(int head_dim, GgmlType cache_type);

Status prefill_attention(const PrefillAttentionArgs& args, cudaStream_t stream);

}  // namespace kiln::cuda
