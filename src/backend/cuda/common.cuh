#pragma once
// Device-side helpers shared by kiln's CUDA kernels: warp reductions, half/bfloat16 bits to
// float, little-endian reads of block fields at any alignment, and 16-byte asynchronous
// copies from global to shared memory.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#if KILN_CUDA_BLOCK_TRACE
#include "backend/cuda/block_trace.cuh"  // timestamps at wait_for_previous_kernels()
#endif

namespace kiln::cuda::detail {

inline constexpr int kWarpSize = 32;
inline constexpr unsigned kFullMask = 0xffffffffu;

__host__ __device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
__host__ __device__ __forceinline__ int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

// The sum of v over a block of kWarps warps, for every thread; `partial` is kWarps floats of
// shared memory. Warp sums are added in warp order, so every thread gets the same bits.
template <int kWarps>
__device__ __forceinline__ float block_sum(float v, float* partial) {
  v = warp_sum(v);
  if (threadIdx.x % kWarpSize == 0) partial[threadIdx.x / kWarpSize] = v;
  __syncthreads();
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) total += partial[w];
  return total;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}

__device__ __forceinline__ int warp_sum_int(int v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

// Two floats rounded to bf16 (nearest even) as one 32-bit word, lo in the low half; eight
// as one 16-byte word (for a single 16-byte store).
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&pair);
}
__device__ __forceinline__ uint4 pack_bf16x8(const float* v) {
  return make_uint4(pack_bf16x2(v[0], v[1]), pack_bf16x2(v[2], v[3]), pack_bf16x2(v[4], v[5]), pack_bf16x2(v[6], v[7]));
}

// IEEE half / bfloat16 bit patterns (low 16 bits of `bits`) to float; both exact.
__device__ __forceinline__ float half_to_float(uint32_t bits) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(bits & 0xffffu)));
}
__device__ __forceinline__ float bf16_to_float(uint32_t bits) { return __uint_as_float((bits & 0xffffu) << 16); }

// Little-endian 16-bit field at any byte address (block fields in GGUF rows are only
// byte- or 2-byte aligned).
__device__ __forceinline__ uint32_t load_u16(const uint8_t* p) { return uint32_t(p[0]) | (uint32_t(p[1]) << 8); }
__device__ __forceinline__ uint32_t load_u32(const uint8_t* p) { return load_u16(p) | (load_u16(p + 2) << 16); }

// N little-endian 32-bit words starting at byte `offset` of a 16-byte aligned buffer
// (shared memory). kAlign is what the caller guarantees about `offset`:
//   1  any alignment: N + 1 aligned loads and funnel shifts; reads the word after the last
//      one too, so the buffer must extend 4 bytes past the data (staging buffers are padded);
//   4  a multiple of 4: N plain word loads;
//   16 a multiple of 16 (and N a multiple of 4): N / 4 16-byte loads.
template <int kAlign = 1, int N>
__device__ __forceinline__ void load_words(const uint8_t* base, int offset, uint32_t (&w)[N]) {
  if constexpr (kAlign >= 16 && N % 4 == 0) {
    const uint4* v = reinterpret_cast<const uint4*>(base + offset);
#pragma unroll
    for (int i = 0; i < N / 4; ++i) {
      const uint4 q = v[i];
      w[4 * i] = q.x, w[4 * i + 1] = q.y, w[4 * i + 2] = q.z, w[4 * i + 3] = q.w;
    }
  } else if constexpr (kAlign >= 4) {
    const uint32_t* words = reinterpret_cast<const uint32_t*>(base + offset);
#pragma unroll
    for (int i = 0; i < N; ++i) w[i] = words[i];
  } else {
    const uint32_t* words = reinterpret_cast<const uint32_t*>(base) + (offset >> 2);
    const uint32_t shift = uint32_t(offset & 3) * 8;
    uint32_t lo = words[0];
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const uint32_t hi = words[i + 1];
      w[i] = __funnelshift_r(lo, hi, shift);
      lo = hi;
    }
  }
}

// A shared-memory pointer as the 32-bit address PTX's shared-memory instructions take.
__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared without passing through registers (sm_80+). Both addresses
// must be 16-byte aligned.
__device__ __forceinline__ void cp_async_16(void* shared_dst, const void* global_src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(shared_address(shared_dst)), "l"(global_src)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most `Pending` committed groups of this thread are still in flight.
template <int Pending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending) : "memory");
}

