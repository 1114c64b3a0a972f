// The thread pool behind parallel_for (see NOTE [thread pool] in thread_pool.h).
#include "thread_pool.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "check.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KAEL_CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define KAEL_CPU_RELAX() __asm__ __volatile__("yield")
#else
#define KAEL_CPU_RELAX() ((void)0)
#endif

namespace kael {
namespace {

thread_local bool t_in_region = false;

// How long a worker spins for the next region before it sleeps.
constexpr auto kSpin = std::chrono::microseconds(200);

class Pool {
 public:
  explicit Pool(int n) : n_(n) {
    threads_.reserve(static_cast<size_t>(n - 1));
    // Workers start from generation 0: a region published before a worker first runs is still its to join.
    for (int i = 1; i < n; ++i) threads_.emplace_back([this] { worker(0); });
  }
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;
  ~Pool() {
    {
      std::lock_guard<std::mutex> lk(m_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

  [[nodiscard]] int size() const { return n_; }
  std::mutex& run_mutex() { return run_mutex_; }

  // Run fn over [begin, end) in nchunks chunks; the caller holds run_mutex().
  void run(int64_t begin, int64_t end, int64_t nchunks, RangeFn fn) {
    fn_ = &fn;
    begin_ = begin;
    len_ = end - begin;
    nchunks_ = nchunks;
    next_.store(0, std::memory_order_relaxed);
    finished_.store(0, std::memory_order_relaxed);
    error_ = nullptr;
    gen_.fetch_add(1, std::memory_order_release);
    { std::lock_guard<std::mutex> lk(m_); }  // a worker between its check and its wait sees the new generation
    cv_.notify_all();
    work();
    int spins = 0;
    while (finished_.load(std::memory_order_acquire) < n_ - 1) {
      if (++spins < 4096) {
        KAEL_CPU_RELAX();
      } else {
        std::this_thread::yield();
      }
    }
    fn_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void work() {
    const bool was = t_in_region;
    t_in_region = true;
    for (;;) {
      const int64_t i = next_.fetch_add(1, std::memory_order_relaxed);
      if (i >= nchunks_) break;
      const int64_t b = begin_ + len_ * i / nchunks_;
      const int64_t e = begin_ + len_ * (i + 1) / nchunks_;
      try {
        (*fn_)(b, e);
      } catch (...) {
        std::lock_guard<std::mutex> lk(err_m_);
        if (!error_) error_ = std::current_exception();
      }
    }
    t_in_region = was;
  }

  void worker(uint64_t seen) {
    for (;;) {
      const auto start = std::chrono::steady_clock::now();
      bool ready = false;
      for (int i = 0;; ++i) {
        if (gen_.load(std::memory_order_acquire) != seen) {
          ready = true;
          break;
        }
        if ((i & 255) == 255 && std::chrono::steady_clock::now() - start > kSpin) break;
        KAEL_CPU_RELAX();
      }
      if (!ready) {
        std::unique_lock<std::mutex> lk(m_);
        cv_.wait(lk, [&] { return stop_ || gen_.load(std::memory_order_acquire) != seen; });
        if (stop_) return;
      }
      {
        std::lock_guard<std::mutex> lk(m_);
        if (stop_) return;
      }
      seen = gen_.load(std::memory_order_acquire);
      work();
      finished_.fetch_add(1, std::memory_order_release);
    }
  }

  const int n_;
  std::vector<std::thread> threads_;
  std::mutex run_mutex_;
  std::mutex m_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::atomic<uint64_t> gen_{0};
  std::atomic<int64_t> next_{0};
  std::atomic<int> finished_{0};
  const RangeFn* fn_ = nullptr;
  int64_t begin_ = 0, len_ = 0, nchunks_ = 0;
  std::mutex err_m_;
  std::exception_ptr error_;
};

int default_threads() {
  if (const char* env = std::getenv("KAEL_NUM_THREADS")) {
    char* end = nullptr;
    const long v = std::strtol(env, &end, 10);
    if (end != env && *end == '\0' && v >= 1 && v <= 1024) return static_cast<int>(v);
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n >= 1) return n;
  }
  const unsigned hw = std::thread::hardware_concurrency();
  return hw ? static_cast<int>(hw) : 1;
}

// Heap-allocated and never destroyed: a child after fork() must not touch the
// parent's threads or possibly-locked mutexes, so it simply forgets them.
std::mutex* g_mutex = new std::mutex;
Pool* g_pool = nullptr;
std::atomic<int> g_threads{0};
std::once_flag g_atfork_once;

void after_fork_in_child() {
  g_mutex = new std::mutex;  // NOLINT(cppcoreguidelines-owning-memory): the old one may be locked
  g_pool = nullptr;          // the parent's workers do not exist here
  t_in_region = false;
}

int configured_threads() {
  int n = g_threads.load(std::memory_order_relaxed);
  if (n == 0) {
    int expected = 0;
    g_threads.compare_exchange_strong(expected, default_threads());
    n = g_threads.load(std::memory_order_relaxed);
  }
  return n;
}

// The pool for n threads, created on first use (caller holds *g_mutex).
Pool* pool_locked(int n) {
  std::call_once(g_atfork_once, [] { pthread_atfork(nullptr, nullptr, after_fork_in_child); });
  if (g_pool == nullptr || g_pool->size() != n) {
    if (g_pool != nullptr) {
      std::lock_guard<std::mutex> wait_region(g_pool->run_mutex());
    }
    delete g_pool;
    g_pool = new Pool(n);
  }
  return g_pool;
}

}  // namespace

int get_num_threads() { return configured_threads(); }

void set_num_threads(int n) {
  KAEL_CHECK(n >= 1 && n <= 1024, Kael, "set_num_threads: expected 1 <= n <= 1024, got ", n);
  std::lock_guard<std::mutex> lk(*g_mutex);
  g_threads.store(n, std::memory_order_relaxed);
  if (g_pool != nullptr && g_pool->size() != n) {
    {
      std::lock_guard<std::mutex> wait_region(g_pool->run_mutex());
    }
    delete g_pool;
    g_pool = nullptr;
  }
}

bool in_parallel_region() { return t_in_region; }

int64_t parallel_chunks(int64_t begin, int64_t end, int64_t grain) {
  const int64_t len = end - begin;
  if (len <= 0) return 0;
  grain = std::max<int64_t>(grain, 1);
  if (t_in_region || len <= grain) return 1;
  return std::max<int64_t>(1, std::min<int64_t>(configured_threads(), len / grain));
}

void parallel_for(int64_t begin, int64_t end, int64_t grain, RangeFn fn) {
  const int64_t nchunks = parallel_chunks(begin, end, grain);
  if (nchunks == 0) return;
  if (nchunks == 1) {
    fn(begin, end);
    return;
  }
  std::unique_lock<std::mutex> glk(*g_mutex);
  Pool* pool = pool_locked(configured_threads());
  std::unique_lock<std::mutex> region(pool->run_mutex(), std::try_to_lock);
  glk.unlock();
  if (!region.owns_lock()) {  // another thread's region is running: do ours inline
    fn(begin, end);
    return;
  }
  pool->run(begin, end, std::min<int64_t>(nchunks, pool->size()), fn);
}

}  // namespace kael
