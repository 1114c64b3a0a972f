// The caching host allocator (see NOTE [caching allocator] in allocator.h).
#include "allocator.h"

#include <pthread.h>
#include <sys/mman.h>
#ifdef __GLIBC__
#include <malloc.h>  // malloc_trim
#endif

#include <cstdlib>
#include <cstring>
#include <new>

namespace kael {
namespace {

constexpr size_t kAlign = 64;
constexpr size_t kHeader = 64;                    // bookkeeping before each user block
constexpr size_t kColourMin = size_t{16} * 1024;  // blocks this large get a page colour
constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kHugeMin = size_t{4} << 20;        // blocks this large ask for huge pages
constexpr uint64_t kMagic = 0x6b61656c424c4b31ull;  // "kaelBLK1"

struct Header {
  void* raw;           // what the system returned
  uint64_t cls;        // size class (caching) or exact size (not caching)
  uint64_t requested;  // bytes asked for
  uint64_t magic;
};
static_assert(sizeof(Header) <= kHeader, "header must fit its slot");

Header* header_of(void* user) {
  return reinterpret_cast<Header*>(static_cast<char*>(user) - kHeader);
}

bool env_disables_caching() {
#ifdef KAEL_NO_CACHING_ALLOCATOR
  return true;
#else
  const char* v = std::getenv("KAEL_NO_CACHING_ALLOCATOR");
  return v != nullptr && v[0] != '\0' && std::strcmp(v, "0") != 0;
#endif
}

int64_t env_cache_limit() {
  if (const char* v = std::getenv("KAEL_CPU_CACHE_LIMIT_MB")) {
    char* end = nullptr;
    const long long mb = std::strtoll(v, &end, 10);
    if (end != v && mb >= 0) return static_cast<int64_t>(mb) << 20;
  }
  return int64_t{4096} << 20;
}

CachingAllocator* g_host = nullptr;

}  // namespace

size_t CachingAllocator::size_class(size_t n) {
  if (n <= 64) return 64;
  if (n <= 1024) return (n + 63) & ~size_t{63};
  const int k = 63 - __builtin_clzll(static_cast<unsigned long long>(n - 1));  // 2^k < n <= 2^(k+1)
  const size_t step = size_t{1} << (k - 2);                                    // four classes per octave
  return (n + step - 1) & ~(step - 1);
}

CachingAllocator::CachingAllocator(bool caching, int64_t cache_limit_bytes)
    : caching_(caching), cache_limit_(cache_limit_bytes) {}

CachingAllocator::~CachingAllocator() {
  empty_cache();
}

void* CachingAllocator::system_alloc(size_t cls, size_t nbytes) {
  size_t colour = 0;
  if (caching_ && cls >= kColourMin) {
    colour = static_cast<size_t>(colour_) * kAlign;
    colour_ = (colour_ + 7) % 64;  // 7 is coprime with 64: all 64 offsets in turn
  }
  const size_t total = kHeader + colour + (caching_ ? cls : nbytes);
  void* raw = nullptr;
  // Big blocks sit on transparent huge pages (fewer TLB misses when streaming through
  // them), as NumPy does for its own large arrays.
  const bool huge = total >= kHugeMin;
  if (posix_memalign(&raw, huge ? kHugePage : kAlign, total) != 0) return nullptr;
#ifdef MADV_HUGEPAGE
  if (huge) madvise(raw, total, MADV_HUGEPAGE);  // advisory: failure changes nothing
#endif
  char* user = static_cast<char*>(raw) + kHeader + colour;
  auto* h = header_of(user);
  h->raw = raw;
  h->cls = caching_ ? cls : nbytes;
  h->requested = nbytes;
  h->magic = kMagic;
  return user;
}

void CachingAllocator::system_free(void* user) {
  std::free(header_of(user)->raw);
}

void* CachingAllocator::allocate(size_t nbytes) {
  const size_t cls = caching_ ? size_class(nbytes) : nbytes;
  std::lock_guard<std::mutex> lk(m_);
  void* p = nullptr;
  if (caching_) {
    auto it = free_.find(cls);
    if (it != free_.end() && !it->second.empty()) {
      p = it->second.back();
      it->second.pop_back();
      st_.cached_bytes -= static_cast<int64_t>(cls);
      ++st_.cache_hits;
    }
  }
  if (p == nullptr) {
    p = system_alloc(cls, nbytes);
    if (p == nullptr && st_.cached_bytes > 0) {  // out of memory: give the cache back and retry
      for (auto& kv : free_) {
        for (void* q : kv.second) system_free(q);
        kv.second.clear();
      }
      st_.cached_bytes = 0;
      p = system_alloc(cls, nbytes);
    }
    if (p == nullptr) throw std::bad_alloc();
    ++st_.system_allocs;
  }
  header_of(p)->requested = nbytes;
  ++st_.num_allocs;
  st_.allocated_bytes += static_cast<int64_t>(cls);
  st_.requested_bytes += static_cast<int64_t>(nbytes);
  if (st_.allocated_bytes > st_.peak_allocated_bytes) st_.peak_allocated_bytes = st_.allocated_bytes;
  return p;
}

void CachingAllocator::deallocate(void* p) {
  if (p == nullptr) return;
  Header* h = header_of(p);
  if (h->magic != kMagic) std::abort();  // not ours: memory corruption, nothing sane to do
  const size_t cls = h->cls;
  std::lock_guard<std::mutex> lk(m_);
  ++st_.num_frees;
  st_.allocated_bytes -= static_cast<int64_t>(cls);
  st_.requested_bytes -= static_cast<int64_t>(h->requested);
  if (caching_ && st_.cached_bytes + static_cast<int64_t>(cls) <= cache_limit_) {
    free_[cls].push_back(p);
    st_.cached_bytes += static_cast<int64_t>(cls);
    return;
  }
  system_free(p);
}

MemoryStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lk(m_);
  return st_;
}

void CachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lk(m_);
  st_.peak_allocated_bytes = st_.allocated_bytes;
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lk(m_);
  for (auto& kv : free_) {
    for (void* q : kv.second) system_free(q);
  }
  free_.clear();
  st_.cached_bytes = 0;
#ifdef __GLIBC__
  // NOTE [heap trim]: glibc keeps freed heap memory for reuse: blocks under its mmap threshold (which rises to
  // 32 MiB once a large block has been freed) live on the heap, and free() gives their pages back only at the
  // heap's top. A GGUF load frees the file's copies of every weight after moving them into the weight arena
  // (NOTE [weight arena]): without a trim the process kept them, twice the file's size in all (SmolLM2-135M
  // Q8_0: 281 MiB for a 137 MiB file). malloc_trim(0) returns every free page of every arena, ours and NumPy's.
  malloc_trim(0);
#endif
}

CachingAllocator& host_allocator() {
  static const bool init = [] {
    g_host = new CachingAllocator(!env_disables_caching(), env_cache_limit());  // never destroyed
    // A fork while another thread holds the lock must not leave the child's copy locked.
    pthread_atfork([] { g_host->lock_for_fork(); }, [] { g_host->unlock_after_fork(); },
                   [] { g_host->unlock_after_fork(); });
    return true;
  }();
  (void)init;
  return *g_host;
}

}  // namespace kael
