// The caching allocator: size classes, alignment, reuse, colouring, statistics, threads.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

#include "allocator.h"

namespace {

using kael::CachingAllocator;

TEST(SizeClass, CoversTheRequestWithBoundedWaste) {
  size_t prev = 0;
  for (size_t n = 0; n < (size_t{1} << 22); n = n < 4096 ? n + 1 : n + n / 7 + 1) {
    const size_t c = CachingAllocator::size_class(n);
    EXPECT_GE(c, n);
    EXPECT_GE(c, prev);
    EXPECT_EQ(c % 64, 0u) << n;
    EXPECT_LE(c, n + n / 4 + 64) << n;  // at most 25% waste (plus the 64-byte floor)
    prev = c;
  }
  EXPECT_EQ(CachingAllocator::size_class(0), 64u);
  EXPECT_EQ(CachingAllocator::size_class(1025), 1280u);
  EXPECT_EQ(CachingAllocator::size_class(1 << 20), size_t{1} << 20);
}

TEST(Allocator, BlocksAreAlignedAndWritable) {
  for (bool caching : {true, false}) {
    CachingAllocator a(caching);
    std::vector<void*> blocks;
    for (size_t n : {0, 1, 63, 64, 65, 1000, 4096, 100000, 3000000}) {
      void* p = a.allocate(n);
      ASSERT_NE(p, nullptr);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u) << n;
      std::memset(p, 0xAB, n);
      blocks.push_back(p);
    }
    for (void* p : blocks) a.deallocate(p);
    a.deallocate(nullptr);
  }
}

TEST(Allocator, ReusesFreedBlocksOfTheSameClass) {
  CachingAllocator a(true);
  void* p = a.allocate(10000);
  a.deallocate(p);
  EXPECT_EQ(a.stats().cached_bytes, static_cast<int64_t>(CachingAllocator::size_class(10000)));
  void* q = a.allocate(9990);  // same size class
  EXPECT_EQ(p, q);
  const kael::MemoryStats s = a.stats();
  EXPECT_EQ(s.cache_hits, 1);
  EXPECT_EQ(s.system_allocs, 1);
  EXPECT_EQ(s.cached_bytes, 0);
  a.deallocate(q);
}

TEST(Allocator, WithoutCachingNothingIsKept) {
  CachingAllocator a(false);
  void* p = a.allocate(10000);
  EXPECT_EQ(a.stats().allocated_bytes, 10000);
  a.deallocate(p);
  const kael::MemoryStats s = a.stats();
  EXPECT_EQ(s.cached_bytes, 0);
  EXPECT_EQ(s.allocated_bytes, 0);
  EXPECT_EQ(s.cache_hits, 0);
  EXPECT_FALSE(a.caching());
}

TEST(Allocator, StatisticsTrackAllocatedPeakAndCached) {
  CachingAllocator a(true);
  void* p = a.allocate(1 << 20);
  void* q = a.allocate(1 << 19);
  kael::MemoryStats s = a.stats();
  EXPECT_EQ(s.allocated_bytes, (1 << 20) + (1 << 19));
  EXPECT_EQ(s.requested_bytes, (1 << 20) + (1 << 19));
  EXPECT_EQ(s.peak_allocated_bytes, s.allocated_bytes);
  a.deallocate(p);
  s = a.stats();
  EXPECT_EQ(s.allocated_bytes, 1 << 19);
  EXPECT_EQ(s.peak_allocated_bytes, (1 << 20) + (1 << 19));
  EXPECT_EQ(s.cached_bytes, 1 << 20);
  a.reset_peak();
  EXPECT_EQ(a.stats().peak_allocated_bytes, 1 << 19);
  a.empty_cache();
  EXPECT_EQ(a.stats().cached_bytes, 0);
  a.deallocate(q);
  EXPECT_EQ(a.stats().allocated_bytes, 0);
  EXPECT_EQ(a.stats().num_allocs, 2);
  EXPECT_EQ(a.stats().num_frees, 2);
}

TEST(Allocator, LargeBlocksGetDifferentPageOffsets) {
  CachingAllocator a(true);
  std::vector<void*> blocks;
  std::set<uintptr_t> offsets;
  for (int i = 0; i < 8; ++i) {
    blocks.push_back(a.allocate(size_t{1} << 22));
    offsets.insert(reinterpret_cast<uintptr_t>(blocks.back()) % 4096);
  }
  EXPECT_EQ(offsets.size(), 8u);
  for (void* p : blocks) a.deallocate(p);
}

TEST(Allocator, CacheLimitIsHonoured) {
  CachingAllocator a(true, 1 << 20);
  void* p = a.allocate(1 << 20);
  void* q = a.allocate(1 << 20);
  a.deallocate(p);
  a.deallocate(q);  // over the limit: really freed
  EXPECT_EQ(a.stats().cached_bytes, 1 << 20);
}

TEST(Allocator, ManyThreadsAllocateAndFree) {
  CachingAllocator a(true);
  std::vector<std::thread> ts;
  ts.reserve(4);
  for (int t = 0; t < 4; ++t) {
    ts.emplace_back([&a, t] {
      std::vector<void*> mine;
      for (int i = 0; i < 2000; ++i) {
        mine.push_back(a.allocate(static_cast<size_t>(64 * (1 + (i * 7 + t) % 50))));
        std::memset(mine.back(), t, 64);
        if (i % 3 == 0) {
          a.deallocate(mine.back());
          mine.pop_back();
        }
      }
      for (void* p : mine) a.deallocate(p);
    });
  }
  for (auto& th : ts) th.join();
  EXPECT_EQ(a.stats().allocated_bytes, 0);
  EXPECT_EQ(a.stats().num_allocs, a.stats().num_frees);
}

TEST(Allocator, TheProcessAllocatorFollowsTheBuild) {
#ifdef KAEL_NO_CACHING_ALLOCATOR
  EXPECT_FALSE(kael::host_allocator().caching());
#else
  void* p = kael::host_allocator().allocate(100);
  kael::host_allocator().deallocate(p);
  SUCCEED();
#endif
}

}  // namespace
