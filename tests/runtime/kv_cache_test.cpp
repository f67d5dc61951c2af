// The KV cache's element type: f16 caches are allocated as f16 tensors of half the bytes,
// other types are refused, and the memory estimate counts the type's size.
#include <gtest/gtest.h>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "runtime/kv_cache.h"
#include "runtime/memory_estimate.h"

namespace kiln {
namespace {

KvCacheConfig small_config(GgmlType dtype) {
  KvCacheConfig c;
  c.n_layer = 3;
  c.layer_has_kv = {true, false, true};
  c.n_head_kv = 2;
  c.head_dim_k = 24;
  c.head_dim_v = 40;
  c.n_ctx = 37;
  c.block_size = 16;
  c.dtype = dtype;
  return c;
}

TEST(KvCache, F16EntriesTakeTwoBytes) {
  CpuBackend backend(1);
  const int64_t slots = 48;  // 37 tokens in blocks of 16
  for (GgmlType type : {GgmlType::F32, GgmlType::F16}) {
    const KvCache cache(backend, small_config(type));
    const size_t element = type == GgmlType::F16 ? 2 : 4;
    for (int il : {0, 2}) {
      const KvLayer l = cache.layer(il);
      EXPECT_EQ(l.k.dtype, type);
      EXPECT_EQ(l.v.dtype, type);
      EXPECT_EQ(l.k.ne[0], 2 * 24);
      EXPECT_EQ(l.v.ne[0], 2 * 40);
      EXPECT_EQ(l.k.ne[1], slots);
      EXPECT_EQ(l.k.nb[1], 2 * 24 * element);
      EXPECT_EQ(l.v.bytes(), size_t(slots) * 2 * 40 * element);
    }
  }
}

TEST(KvCache, OtherEntryTypesAreRefused) {
  CpuBackend backend(1);
  try {
    KvCache cache(backend, small_config(GgmlType::Q8_0));
    FAIL() << "no exception";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("kv cache"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("q8_0"), std::string::npos) << e.what();
  }
}

TEST(MemoryEstimate, KvCacheBytesFollowTheEntryType) {
  HParams hp;
  hp.n_layer = 4, hp.n_embd = 64, hp.n_head = 8, hp.n_head_kv = 2, hp.head_dim_k = 8, hp.head_dim_v = 8;
  hp.n_ff = 172, hp.n_vocab = 512;
  // 100 tokens occupy 7 blocks of 16 slots; each slot holds 2 heads x (8 + 8) values per layer.
  const uint64_t values = 4ull * 112 * 2 * 16;
  EXPECT_EQ(estimate_memory(hp, 100, 32, GgmlType::F32).kv_cache_bytes, values * 4);
  EXPECT_EQ(estimate_memory(hp, 100, 32, GgmlType::F16).kv_cache_bytes, values * 2);
}

}  // namespace
}  // namespace kiln
