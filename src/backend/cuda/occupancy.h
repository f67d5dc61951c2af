#pragma once
// How a launch's blocks sit on the multiprocessors. A chained launch (launch.cuh) has its
// blocks placed while the kernel before it drains, on the multiprocessors that free up first;
// a kernel of which many blocks fit one multiprocessor can then run on part of the GPU. The
// cure measured so far (docs/perf-notes.md, round 20) is extra shared memory that caps its
// blocks a multiprocessor at the even share; KILN_CUDA_LAUNCH_REPORT=1 prints, once per
// kernel and shape, what each chained launch would fit against that share, to find the others.
#include <cuda_runtime_api.h>

#include <cstddef>

namespace kiln::cuda {

// Multiprocessors of the current device (read once).
int multiprocessor_count();
// The current device's compute capability's major number, e.g. 9 for an H100 / H200 (read once;
// 0 where it cannot be read).
int compute_capability_major();

// sm_90's shared memory a multiprocessor, of which 1 KB is reserved for every resident block.
inline constexpr size_t kSharedBytesPerMultiprocessor = 228 * 1024;
inline constexpr size_t kReservedSharedBytesPerBlock = 1024;
// The shared memory each of `blocks` blocks may take so that all of them fit one multiprocessor.
constexpr size_t shared_bytes_for_blocks(int blocks) {
  return kSharedBytesPerMultiprocessor / size_t(blocks) - kReservedSharedBytesPerBlock;
}

// The dynamic shared memory that caps `kernel` (`threads` a block) at `want` blocks a
// multiprocessor: 0 where at most `want` fit already, or where fewer than `at_least` fit (left
// as it is). The kernel's attribute for that much dynamic shared memory is set.
size_t spread_padding(const void* kernel, int threads, int want, int at_least);

// For a kernel (`threads` a block) that already takes `shared` bytes of dynamic shared memory
// and may take up to `max_dynamic` (its attribute, left as it is): the dynamic shared memory,
// more than `shared`, with which exactly `want` blocks fit a multiprocessor; `shared` where at
// most `want` fit already, where that cannot be had, or on any CUDA error.
size_t spread_shared_bytes(const void* kernel, int threads, size_t shared, int want, size_t max_dynamic);

// KILN_CUDA_LAUNCH_REPORT=1 (read once).
bool launch_report_enabled();
// Prints, the first time a kernel is launched with this grid size and shared memory, its name,
// blocks, how many fit a multiprocessor and the even share (blocks / multiprocessors).
void report_launch(const void* kernel, dim3 grid, dim3 block, size_t shared_bytes);

}  // namespace kiln::cuda
