// The caching host allocator behind every tensor this backend allocates.
//
// NOTE [caching allocator]: blocks are 64-byte aligned and rounded up to size
// classes (four per power of two); a freed block goes to its class's free list
// and the next request of that class reuses it, so steady-state training and
// decoding make no system allocations and touch no fresh pages. Blocks of 16 KiB
// and more start at a rotating offset inside their first page (a multiple of 64
// bytes), so the source and destination of a large copy do not share a page
// offset and alias in the cache; blocks of 4 MiB and more are 2 MiB aligned and
// advised onto transparent huge pages. KAEL_NO_CACHING_ALLOCATOR=1 (read once, at first
// use) or the sanitizer builds (macro KAEL_NO_CACHING_ALLOCATOR) free blocks at
// once, with exact sizes, so ASan sees every overflow. The cache holds at most
// KAEL_CPU_CACHE_LIMIT_MB mebibytes (default 4096); beyond that frees are real.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace kael {

struct MemoryStats {
  int64_t allocated_bytes = 0;       // bytes in live blocks (size-class rounded)
  int64_t requested_bytes = 0;       // bytes asked for by live blocks
  int64_t peak_allocated_bytes = 0;  // high-water mark of allocated_bytes since the last reset
  int64_t cached_bytes = 0;          // bytes held in free lists for reuse
  int64_t num_allocs = 0;            // allocations served
  int64_t num_frees = 0;
  int64_t cache_hits = 0;     // allocations served from a free list
  int64_t system_allocs = 0;  // allocations that went to the system
};

class CachingAllocator {
 public:
  // caching=false: every free goes back to the system at once.
  explicit CachingAllocator(bool caching, int64_t cache_limit_bytes = int64_t{4} << 30);
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // A 64-byte aligned block of at least nbytes bytes (nbytes may be 0). Throws
  // std::bad_alloc when the system has no memory even after emptying the cache.
  void* allocate(size_t nbytes);
  // Give back a block from allocate(); nullptr is ignored.
  void deallocate(void* p);

  [[nodiscard]] MemoryStats stats() const;
  void reset_peak();
  // Return every cached block to the system, then (glibc) every free page of the C heap: NOTE [heap trim].
  void empty_cache();
  [[nodiscard]] bool caching() const { return caching_; }

  // pthread_atfork helpers: hold the lock across fork() so the child's copy is consistent.
  void lock_for_fork() { m_.lock(); }
  void unlock_after_fork() { m_.unlock(); }

  // The size class a request of nbytes is rounded up to.
  static size_t size_class(size_t nbytes);

 private:
  void* system_alloc(size_t cls, size_t nbytes);
  static void system_free(void* user);

  const bool caching_;
  const int64_t cache_limit_;
  mutable std::mutex m_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  MemoryStats st_;
  uint32_t colour_ = 0;
};

// The process-wide allocator (caching unless KAEL_NO_CACHING_ALLOCATOR says no).
CachingAllocator& host_allocator();

}  // namespace kael
