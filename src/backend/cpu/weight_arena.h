#pragma once
// Anonymous memory for weights copied out of the mapped model file at load, in 2 MiB
// transparent huge pages where the kernel grants them (THP mode "always" or "madvise").
//
// Why: decode streams every weight once per token, and on the 2-core development VM it
// reads anonymous memory faster than the file's page-cache pages (tg32 of a 1B model,
// alternating runs: +11-13% for q4_0, q4_K_M, q8_0, f16, about half from anonymous memory
// as such and half from the 2 MiB pages; a plain read loop gains 8-15% the same way:
// docs/perf-notes-cpu.md, v9).
// The cost: the copy is resident, anonymous memory the size of the weights (the file's
// pages stay in the page cache, reclaimable), and a memcpy at load. So it is a choice
// (CpuBackend's copy_weights, `--cpu-weights copy`), not the default.
#include <cstddef>
#include <cstdint>
#include <vector>

namespace kiln::cpu {

class WeightArena {
 public:
  WeightArena() = default;
  ~WeightArena();
  WeightArena(const WeightArena&) = delete;
  WeightArena& operator=(const WeightArena&) = delete;

  // Copies `bytes` from `src` into the arena; the copy is 64-byte aligned and lives as long
  // as the arena. Throws when the memory cannot be mapped.
  const uint8_t* copy(const void* src, size_t bytes);

  // Bytes of address space mapped so far (what the copies may make resident, rounded up to
  // whole regions' used parts).
  size_t bytes_mapped() const;
  // Whether the kernel accepted the huge-page advice for the regions (false: THP is off or
  // "never" here, so the copies use 4 KiB pages and gain nothing over the file mapping).
  bool huge_pages_advised() const { return huge_pages_advised_; }

  static constexpr size_t kHugePage = size_t(2) << 20;
  // Regions are mapped this large (or larger, for a bigger tensor) and filled front to
  // back, so that tensors share huge pages instead of each rounding up to its own.
  static constexpr size_t kRegionBytes = size_t(256) << 20;

 private:
  struct Region {
    uint8_t* base = nullptr;  // 2 MiB aligned
    size_t size = 0;
    size_t used = 0;
  };
  std::vector<Region> regions_;
  bool huge_pages_advised_ = true;
};

}  // namespace kiln::cpu
