// View helpers, dtype facts, error raising and scratch temporaries.
#include "view.h"

#include <cstring>

#include "buffer.h"
#include "check.h"
#include "kernels.h"

namespace kael {

namespace detail {
void throw_error(ErrorKind kind, const char* file, int line, const std::string& msg) {
  const char* base = std::strrchr(file, '/');
  throw Error(kind, cat(msg, " (", base ? base + 1 : file, ":", line, ")"));
}
}  // namespace detail

int64_t itemsize(DType d) {
  switch (d) {
    case DType::Bool:
    case DType::UInt8:
    case DType::Int8:
      return 1;
    case DType::Int16:
    case DType::Float16:
    case DType::BFloat16:
      return 2;
    case DType::Int32:
    case DType::Float32:
      return 4;
    case DType::Int64:
    case DType::Float64:
      return 8;
  }
  return 1;
}

const char* dtype_name(DType d) {
  static const char* const names[kNumDTypes] = {"bool",  "uint8",   "int8",     "int16",   "int32",
                                                "int64", "float16", "bfloat16", "float32", "float64"};
  const auto i = static_cast<int>(d);
  return i >= 0 && i < kNumDTypes ? names[i] : "?";
}

View contiguous_view(void* data, DType dtype, const int64_t* shape, int ndim) {
  KAEL_CHECK(ndim >= 0 && ndim <= kMaxDims, Shape, "at most ", kMaxDims, " dims are supported, got ", ndim);
  View v;
  v.data = static_cast<char*>(data);
  v.dtype = dtype;
  v.ndim = ndim;
  int64_t acc = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    v.shape[d] = shape[d];
    v.strides[d] = acc;
    acc *= shape[d] > 0 ? shape[d] : 1;
  }
  return v;
}

View contiguous_view(void* data, DType dtype, std::initializer_list<int64_t> shape) {
  return contiguous_view(data, dtype, shape.begin(), static_cast<int>(shape.size()));
}

View select(const View& v, int dim, int64_t i) {
  View r;
  r.dtype = v.dtype;
  r.data = v.data + i * v.strides[dim] * v.elsize();
  r.ndim = v.ndim - 1;
  for (int d = 0, j = 0; d < v.ndim; ++d) {
    if (d == dim) continue;
    r.shape[j] = v.shape[d];
    r.strides[j] = v.strides[d];
    ++j;
  }
  return r;
}

View narrow(const View& v, int dim, int64_t start, int64_t len) {
  View r = v;
  r.data = v.data + start * v.strides[dim] * v.elsize();
  r.shape[dim] = len;
  return r;
}

View transpose(const View& v, int d0, int d1) {
  View r = v;
  std::swap(r.shape[d0], r.shape[d1]);
  std::swap(r.strides[d0], r.strides[d1]);
  return r;
}

bool overlaps(const View& a, const View& b) {
  const int64_t na = a.numel(), nb = b.numel();
  if (na == 0 || nb == 0) return false;
  int64_t ea = 0, eb = 0;  // offsets of the last elements
  for (int d = 0; d < a.ndim; ++d) ea += (a.shape[d] - 1) * a.strides[d];
  for (int d = 0; d < b.ndim; ++d) eb += (b.shape[d] - 1) * b.strides[d];
  const char* a_end = a.data + (ea + 1) * a.elsize();
  const char* b_end = b.data + (eb + 1) * b.elsize();
  return a.data < b_end && b.data < a_end;
}

bool same_elements(const View& a, const View& b) {
  if (a.data != b.data || a.ndim != b.ndim || a.elsize() != b.elsize()) return false;
  for (int d = 0; d < a.ndim; ++d) {
    if (a.shape[d] != b.shape[d] || (a.shape[d] > 1 && a.strides[d] != b.strides[d])) return false;
  }
  return true;
}

void Unaliased::fix(const View& out, View& in, bool elementwise) {
  if (!overlaps(out, in) || (elementwise && same_elements(out, in))) return;
  temps_.push_back(to_contiguous(in, in.dtype));
  in = temps_.back().view;
}

Temp make_temp(DType dtype, const int64_t* shape, int ndim) {
  int64_t n = 1;
  for (int d = 0; d < ndim; ++d) n *= shape[d];
  Temp t{Buffer(static_cast<size_t>(n * itemsize(dtype))), View()};
  t.view = contiguous_view(t.buf.get(), dtype, shape, ndim);
  return t;
}

Temp to_contiguous(const View& v, DType dtype) {
  Temp t = make_temp(dtype, v.shape, v.ndim);
  copy(t.view, v);
  return t;
}

}  // namespace kael
