// Scratch memory for kernels, drawn from the caching allocator, plus small View helpers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "allocator.h"
#include "view.h"

namespace kael {

// An owned, 64-byte aligned scratch block.
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(size_t nbytes) : p_(host_allocator().allocate(nbytes)) {}
  ~Buffer() { host_allocator().deallocate(p_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  Buffer& operator=(Buffer&& o) noexcept {
    std::swap(p_, o.p_);
    return *this;
  }
  template <class T = void>
  [[nodiscard]] T* get() const {
    return static_cast<T*>(p_);
  }

 private:
  void* p_ = nullptr;
};

// A contiguous tensor owning its memory: for internal temporaries.
struct Temp {
  Buffer buf;
  View view;
};

// Whether two views' memory ranges intersect.
bool overlaps(const View& a, const View& b);
// Whether two views address exactly the same elements in the same order.
bool same_elements(const View& a, const View& b);

// NOTE [aliasing]: kernels read their inputs as they were before the call, NumPy's rule
// (`t[1:].add_(t[:-1])`). An input sharing memory with an output is copied first, unless
// the kernel is elementwise and the two views address the same elements (in place).
class Unaliased {
 public:
  // Replace `in` by a private copy when reading it while writing `out` would be unsafe.
  void fix(const View& out, View& in, bool elementwise);

 private:
  std::vector<Temp> temps_;
};

// An uninitialised contiguous temporary of the given dtype and shape.
Temp make_temp(DType dtype, const int64_t* shape, int ndim);
// A contiguous copy of v converted to dtype.
Temp to_contiguous(const View& v, DType dtype);

}  // namespace kael
