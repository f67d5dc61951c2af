// The copy kernels of step_io.h: a pass's uploads from mapped host memory to the device, and a
// download back when no kernel of the pass writes it there itself.
#include <algorithm>

#include "backend/cuda/common.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/step_io.h"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWordsPerThread = 4;
constexpr size_t kBlockBytes = size_t(kThreads) * kWordsPerThread * 4;

// Each block copies its kBlockBytes of the range: whole 4-byte words where both ends are
// word-aligned, single bytes otherwise. An upload's source is written by the host before the
// graph starts, never by a kernel, so it is read before the wait for the kernels before this
// one (the PCIe round trip overlaps their tail); its destination only after. A download's
// source is a kernel's output: everything after the wait.
template <bool kFromHost>
__global__ void copy_step_bytes_kernel(const uint8_t* __restrict__ src, uint8_t* __restrict__ dst, size_t bytes,
                                       bool words) {
  detail::allow_next_kernel();  // the next kernel still waits for this one to finish
  const size_t begin = size_t(blockIdx.x) * kBlockBytes, end = std::min(begin + kBlockBytes, bytes);
  if (!kFromHost) detail::wait_for_previous_kernels();
  if (words) {
    uint32_t held[kWordsPerThread];
#pragma unroll
    for (int k = 0; k < kWordsPerThread; ++k) {
      const size_t at = begin + (size_t(k) * kThreads + threadIdx.x) * 4;
      if (at < end) held[k] = *reinterpret_cast<const uint32_t*>(src + at);
    }
    if (kFromHost) detail::wait_for_previous_kernels();
#pragma unroll
    for (int k = 0; k < kWordsPerThread; ++k) {
      const size_t at = begin + (size_t(k) * kThreads + threadIdx.x) * 4;
      if (at < end) *reinterpret_cast<uint32_t*>(dst + at) = held[k];
    }
  } else {
    if (kFromHost) detail::wait_for_previous_kernels();
    for (size_t at = begin + threadIdx.x; at < end; at += kThreads) dst[at] = src[at];
  }
  if (!kFromHost) __threadfence_system();  // the host sees the bytes before the step's event
}

template <bool kFromHost>
Status copy(const void* src, void* dst, size_t bytes, cudaStream_t stream) {
  if (!src || !dst || bytes == 0) return Status::invalid("step copy: src, dst and bytes must be set");
  // Words need both ends aligned and a whole number of them (the step's uploads are int32).
  const bool words = reinterpret_cast<uintptr_t>(src) % 4 == 0 && reinterpret_cast<uintptr_t>(dst) % 4 == 0 &&
                     bytes % 4 == 0;
  const unsigned blocks = unsigned((bytes + kBlockBytes - 1) / kBlockBytes);
  const cudaError_t e = launch_chained(copy_step_bytes_kernel<kFromHost>, dim3(blocks), dim3(kThreads), 0, stream,
                                       static_cast<const uint8_t*>(src), static_cast<uint8_t*>(dst), bytes, words);
  return e == cudaSuccess ? Status() : Status::from_cuda(e, "copy_step_bytes_kernel");
}

}  // namespace

Status upload_step_bytes(const void* host_src, void* dst, size_t bytes, cudaStream_t stream) {
  return copy<true>(host_src, dst, bytes, stream);
}

Status download_step_bytes(const void* src, void* host_dst, size_t bytes, cudaStream_t stream) {
  return copy<false>(src, host_dst, bytes, stream);
}

}  // namespace kiln::cuda
