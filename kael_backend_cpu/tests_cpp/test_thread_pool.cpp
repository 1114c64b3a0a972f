// The thread pool: coverage, grain, nesting, exceptions, concurrent callers, resizing.
#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <thread>
#include <vector>

#include "check.h"
#include "thread_pool.h"

namespace {

using kael::parallel_for;

class ThreadPool : public ::testing::Test {
 protected:
  void SetUp() override { kael::set_num_threads(4); }
  void TearDown() override { kael::set_num_threads(4); }
};

TEST_F(ThreadPool, CoversTheRangeExactlyOnce) {
  for (int64_t n : {0, 1, 7, 1000, 100003}) {
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    parallel_for(0, n, 16, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << "n=" << n << " i=" << i;
  }
}

TEST_F(ThreadPool, OffsetRangesAndChunkSizes) {
  std::atomic<int64_t> total{0};
  std::atomic<int> small_chunks{0};
  parallel_for(100, 1100, 200, [&](int64_t b, int64_t e) {
    if (e - b < 200) small_chunks.fetch_add(1);
    for (int64_t i = b; i < e; ++i) total.fetch_add(i);
  });
  EXPECT_EQ(total.load(), (100 + 1099) * 1000 / 2);
  EXPECT_EQ(small_chunks.load(), 0);
}

TEST_F(ThreadPool, SmallRangesRunInline) {
  const auto me = std::this_thread::get_id();
  bool other = false;
  parallel_for(0, 10, 100, [&](int64_t, int64_t) { other = std::this_thread::get_id() != me; });
  EXPECT_FALSE(other);
  EXPECT_EQ(kael::parallel_chunks(0, 10, 100), 1);
  EXPECT_EQ(kael::parallel_chunks(0, 0, 1), 0);
}

TEST_F(ThreadPool, NestedLoopsRunInlineAndComplete) {
  std::atomic<int64_t> count{0};
  parallel_for(0, 8, 1, [&](int64_t b, int64_t e) {
    EXPECT_TRUE(kael::in_parallel_region());
    for (int64_t i = b; i < e; ++i) {
      parallel_for(0, 1000, 1, [&](int64_t b2, int64_t e2) { count.fetch_add(e2 - b2); });
    }
  });
  EXPECT_EQ(count.load(), 8000);
  EXPECT_FALSE(kael::in_parallel_region());
}

TEST_F(ThreadPool, ExceptionsReachTheCallerAndThePoolSurvives) {
  EXPECT_THROW(parallel_for(0, 1000, 1,
                            [&](int64_t b, int64_t) {
                              if (b > 0) throw std::runtime_error("chunk failed");
                            }),
               std::runtime_error);
  std::atomic<int64_t> sum{0};
  parallel_for(0, 1000, 1, [&](int64_t b, int64_t e) { sum.fetch_add(e - b); });
  EXPECT_EQ(sum.load(), 1000);
}

TEST_F(ThreadPool, SeveralCallerThreadsAtOnce) {
  constexpr int kCallers = 4;
  std::vector<int64_t> results(kCallers, 0);
  std::vector<std::thread> callers;
  callers.reserve(kCallers);
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([c, &results] {
      for (int round = 0; round < 50; ++round) {
        std::atomic<int64_t> sum{0};
        parallel_for(0, 4096, 64, [&](int64_t b, int64_t e) {
          int64_t s = 0;
          for (int64_t i = b; i < e; ++i) s += i;
          sum.fetch_add(s);
        });
        results[static_cast<size_t>(c)] += sum.load();
      }
    });
  }
  for (auto& t : callers) t.join();
  for (int64_t r : results) EXPECT_EQ(r, int64_t{50} * 4095 * 4096 / 2);
}

TEST_F(ThreadPool, ResizingWhileOthersRun) {
  std::atomic<bool> stop{false};
  std::thread worker([&] {
    while (!stop.load()) {
      std::atomic<int64_t> n{0};
      parallel_for(0, 10000, 100, [&](int64_t b, int64_t e) { n.fetch_add(e - b); });
      ASSERT_EQ(n.load(), 10000);
    }
  });
  for (int n : {1, 3, 2, 5, 1, 4}) {
    kael::set_num_threads(n);
    EXPECT_EQ(kael::get_num_threads(), n);
  }
  stop.store(true);
  worker.join();
}

TEST_F(ThreadPool, OneThreadRunsEverythingOnTheCaller) {
  kael::set_num_threads(1);
  const auto me = std::this_thread::get_id();
  std::atomic<int> foreign{0};
  parallel_for(0, 100000, 1, [&](int64_t, int64_t) {
    if (std::this_thread::get_id() != me) foreign.fetch_add(1);
  });
  EXPECT_EQ(foreign.load(), 0);
}

TEST_F(ThreadPool, RejectsBadThreadCounts) {
  EXPECT_THROW(kael::set_num_threads(0), kael::Error);
  EXPECT_THROW(kael::set_num_threads(-3), kael::Error);
}

}  // namespace
