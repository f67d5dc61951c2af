// Where decode's weight-read speed is lost: one read loop, run over the same amount of
// memory obtained in different ways (file mapping, populated or not; anonymous memory with
// 4 KiB pages or transparent huge pages; hugetlb memfd when the system has huge pages).
//
// Decode streams every weight once per token, so its ceiling is what two threads can read.
// The question this answers: does the page size behind the weights (TLB reach; in a virtual
// machine every TLB miss is a two-level walk) change that ceiling?
//
//   bench_memory_bench [--file PATH] [--mib N] [--rounds R] [--threads T]
//
// PATH is read through a private read-only mapping (a GGUF file is a good choice: the bytes
// do not matter). Each round runs every source once, in turn, so noise from other processes
// spreads evenly; the table shows each source's median and best GB/s. Plain program with its
// own main (Google Benchmark's repetitions would not interleave the sources).
#include <fcntl.h>
#include <immintrin.h>
#include <linux/memfd.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr size_t kHugePage = size_t(2) << 20;

// One source of bytes to read, plus how it was obtained.
struct Region {
  std::string name;
  const uint8_t* data = nullptr;
  size_t bytes = 0;
  void* map_base = nullptr;  // for munmap
  size_t map_bytes = 0;
  int fd = -1;
};

// Reads [p, p + n) with 64-byte AVX-512 loads into four accumulators (the loads are
// independent; the adds only keep them alive). `streams` interleaved sequential streams:
// the range is cut into that many parts, read one line of each in turn.
__attribute__((target("avx512f,avx512bw"))) uint64_t read_range(const uint8_t* p, size_t n, int streams, bool prefetch) {
  __m512i acc[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
  const size_t part = n / size_t(streams) / 256 * 256;
  for (size_t off = 0; off < part; off += 256) {
    for (int s = 0; s < streams; ++s) {
      const uint8_t* q = p + size_t(s) * part + off;
      if (prefetch) {
        _mm_prefetch(reinterpret_cast<const char*>(q + 4096), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(q + 4096 + 128), _MM_HINT_T0);
      }
      for (int j = 0; j < 4; ++j) acc[j] = _mm512_add_epi64(acc[j], _mm512_loadu_si512(q + 64 * j));
    }
  }
  return uint64_t(_mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(acc[0], acc[1]), _mm512_add_epi64(acc[2], acc[3]))));
}

// Runs fn(t) on `threads` threads pinned to CPUs 0..threads-1, returns seconds.
double timed_parallel(int threads, const std::function<void(int)>& fn) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(t, &set);
      sched_setaffinity(0, sizeof(set), &set);
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) {
      }
      fn(t);
    });
  }
  while (ready.load() < threads) {
  }
  const auto t0 = std::chrono::steady_clock::now();
  go.store(true, std::memory_order_release);
  for (auto& th : pool) th.join();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Sums the smaps fields that say how a mapping is backed (e.g. "AnonHugePages",
// "FilePmdMapped") for the mapping that starts at `base`.
size_t smaps_kib(const void* base, const char* field) {
  std::ifstream f("/proc/self/smaps");
  std::string line;
  char start[32];
  std::snprintf(start, sizeof(start), "%lx-", reinterpret_cast<unsigned long>(base));
  bool in = false;
  const std::string key = std::string(field) + ":";
  while (std::getline(f, line)) {
    if (!line.empty() && std::isxdigit(static_cast<unsigned char>(line[0])) && line.find('-') != std::string::npos &&
        line.find(' ') > line.find('-')) {
      in = line.rfind(start, 0) == 0;
      continue;
    }
    if (in && line.rfind(key, 0) == 0) return std::strtoull(line.c_str() + key.size(), nullptr, 10);
  }
  return 0;
}

void touch_all(Region& r) {
  volatile uint64_t sink = read_range(r.data, r.bytes, 1, false);
  (void)sink;
}

void fill(uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; i += 4096) std::memset(p + i, int(i >> 12), std::min<size_t>(4096, n - i));
}

