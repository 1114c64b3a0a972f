// KAEL_CHECK and the error type kernels throw: a kernel never aborts, it throws
// kael::Error with a kind that bindings.cpp maps onto the kael.KaelError family.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace kael {

// The Python class each kind becomes (see bindings.cpp).
enum class ErrorKind {
  Kael,          // kael.KaelError
  Shape,         // kael.ShapeError
  DType,         // kael.DTypeError
  Index,         // kael.IndexError_
  ZeroDivision,  // a KaelError that is also a ZeroDivisionError
  Backend,       // kael.BackendError
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& msg) : std::runtime_error(msg), kind_(kind) {}
  [[nodiscard]] ErrorKind kind() const noexcept { return kind_; }

 private:
  ErrorKind kind_;
};

namespace detail {

template <class... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

// Throws kael::Error(kind, "<msg> (<file>:<line>)").
[[noreturn]] void throw_error(ErrorKind kind, const char* file, int line, const std::string& msg);

}  // namespace detail
}  // namespace kael

// KAEL_CHECK(cond, Kind, message parts...): throw kael::Error of ErrorKind::Kind
// when cond is false. The message names the op, the values and the expectation.
#define KAEL_CHECK(cond, kind, ...)                                                                               \
  do {                                                                                                            \
    if (__builtin_expect(!(cond), 0)) {                                                                           \
      ::kael::detail::throw_error(::kael::ErrorKind::kind, __FILE__, __LINE__, ::kael::detail::cat(__VA_ARGS__)); \
    }                                                                                                             \
  } while (0)
