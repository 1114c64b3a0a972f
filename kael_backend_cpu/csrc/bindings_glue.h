// The glue every binding shares (NOTE [thin glue] in bindings.cpp): kael Tensors read as Views,
// Python scalars as Scalars, and the interned attribute names, dtype objects and error classes
// the module registers once at import. Inline, so each binding's lambda can inline its parse.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <string>

#include "kernels.h"

namespace kael {

namespace py = pybind11;

struct Names {
  PyObject* storage = nullptr;
  PyObject* data = nullptr;
  PyObject* shape = nullptr;
  PyObject* strides = nullptr;
  PyObject* offset = nullptr;
  PyObject* dtype = nullptr;
};
inline Names g_names;
inline PyObject* g_dtypes[kNumDTypes] = {};
inline PyObject* g_errors[6] = {};  // indexed by ErrorKind

[[noreturn]] inline void raise(ErrorKind kind, const std::string& msg) {
  throw Error(kind, msg);
}

inline PyObject* getattr(PyObject* o, PyObject* name) {
  PyObject* r = PyObject_GetAttr(o, name);
  if (r == nullptr) throw py::error_already_set();
  return r;
}

inline int64_t as_int(PyObject* o) {
  const long long v = PyLong_AsLongLong(o);
  if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
  return v;
}

inline DType dtype_of_object(PyObject* d) {
  for (int i = 0; i < kNumDTypes; ++i) {
    if (g_dtypes[i] == d) return static_cast<DType>(i);
  }
  raise(ErrorKind::DType, "kael_backend_cpu: unknown dtype object");
}

// Read the ints of a tuple into out[] (at most kMaxDims).
inline int read_tuple(PyObject* t, int64_t* out, const char* what) {
  if (!PyTuple_Check(t)) raise(ErrorKind::Kael, std::string("kael_backend_cpu: tensor ") + what + " is not a tuple");
  const Py_ssize_t n = PyTuple_GET_SIZE(t);
  if (n > kMaxDims) {
    raise(ErrorKind::Shape,
          detail::cat("kael_backend_cpu: tensors of at most ", kMaxDims, " dims are supported, got ", n));
  }
  for (Py_ssize_t i = 0; i < n; ++i) out[i] = as_int(PyTuple_GET_ITEM(t, i));
  return static_cast<int>(n);
}

// The strided view of a kael Tensor, checked to lie inside its storage.
inline View parse(py::handle th, const char* op, bool writable = false) {
  PyObject* t = th.ptr();
  View v;
  py::object storage = py::reinterpret_steal<py::object>(getattr(t, g_names.storage));
  py::object data = py::reinterpret_steal<py::object>(getattr(storage.ptr(), g_names.data));
  const auto& api = py::detail::npy_api::get();
  if (!api.PyArray_Check_(data.ptr())) {
    raise(ErrorKind::Backend, detail::cat(op, ": tensor storage is not a host array (device mismatch?)"));
  }
  const auto* arr = py::detail::array_proxy(data.ptr());
  if (arr->nd != 1 || (arr->dimensions[0] > 1 && arr->strides[0] != 1)) {
    raise(ErrorKind::Backend, detail::cat(op, ": tensor storage must be a contiguous 1-d uint8 array"));
  }
  if (writable && (arr->flags & py::detail::npy_api::NPY_ARRAY_WRITEABLE_) == 0) {
    raise(ErrorKind::Kael, detail::cat(op, ": the output tensor's memory is read-only"));
  }
  const int64_t nbytes = arr->dimensions[0];
  py::object shape = py::reinterpret_steal<py::object>(getattr(t, g_names.shape));
  py::object strides = py::reinterpret_steal<py::object>(getattr(t, g_names.strides));
  py::object offset = py::reinterpret_steal<py::object>(getattr(t, g_names.offset));
  py::object dtype = py::reinterpret_steal<py::object>(getattr(t, g_names.dtype));
  v.ndim = read_tuple(shape.ptr(), v.shape, "shape");
  const int ns = read_tuple(strides.ptr(), v.strides, "strides");
  if (ns != v.ndim) raise(ErrorKind::Shape, detail::cat(op, ": tensor has ", v.ndim, " dims but ", ns, " strides"));
  v.dtype = dtype_of_object(dtype.ptr());
  const int64_t off = as_int(offset.ptr());
  const int64_t isz = itemsize(v.dtype);
  int64_t last = off;
  bool empty = false;
  for (int d = 0; d < v.ndim; ++d) {
    if (v.shape[d] < 0 || v.strides[d] < 0) {
      raise(ErrorKind::Shape, detail::cat(op, ": negative size or stride at dim ", d, " (", v.shape[d], ", ",
                                          v.strides[d], "); kernels take non-negative strides"));
    }
    if (v.shape[d] == 0) empty = true;
    last += (v.shape[d] - 1) * v.strides[d];
  }
  if (!empty && (off < 0 || (last + 1) * isz > nbytes)) {
    raise(ErrorKind::Shape, detail::cat(op, ": tensor view (offset ", off, ", last element ", last,
                                        ") lies outside its storage of ", nbytes, " bytes"));
  }
  v.data = arr->data + (empty ? 0 : off * isz);
  return v;
}

inline int wrap_dim(int64_t dim, int ndim, const char* op) {
  const int n = ndim > 0 ? ndim : 1;
  if (dim < -n || dim >= n)
    raise(ErrorKind::Index, detail::cat(op, ": dim ", dim, " is out of range for ", ndim, " dims"));
  return static_cast<int>(dim < 0 ? dim + n : dim);
}

inline Scalar scalar_of(py::handle h, const char* op) {
  PyObject* o = h.ptr();
  Scalar s;
  if (PyBool_Check(o)) {
    s.kind = Scalar::Bool;
    s.i = o == Py_True ? 1 : 0;
  } else if (PyLong_Check(o)) {
    s.kind = Scalar::Int;
    s.i = as_int(o);
  } else if (PyFloat_Check(o)) {
    s.kind = Scalar::Float;
    s.f = PyFloat_AS_DOUBLE(o);
  } else if (PyIndex_Check(o) != 0) {  // numpy integers and the like
    py::object i = py::reinterpret_steal<py::object>(PyNumber_Index(o));
    if (!i) throw py::error_already_set();
    s.kind = Scalar::Int;
    s.i = as_int(i.ptr());
  } else {
    const double d = PyFloat_AsDouble(o);  // numpy floats and the like
    if (d == -1.0 && PyErr_Occurred()) {
      PyErr_Clear();
      raise(ErrorKind::DType, detail::cat(op, ": expected a bool, int or float value"));
    }
    s.kind = Scalar::Float;
    s.f = d;
  }
  return s;
}

inline PyObject* intern(const char* s) {
  return PyUnicode_InternFromString(s);
}

// The kernel wrappers, by family (bindings_ops.cpp, bindings_fused.cpp).
void bind_elementwise(py::module_& m);
void bind_reductions(py::module_& m);
void bind_indexing(py::module_& m);
void bind_fused(py::module_& m);

}  // namespace kael
