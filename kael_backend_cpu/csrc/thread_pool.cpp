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
#include <memory>
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

// One parallel region. Shared by the caller and the workers that join it: a worker
// that wakes late still holds the job, finds no chunk left and never touches fn.
struct Job {
  Job(RangeFn f, int64_t b, int64_t l, int64_t n) : fn(f), begin(b), len(l), nchunks(n) {}
  RangeFn fn;
  int64_t begin, len, nchunks;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  std::mutex err_m;
  std::exception_ptr error;

  void work() {
    const bool was = t_in_region;
    t_in_region = true;
    for (;;) {
      const int64_t i = next.fetch_add(1, std::memory_order_relaxed);
      if (i >= nchunks) break;
      try {
        fn(begin + len * i / nchunks, begin + len * (i + 1) / nchunks);
      } catch (...) {
        std::lock_guard<std::mutex> lk(err_m);
        if (!error) error = std::current_exception();
      }
      done.fetch_add(1, std::memory_order_acq_rel);
    }
    t_in_region = was;
  }
};

class Pool {
 public:
  explicit Pool(int n) : n_(n) {
    threads_.reserve(static_cast<size_t>(n - 1));
    for (int i = 1; i < n; ++i) threads_.emplace_back([this] { worker(); });
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

  // Run fn over [begin, end) in nchunks chunks; the caller holds run_mutex() and takes
  // part, and returns once every chunk is done (idle workers are not waited for).
  void run(int64_t begin, int64_t end, int64_t nchunks, RangeFn fn) {
    auto job = std::make_shared<Job>(fn, begin, end - begin, nchunks);
    {
      std::lock_guard<std::mutex> lk(m_);
      job_ = job;
      gen_.fetch_add(1, std::memory_order_release);
    }
    cv_.notify_all();
    job->work();
    int spins = 0;
    while (job->done.load(std::memory_order_acquire) < nchunks) {
      if (++spins < 2048) {
        KAEL_CPU_RELAX();
      } else {
        std::this_thread::yield();  // a worker holding a chunk may need this core
      }
    }
    {
      std::lock_guard<std::mutex> lk(m_);
      if (job_ == job) job_.reset();
    }
    if (job->error) std::rethrow_exception(job->error);
  }

 private:
  void worker() {
    uint64_t seen = 0;  // generation 0: no region yet, whenever this thread starts
    for (;;) {
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0;; ++i) {
        if (gen_.load(std::memory_order_acquire) != seen) break;
        if ((i & 255) == 255 && std::chrono::steady_clock::now() - start > kSpin) break;
        KAEL_CPU_RELAX();
      }
      std::shared_ptr<Job> job;
      {
        std::unique_lock<std::mutex> lk(m_);
        cv_.wait(lk, [&] { return stop_ || gen_.load(std::memory_order_relaxed) != seen; });
        if (stop_) return;
        seen = gen_.load(std::memory_order_relaxed);
        job = job_;
      }
      if (job) job->work();
    }
  }

  const int n_;
  std::vector<std::thread> threads_;
  std::mutex run_mutex_;
  std::mutex m_;  // guards job_ and stop_; gen_ changes under it
  std::condition_variable cv_;
  bool stop_ = false;
  std::atomic<uint64_t> gen_{0};
  std::shared_ptr<Job> job_;
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

int get_num_threads() {
  return configured_threads();
}

void set_num_threads(int n) {
  KAEL_CHECK(n >= 1 && n <= 1024, Kael, "set_num_threads: expected 1 <= n <= 1024, got ", n);
  std::lock_guard<std::mutex> lk(*g_mutex);
  g_threads.store(n, std::memory_order_relaxed);
  if (g_pool != nullptr && g_pool->size() != n) {
    { std::lock_guard<std::mutex> wait_region(g_pool->run_mutex()); }
    delete g_pool;
    g_pool = nullptr;
  }
}

bool in_parallel_region() {
  return t_in_region;
}

int parallel_width() {
  return t_in_region ? 1 : configured_threads();
}

int64_t parallel_chunks(int64_t begin, int64_t end, int64_t grain) {
  const int64_t len = end - begin;
  if (len <= 0) return 0;
  grain = std::max<int64_t>(grain, 1);
  if (t_in_region || len <= grain) return 1;
  // up to 4 chunks per thread: a thread that falls behind (descheduled on a busy machine)
  // leaves its remaining chunks to the others
  return std::max<int64_t>(1, std::min<int64_t>(int64_t{4} * configured_threads(), len / grain));
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
  pool->run(begin, end, nchunks, fn);
}

}  // namespace kael
