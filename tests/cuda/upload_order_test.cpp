// A new buffer's zero fill happens before anything the backend writes into it. allocate()
// zero-fills its buffers with cudaMemset, which runs on the legacy default stream; the
// backend's own stream does not wait for that stream, so a fill still queued there would
// overwrite an upload issued right after the allocation (seen once: a test's weights partly
// zero). Here the default stream is held busy (a spinning kernel, ~10 ms) while a buffer is
// allocated and uploaded to through each path of CudaBackend::upload: a step slot (4 KB,
// inside a pass), the pinned ring (20 KB) and the direct copy (40 MB, over half the pinned
// buffer). After the device is idle the buffer must hold the uploaded bytes. Skips without a
// GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "cuda_test_support.h"
#include "default_stream_busy.h"

namespace kiln::testing {
namespace {

TEST(CudaUploads, LandAfterTheNewBuffersZeroFill) {
  KILN_REQUIRE_GPU();
  CudaBackend gpu{CudaOptions{}};
  std::mt19937_64 rng(20261201);
  for (const size_t bytes : {size_t(4096), size_t(20480), size_t(40) << 20}) {
    std::vector<uint8_t> sent(bytes), got(bytes);
    for (size_t i = 0; i < bytes; i += 8) {
      const uint64_t v = rng() | 0x0101010101010101ull;  // no zero byte: a zero is a lost write
      std::memcpy(sent.data() + i, &v, std::min<size_t>(8, bytes - i));
    }
    ASSERT_TRUE(keep_default_stream_busy(20'000'000)) << "spin kernel launch";
    const std::unique_ptr<Buffer> buffer = gpu.allocate(bytes);
    const Tensor t = buffer->view(GgmlType::I8, {int64_t(bytes)});
    gpu.upload(sent.data(), t, bytes);
    gpu.synchronize();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    gpu.download(t, got.data(), bytes);
    size_t first_bad = bytes;
    for (size_t i = 0; i < bytes && first_bad == bytes; ++i)
      if (got[i] != sent[i]) first_bad = i;
    ASSERT_EQ(first_bad, bytes) << bytes << " bytes: byte " << first_bad << " is " << int(got[first_bad])
                                << ", uploaded " << int(sent[first_bad]);
  }
}

}  // namespace
}  // namespace kiln::testing
