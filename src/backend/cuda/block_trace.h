#pragma once
// The host side of the per-block wait trace (block_trace.cuh; builds configured with
// -DKILN_CUDA_BLOCK_TRACE=ON). The backend enables it where KILN_CUDA_BLOCK_TRACE_FILE names
// a file and writes the records there when it is destroyed.
#include <cstddef>
#include <cstdint>
#include <string>

namespace kiln::cuda::block_trace {

// Phase stamps a kernel may add after its wait (block_trace::stamp; 0: not stamped).
constexpr int kStamps = 4;

// Plain aggregates (no initializers): a __device__ variable of one needs no constructor.
struct Record {
  uint64_t arrived, released;  // %globaltimer (ns) before and after the block's wait
  uint64_t stamps[kStamps];    // %globaltimer (ns) at the kernel's phase stamps
  uint32_t sm, block, blocks, threads, dynamic_smem, unused;
};

struct Sink {
  Record* records;  // null: tracing off
  unsigned long long* count;
  unsigned long long capacity;
};

// Called once per translation unit that compiles block_trace.cuh, with its copy of the sink.
void register_sink(const void* device_symbol);
// Whether this build records (some unit registered a sink).
bool compiled_in();
// Gives every registered sink a ring of `capacity` records on the current device; false (and
// nothing done) where the build does not record or the allocation fails.
bool enable(size_t capacity);
// Writes the records kept (the last `capacity`), oldest arrival first, as CSV to `path` and
// frees the ring. Returns the number written, or -1 where the file cannot be written.
int64_t write_csv(const std::string& path);

}  // namespace kiln::cuda::block_trace