Region anon(const char* name, size_t bytes, int advice) {
  Region r;
  r.name = name;
  r.map_bytes = bytes + kHugePage;
  r.map_base = mmap(nullptr, r.map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (r.map_base == MAP_FAILED) {
    std::perror("mmap anonymous");
    std::exit(1);
  }
  uint8_t* aligned = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(r.map_base) + kHugePage - 1) & ~(kHugePage - 1));
  if (advice != 0 && madvise(aligned, bytes, advice) != 0) std::perror("madvise");
  fill(aligned, bytes);
  r.data = aligned;
  r.bytes = bytes;
  return r;
}

// Anonymous 4 KiB pages first touched in a shuffled order: the same kind of memory as
// anon(), but consecutive virtual pages get physical pages in no particular order (the
// kernel hands out free pages in the order of the faults), as a file's page cache does
// when the file was read at different times. Compared with anon(..., MADV_NOHUGEPAGE),
// this isolates physical placement from page size.
Region anon_scattered(const char* name, size_t bytes) {
  Region r;
  r.name = name;
  r.map_bytes = bytes;
  r.map_base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (r.map_base == MAP_FAILED) {
    std::perror("mmap anonymous");
    std::exit(1);
  }
  madvise(r.map_base, bytes, MADV_NOHUGEPAGE);
  auto* p = static_cast<uint8_t*>(r.map_base);
  std::vector<size_t> pages(bytes / 4096);
  for (size_t i = 0; i < pages.size(); ++i) pages[i] = i;
  uint64_t state = 88172645463325252ull;  // xorshift: a fixed shuffle
  for (size_t i = pages.size(); i > 1; --i) {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    std::swap(pages[i - 1], pages[state % i]);
  }
  for (size_t page : pages) std::memset(p + page * 4096, int(page), 4096);
  r.data = p;
  r.bytes = bytes;
  return r;
}

Region file_map(const char* name, const std::string& path, size_t bytes, int flags, int advice) {
  Region r;
  r.name = name;
  r.fd = open(path.c_str(), O_RDONLY);
  if (r.fd < 0) {
    std::perror(path.c_str());
    std::exit(1);
  }
  r.map_bytes = bytes;
  r.map_base = mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE | flags, r.fd, 0);
  if (r.map_base == MAP_FAILED) {
    std::perror("mmap file");
    std::exit(1);
  }
  if (advice != 0 && madvise(r.map_base, bytes, advice) != 0) std::perror("madvise file");
  r.data = static_cast<const uint8_t*>(r.map_base);
  r.bytes = bytes;
  return r;
}

