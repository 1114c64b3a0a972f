// Scratch memory for kernels, drawn from the caching allocator, plus small View helpers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

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

// An uninitialised contiguous temporary of the given dtype and shape.
Temp make_temp(DType dtype, const int64_t* shape, int ndim);
// A contiguous copy of v converted to dtype.
Temp to_contiguous(const View& v, DType dtype);

}  // namespace kael