// Programmatic dependent launch (sm_90). A kernel started with launch_chained() (launch.cuh)
// may begin while the kernel before it in the stream is still running: before
// wait_for_previous_kernels() it may only read what no kernel of the step writes (weights),
// and it must call it before touching anything else. allow_next_kernel() lets the next
// chained kernel be scheduled early (it then waits in its own wait_for_previous_kernels()).
// Both are no-ops when the kernel was launched the ordinary way.
__device__ __forceinline__ void wait_for_previous_kernels() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#if KILN_CUDA_BLOCK_TRACE
  const uint64_t arrived = block_trace::now();
  const unsigned long long slot = block_trace::reserve();
#endif
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#if KILN_CUDA_BLOCK_TRACE
  block_trace::record(slot, arrived, block_trace::now());
#endif
#endif
}
__device__ __forceinline__ void allow_next_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
// Phase stamp k (0 .. 3) of the block trace: when thread 0 of the block got here, once
// `depends_on` (a value it loaded) had arrived. Trace builds only (-DKILN_CUDA_BLOCK_TRACE=ON,
// block_trace.cuh); elsewhere nothing, not even the wait for depends_on.
__device__ __forceinline__ void trace_stamp(int k, uint32_t depends_on = 0) {
#if KILN_CUDA_BLOCK_TRACE
  asm volatile("" ::"r"(depends_on));
  block_trace::stamp(k);
#else
  (void)k, (void)depends_on;
#endif
}

// The usual start of a chained kernel that reads its inputs at once.
__device__ __forceinline__ void begin_chained_kernel() {
  wait_for_previous_kernels();
  allow_next_kernel();
  trace_stamp(0);
}
// The same for a kernel that may have let the next one be scheduled at its start already
// (`next_allowed`: it called allow_next_kernel() before anything else): then only the wait.
__device__ __forceinline__ void begin_chained_kernel(bool next_allowed) {
  wait_for_previous_kernels();
  if (!next_allowed) allow_next_kernel();
  trace_stamp(0);
}

// An f32 value into an f32 or f16 (round to nearest even) element, e.g. of the KV cache.
__device__ __forceinline__ void store_as(float* p, float x) { *p = x; }
__device__ __forceinline__ void store_as(__half* p, float x) { *p = __float2half_rn(x); }

// 4 signed bytes of a and b, multiplied pairwise and summed onto c.
__device__ __forceinline__ int dot4(int a, int b, int c) { return __dp4a(a, b, c); }

// Bytes of `a` minus bytes of `b`, each modulo 256 (what a signed level needs after
// subtracting its offset: 0..63 - 32 -> -32..31 as an int8).
__device__ __forceinline__ int sub_bytes(uint32_t a, uint32_t b) { return int(__vsub4(a, b)); }

// The int8 copy of a block of 32 values spread over `kLanes` lanes, 32 / kLanes values each
// (lanes kLanes-aligned within the warp, the whole warp active). Every int8 copy of activations
// the backend makes comes from here (quantize_q8_kernel's too), so copies made by different
// kernels from the same floats have the same bytes. Writes the lane's values at qs and, from the block's
// first lane, (d, d * sum) at ds. `store` false (the same for a block's lanes): the lanes
// only take part in the warp's shuffles.
template <int kLanes, int kValues>
__device__ __forceinline__ void quantize_block_spread(const float (&v)[kValues], int8_t* qs, float2* ds,
                                                      bool store = true) {
  static_assert(kLanes * kValues == 32, "a block is 32 values");
  float amax = 0.0f;
#pragma unroll
  for (int k = 0; k < kValues; ++k) amax = fmaxf(amax, fabsf(v[k]));
#pragma unroll
  for (int off = kLanes / 2; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(kFullMask, amax, off));
  const float d = amax / 127.0f;
  // Each level is round(v * (1 / d)), halves away from zero: ggml's arithmetic and kiln's CPU
  // quantizers'. An IEEE division a value (v / d) made the decode products' prologue slower:
  // 21-48 us a step (docs/perf-notes.md, round 22).
  const float id = d == 0.0f ? 0.0f : 1.0f / d;
  int sum = 0;
#pragma unroll
  for (int k = 0; k < kValues; ++k) {
    const int q = int(roundf(v[k] * id));
    if (store) qs[k] = int8_t(q);
    sum += q;
  }
#pragma unroll
  for (int off = kLanes / 2; off > 0; off >>= 1) sum += __shfl_xor_sync(kFullMask, sum, off);
  if (store && threadIdx.x % kLanes == 0) *ds = make_float2(d, d * float(sum));
}

}  // namespace kiln::cuda::detail