// memfd backed by 2 MiB hugetlb pages: needs pages reserved in /proc/sys/vm/nr_hugepages.
bool hugetlb_memfd(Region& r, size_t bytes) {
  const int fd = int(syscall(SYS_memfd_create, "weights", MFD_HUGETLB | MFD_HUGE_2MB));
  if (fd < 0 || ftruncate(fd, off_t(bytes)) != 0) {
    if (fd >= 0) close(fd);
    return false;
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) {
    close(fd);
    return false;
  }
  r.name = "memfd hugetlb 2M";
  r.fd = fd;
  r.map_base = p;
  r.map_bytes = bytes;
  fill(static_cast<uint8_t*>(p), bytes);
  r.data = static_cast<const uint8_t*>(p);
  r.bytes = bytes;
  return true;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string path;
  size_t mib = 1024;
  int rounds = 7, threads = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--file") path = argv[i + 1];
    else if (a == "--mib") mib = std::strtoull(argv[i + 1], nullptr, 10);
    else if (a == "--rounds") rounds = std::atoi(argv[i + 1]);
    else if (a == "--threads") threads = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  const size_t bytes = mib << 20;
  // Small sources are read several times per timing, so that each timing covers ~1 GiB and
  // thread start-up stays negligible. A source that fits in the last-level cache reads at
  // cache speed from the second pass on: that is what the size sweep is meant to show.
  const int passes = int(std::max<size_t>(1, 1024 / mib));

  std::vector<Region> regions;
  regions.push_back(anon("anon 4K (nohugepage)", bytes, MADV_NOHUGEPAGE));
  regions.push_back(anon("anon THP (madv_hugepage)", bytes, MADV_HUGEPAGE));
  regions.push_back(anon_scattered("anon 4K, shuffled faults", bytes));
  if (!path.empty()) {
    regions.push_back(file_map("file mmap", path, bytes, 0, 0));
    regions.push_back(file_map("file mmap populate+willneed", path, bytes, MAP_POPULATE, MADV_WILLNEED));
    regions.push_back(file_map("file mmap madv_hugepage", path, bytes, MAP_POPULATE, MADV_HUGEPAGE));
  }
  Region huge;
  if (hugetlb_memfd(huge, bytes)) regions.push_back(huge);
  else std::printf("(memfd hugetlb: not available, /proc/sys/vm/nr_hugepages too small)\n");

  for (Region& r : regions) touch_all(r);  // fault in every page before timing
  std::printf("%-30s %12s %12s %12s\n", "source", "AnonHuge KiB", "FilePmd KiB", "Hugetlb KiB");
  for (const Region& r : regions)
    std::printf("%-30s %12zu %12zu %12zu\n", r.name.c_str(), smaps_kib(r.map_base, "AnonHugePages"),
                smaps_kib(r.map_base, "FilePmdMapped"), smaps_kib(r.map_base, "Private_Hugetlb") + smaps_kib(r.map_base, "Shared_Hugetlb"));

  struct Variant {
    int streams;
    bool prefetch;
  };
  const Variant variants[] = {{1, false}, {1, true}, {2, false}, {2, true}};
  // gbs[variant][region] = one GB/s figure per round
  std::vector<std::vector<std::vector<double>>> gbs(std::size(variants), std::vector<std::vector<double>>(regions.size()));
  for (int round = 0; round < rounds; ++round) {
    for (size_t v = 0; v < std::size(variants); ++v) {
      for (size_t i = 0; i < regions.size(); ++i) {
        const Region& r = regions[i];
        const size_t share = r.bytes / size_t(threads) / 4096 * 4096;
        std::vector<uint64_t> sums(static_cast<size_t>(threads));
        const double s = timed_parallel(threads, [&](int t) {
          for (int pass = 0; pass < passes; ++pass)
            sums[size_t(t)] += read_range(r.data + share * size_t(t), share, variants[v].streams, variants[v].prefetch);
        });
        gbs[v][i].push_back(double(share) * threads * passes / s * 1e-9);
      }
    }
  }
  std::printf("\n%d thread(s), %zu MiB per source (%d passes per timing), %d rounds: median / best GB/s\n", threads, mib, passes, rounds);
  std::printf("%-30s", "source");
  for (const Variant& v : variants) {
    char head[40];
    std::snprintf(head, sizeof(head), "%d stream%s%s", v.streams, v.streams > 1 ? "s" : "", v.prefetch ? " +pf" : "");
    std::printf(" %16s", head);
  }
  std::printf("\n");
  for (size_t i = 0; i < regions.size(); ++i) {
    std::printf("%-30s", regions[i].name.c_str());
    for (size_t v = 0; v < std::size(variants); ++v) {
      char cell[40];
      std::snprintf(cell, sizeof(cell), "%.1f / %.1f", median(gbs[v][i]), *std::max_element(gbs[v][i].begin(), gbs[v][i].end()));
      std::printf(" %16s", cell);
    }
    std::printf("\n");
  }
  for (Region& r : regions) {
    munmap(r.map_base, r.map_bytes);
    if (r.fd >= 0) close(r.fd);
  }
  return 0;
}
