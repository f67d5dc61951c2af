#include "backend/cpu/weight_arena.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace kiln::cpu {

namespace {

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// A private anonymous mapping of `size` bytes (a multiple of 2 MiB) starting on a 2 MiB
// boundary: mapped 2 MiB larger, the misaligned head and tail unmapped again.
uint8_t* map_aligned(size_t size) {
  const size_t padded = size + WeightArena::kHugePage;
  void* p = ::mmap(nullptr, padded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) fail("cpu weights: cannot map {} bytes for the weight copy: {}", size, std::strerror(errno));
  const auto start = reinterpret_cast<uintptr_t>(p);
  const uintptr_t aligned = round_up(start, WeightArena::kHugePage);
  if (aligned > start) ::munmap(p, aligned - start);
  const size_t tail = padded - (aligned - start) - size;
  if (tail > 0) ::munmap(reinterpret_cast<void*>(aligned + size), tail);
  return reinterpret_cast<uint8_t*>(aligned);
}

}  // namespace

WeightArena::~WeightArena() {
  for (const Region& r : regions_) ::munmap(r.base, r.size);
}

const uint8_t* WeightArena::copy(const void* src, size_t bytes) {
  const size_t need = round_up(std::max<size_t>(bytes, 1), 64);
  if (regions_.empty() || regions_.back().size - regions_.back().used < need) {
    Region r;
    r.size = std::max(kRegionBytes, round_up(need, kHugePage));
    r.base = map_aligned(r.size);
    // Advice only: without THP the region still works, with 4 KiB pages.
    if (::madvise(r.base, r.size, MADV_HUGEPAGE) != 0) huge_pages_advised_ = false;
    regions_.push_back(r);
  }
  Region& r = regions_.back();
  uint8_t* dst = r.base + r.used;
  std::memcpy(dst, src, bytes);
  r.used += need;
  return dst;
}

size_t WeightArena::bytes_mapped() const {
  size_t total = 0;
  for (const Region& r : regions_) total += round_up(r.used, kHugePage);
  return total;
}

}  // namespace kiln::cpu
