#include "backend/cuda/step_io.h"

#include <cstring>

#include "core/error.h"

namespace kiln::cuda {

StepIo::StepIo() {
  const size_t bytes = kSlots * kSlotBytes;
  // Mapped: the kernels read and write it through the device's view of host memory.
  cudaError_t e = cudaHostAlloc(reinterpret_cast<void**>(&memory_), bytes, cudaHostAllocMapped);
  if (e != cudaSuccess) {
    memory_ = nullptr;
    fail("cuda backend: cannot allocate {} bytes of mapped host memory: {}", bytes, cudaGetErrorString(e));
  }
  void* device_view = nullptr;
  e = cudaHostGetDevicePointer(&device_view, memory_, 0);
  // Unified addressing (every 64-bit platform CUDA 13 supports) gives the host's address.
  if (e != cudaSuccess || device_view != memory_) {
    release();
    fail("cuda backend: mapped host memory has no device address equal to its host address ({})",
         cudaGetErrorString(e));
  }
  for (int i = 0; i < kSlots; ++i) {
    slots_[i].data = memory_ + size_t(i) * kSlotBytes;
    e = cudaEventCreateWithFlags(&slots_[i].done, cudaEventDisableTiming);
    if (e != cudaSuccess) {
      slots_[i].done = nullptr;
      release();
      fail("cuda backend: cudaEventCreate: {}", cudaGetErrorString(e));
    }
  }
}

StepIo::~StepIo() { release(); }

void StepIo::release() {
  for (Slot& s : slots_)
    if (s.done) {
      if (s.recorded) cudaEventSynchronize(s.done);
      cudaEventDestroy(s.done);
      s.done = nullptr;
    }
  if (memory_) cudaFreeHost(memory_);
  memory_ = nullptr;
}

void StepIo::open(Slot& slot) {
  if (slot.recorded) {
    const cudaError_t e = cudaEventSynchronize(slot.done);
    if (e != cudaSuccess) fail("cuda backend: waiting for a step's host memory: {}", cudaGetErrorString(e));
  }
  if (slot.ticket != 0) {  // not taken yet: keep it where the ticket expects it
    std::memcpy(slot.spill, slot.download, slot.download_bytes);
    slot.ticket = 0;
  }
  open_ = true;
  used_ = 0;
}

uint8_t* StepIo::reserve(size_t bytes) {
  Slot& slot = slots_[current_];
  if (!open_) open(slot);
  if (slot.ticket != 0 || used_ + bytes > kSlotBytes) return nullptr;  // one download a slot, last
  uint8_t* at = slot.data + used_;
  used_ += (bytes + 15) / 16 * 16;
  return at;
}

void StepIo::hold_download(uint64_t ticket, const uint8_t* at, size_t bytes, void* spill) {
  Slot& slot = slots_[current_];
  KILN_CHECK(open_ && at >= slot.data && at + bytes <= slot.data + kSlotBytes,
             "cuda backend: a download outside the open step slot");
  slot.ticket = ticket;
  slot.download = at;
  slot.download_bytes = bytes;
  slot.spill = spill;
}

void StepIo::close(cudaStream_t stream) {
  if (!open_ || used_ == 0) return;  // an open slot with nothing in it stays open
  Slot& slot = slots_[current_];
  const cudaError_t e = cudaEventRecord(slot.done, stream);
  if (e != cudaSuccess) fail("cuda backend: cudaEventRecord (step slot): {}", cudaGetErrorString(e));
  slot.recorded = true;
  current_ = (current_ + 1) % kSlots;
  open_ = false;
  used_ = 0;
}

bool StepIo::take(uint64_t ticket, void* host, size_t bytes) {
  for (Slot& s : slots_)
    if (s.ticket == ticket) {
      std::memcpy(host, s.download, bytes);
      s.ticket = 0;
      return true;
    }
  return false;
}

}  // namespace kiln::cuda
