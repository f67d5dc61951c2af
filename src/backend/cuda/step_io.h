#pragma once
// A step's host traffic inside its graph. A decode step moves a few hundred bytes between
// host and device: the batch description up (tokens, positions, cache slots, block tables),
// the sampled tokens down. As copies on the stream each is an operation of its own between
// two graphs, a few microseconds of idle device apiece. Instead the host writes its uploads
// into mapped (zero-copy) host memory and a kernel of the step copies them to the device, and
// the download is a kernel that writes into mapped memory: a step is one graph launch.
//
// The memory is cut into slots. A pass stages its uploads (and its download) in the open
// slot; the slot closes when the pass's ops are flushed, with an event recorded after them,
// and the next slot opens. Two slots used in turn: the host writes step n+1's uploads while
// the device runs step n, and a graph sees one of two addresses (two graphs a step shape).
// Opening a slot waits for the event of its previous use; a download still held there then
// moves to its ticket's own pinned buffer (download_async allows more tickets than slots).
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/status.h"

namespace kiln::cuda {

class StepIo {
 public:
  static constexpr int kSlots = 2;
  static constexpr size_t kSlotBytes = size_t(64) << 10;
  // Larger uploads (a long prompt's positions) take a copy on the stream, leaving the slot
  // room for the pass's other uploads.
  static constexpr size_t kMaxUploadBytes = kSlotBytes / 4;

  StepIo();  // allocates the mapped memory; throws kiln::Error if it cannot
  ~StepIo();
  StepIo(const StepIo&) = delete;
  StepIo& operator=(const StepIo&) = delete;

  // `bytes` of the open slot (16-byte aligned), opening one if none is; nullptr where they
  // do not fit in what is left of it (the caller then copies the old way).
  uint8_t* reserve(size_t bytes);
  // The open slot's region `at` (from reserve) receives the download of `ticket`; if the
  // slot is reopened before take(), the bytes move to `spill` (pinned, the ticket's own).
  void hold_download(uint64_t ticket, const uint8_t* at, size_t bytes, void* spill);
  // Closes the open slot, if anything was staged in it: its event goes on `stream`, after
  // the ops that read or write it.
  void close(cudaStream_t stream);
  // Copies the download of `ticket` to `host` if a slot still holds it (its event must have
  // completed); false where it already moved to its spill buffer.
  bool take(uint64_t ticket, void* host, size_t bytes);

 private:
  struct Slot {
    uint8_t* data = nullptr;
    cudaEvent_t done = nullptr;
    bool recorded = false;  // `done` marks the slot's last use
    uint64_t ticket = 0;    // a download held here (0: none)
    const uint8_t* download = nullptr;
    size_t download_bytes = 0;
    void* spill = nullptr;
  };
  void open(Slot& slot);
  void release();  // the events and the memory, as far as they were made

  uint8_t* memory_ = nullptr;
  Slot slots_[kSlots];
  int current_ = 0;
  bool open_ = false;
  size_t used_ = 0;
};

// Copies of `bytes` as chained kernels (launch.cuh), in order with the kernels around them:
// from a step slot to the device (the host wrote the slot before the graph's launch), and from
// the device into a step slot (visible to the host once the kernel is done).
Status upload_step_bytes(const void* host_src, void* dst, size_t bytes, cudaStream_t stream);
Status download_step_bytes(const void* src, void* host_dst, size_t bytes, cudaStream_t stream);

}  // namespace kiln::cuda
