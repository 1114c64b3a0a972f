// The thread pool: parallel_for(begin, end, grain, fn) over a fixed set of workers.
//
// NOTE [thread pool]: the pool has num_threads() - 1 workers; the calling thread
// takes part. A region is a shared Job: its range is cut into up to four chunks per
// thread that threads claim one at a time, so a thread the OS deschedules leaves its
// share to the others, and the caller returns as soon as every chunk is done (a worker
// waking late finds nothing left). One region runs at a time: a second caller
// (another Python thread, or a nested parallel_for inside a chunk) runs its loop
// inline on its own thread, so the pool is safe from several threads and never
// deadlocks or oversubscribes. Workers spin briefly after each region (back-to-back
// kernels start fast), then sleep on a condition variable. The first exception a chunk
// throws is rethrown on the caller once every chunk has finished. After fork() the
// child starts a fresh pool on first use.
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

namespace kael {

// A non-owning reference to a callable void(int64_t begin, int64_t end).
class RangeFn {
 public:
  template <class F, class = std::enable_if_t<!std::is_same_v<std::decay_t<F>, RangeFn>>>
  RangeFn(F&& f)  // NOLINT(google-explicit-constructor, bugprone-forwarding-reference-overload)
      : obj_(const_cast<void*>(static_cast<const void*>(&f))),
        call_([](void* o, int64_t b, int64_t e) { (*static_cast<std::remove_reference_t<F>*>(o))(b, e); }) {}
  void operator()(int64_t b, int64_t e) const { call_(obj_, b, e); }

 private:
  void* obj_;
  void (*call_)(void*, int64_t, int64_t);
};

// Threads used by parallel_for (>= 1). Default: KAEL_NUM_THREADS, else the CPUs
// this process may run on.
int get_num_threads();
// Resize the pool (n >= 1); waits for a running region to finish.
void set_num_threads(int n);
// True inside a parallel_for chunk (nested loops then run inline).
bool in_parallel_region();

// Call fn(b, e) on disjoint sub-ranges covering [begin, end), in parallel when the
// range holds more than `grain` iterations. Each sub-range but the last has at
// least `grain` iterations. Returns after every chunk has run. parallel_for(0, p, 1, f)
// with p <= parallel_width() runs each index as its own chunk.
void parallel_for(int64_t begin, int64_t end, int64_t grain, RangeFn fn);

// How many chunks parallel_for would use for this range (1 when it runs inline; up to
// four per thread, so threads that fall behind hand their work to the others).
int64_t parallel_chunks(int64_t begin, int64_t end, int64_t grain);

// Threads a parallel_for started here would run on (1 inside a parallel region).
int parallel_width();

}  // namespace kael
