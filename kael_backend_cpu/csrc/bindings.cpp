// The only PYBIND11_MODULE: turns kael Tensors into Views (with the GIL held), runs
// the kernel with the GIL released, and maps kael::Error onto kael's exceptions.
//
// NOTE [thin glue]: kernels are bound directly as the backend's kernel callables,
// so an op costs one pybind11 call plus a handful of attribute reads per tensor
// (_storage.data, shape, _strides, _offset, dtype). The dtype is recognised by the
// identity of the kael DType object (registered once at import), the data pointer
// is read straight from the storage's ndarray, and every view is bounds-checked
// against its storage before any kernel touches memory.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <string>
#include <vector>

#include "allocator.h"
#include "batch_norm.h"
#include "buffer.h"
#include "conv.h"
#include "kernels.h"
#include "pool.h"
#include "thread_pool.h"
#include "vec.h"

namespace py = pybind11;

namespace kael {
namespace {

struct Names {
  PyObject* storage = nullptr;
  PyObject* data = nullptr;
  PyObject* shape = nullptr;
  PyObject* strides = nullptr;
  PyObject* offset = nullptr;
  PyObject* dtype = nullptr;
};
Names g_names;
PyObject* g_dtypes[kNumDTypes] = {};
PyObject* g_errors[6] = {};  // indexed by ErrorKind

[[noreturn]] void raise(ErrorKind kind, const std::string& msg) {
  throw Error(kind, msg);
}

PyObject* getattr(PyObject* o, PyObject* name) {
  PyObject* r = PyObject_GetAttr(o, name);
  if (r == nullptr) throw py::error_already_set();
  return r;
}

int64_t as_int(PyObject* o) {
  const long long v = PyLong_AsLongLong(o);
  if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
  return v;
}

DType dtype_of_object(PyObject* d) {
  for (int i = 0; i < kNumDTypes; ++i) {
    if (g_dtypes[i] == d) return static_cast<DType>(i);
  }
  raise(ErrorKind::DType, "kael_backend_cpu: unknown dtype object");
}

// Read the ints of a tuple into out[] (at most kMaxDims).
int read_tuple(PyObject* t, int64_t* out, const char* what) {
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
View parse(py::handle th, const char* op, bool writable = false) {
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

int wrap_dim(int64_t dim, int ndim, const char* op) {
  const int n = ndim > 0 ? ndim : 1;
  if (dim < -n || dim >= n)
    raise(ErrorKind::Index, detail::cat(op, ": dim ", dim, " is out of range for ", ndim, " dims"));
  return static_cast<int>(dim < 0 ? dim + n : dim);
}

Scalar scalar_of(py::handle h, const char* op) {
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

py::object allocate(int64_t nbytes) {
  if (nbytes < 0) raise(ErrorKind::Shape, detail::cat("allocate: negative size ", nbytes));
  void* p = host_allocator().allocate(static_cast<size_t>(nbytes));
  PyObject* cap = PyCapsule_New(p, "kael_backend_cpu.block", [](PyObject* c) {
    host_allocator().deallocate(PyCapsule_GetPointer(c, "kael_backend_cpu.block"));
  });
  if (cap == nullptr) {
    host_allocator().deallocate(p);
    throw py::error_already_set();
  }
  const auto& api = py::detail::npy_api::get();
  Py_intptr_t dims[1] = {static_cast<Py_intptr_t>(nbytes)};
  Py_intptr_t strides[1] = {1};
  PyObject* arr = api.PyArray_NewFromDescr_(
      api.PyArray_Type_, api.PyArray_DescrFromType_(py::detail::npy_api::NPY_UBYTE_), 1, dims, strides, p,
      py::detail::npy_api::NPY_ARRAY_C_CONTIGUOUS_ | py::detail::npy_api::NPY_ARRAY_ALIGNED_ |
          py::detail::npy_api::NPY_ARRAY_WRITEABLE_,
      nullptr);
  if (arr == nullptr) {
    Py_DECREF(cap);
    throw py::error_already_set();
  }
  if (api.PyArray_SetBaseObject_(arr, cap) != 0) {  // steals cap
    Py_DECREF(arr);
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::object>(arr);
}

// copy a host ndarray (same shape, same item size as out) into out
void copy_from_array(py::handle out, py::handle array) {
  View o = parse(out, "from_host", true);
  const auto& api = py::detail::npy_api::get();
  if (!api.PyArray_Check_(array.ptr())) raise(ErrorKind::DType, "from_host: expected a numpy.ndarray");
  const auto* arr = py::detail::array_proxy(array.ptr());
  View a = o;
  a.data = arr->data;
  if (arr->nd != o.ndim) raise(ErrorKind::Shape, "from_host: array rank differs from the tensor's");
  const int64_t isz = o.elsize();
  for (int d = 0; d < o.ndim; ++d) {
    if (arr->dimensions[d] != o.shape[d]) raise(ErrorKind::Shape, "from_host: array shape differs from the tensor's");
    if (arr->strides[d] < 0 || arr->strides[d] % isz != 0) {
      raise(ErrorKind::Shape, "from_host: array strides must be non-negative multiples of the item size");
    }
    a.strides[d] = arr->strides[d] / isz;
  }
  py::gil_scoped_release nogil;
  copy(o, a);
}

py::dict memory_stats() {
  const MemoryStats s = host_allocator().stats();
  py::dict d;
  d["allocated_bytes"] = s.allocated_bytes;
  d["requested_bytes"] = s.requested_bytes;
  d["peak_allocated_bytes"] = s.peak_allocated_bytes;
  d["cached_bytes"] = s.cached_bytes;
  d["num_allocs"] = s.num_allocs;
  d["num_frees"] = s.num_frees;
  d["cache_hits"] = s.cache_hits;
  d["system_allocs"] = s.system_allocs;
  d["caching"] = host_allocator().caching();
  return d;
}

void translate(std::exception_ptr p) {  // NOLINT(performance-unnecessary-value-param): pybind11's signature
  try {
    if (p) std::rethrow_exception(p);
  } catch (const Error& e) {
    PyObject* cls = g_errors[static_cast<int>(e.kind())];
    PyErr_SetString(cls ? cls : PyExc_RuntimeError, e.what());
  }
}

// kael's public error classes (kael.KaelError, ...), and a class of our own for integer
// division by zero: a kael.KaelError that is also a ZeroDivisionError.
void register_errors(py::module_& m) {
  py::module_ kael_module = py::module_::import("kael");
  const char* names[] = {"KaelError", "ShapeError", "DTypeError", "IndexError_", nullptr, "BackendError"};
  for (int i = 0; i < 6; ++i) {
    if (names[i] != nullptr) g_errors[i] = py::object(kael_module.attr(names[i])).release().ptr();
  }
  PyObject* bases = PyTuple_Pack(2, g_errors[0], PyExc_ZeroDivisionError);
  if (bases == nullptr) throw py::error_already_set();
  PyObject* zero = PyErr_NewException("kael_backend_cpu._C.ZeroDivisionError_", bases, nullptr);
  Py_DECREF(bases);
  if (zero == nullptr) throw py::error_already_set();
  g_errors[static_cast<int>(ErrorKind::ZeroDivision)] = zero;
  m.attr("ZeroDivisionError_") = py::reinterpret_borrow<py::object>(zero);
  py::register_exception_translator(translate);
}

PyObject* intern(const char* s) {
  return PyUnicode_InternFromString(s);
}

// -- kernel wrappers --------------------------------------------------------------------

void bind_elementwise(py::module_& m) {
  m.def("copy", [](py::handle out, py::handle a) {
    View o = parse(out, "copy", true), x = parse(a, "copy");
    py::gil_scoped_release nogil;
    Unaliased u;
    u.fix(o, x, true);
    copy(o, x);
  });
  m.def("fill", [](py::handle out, py::handle value) {
    View o = parse(out, "fill", true);
    const Scalar s = scalar_of(value, "fill");
    py::gil_scoped_release nogil;
    fill(o, s);
  });
  m.def("arange", [](py::handle out, py::handle start, py::handle step) {
    View o = parse(out, "arange", true);
    const Scalar s0 = scalar_of(start, "arange"), ds = scalar_of(step, "arange");
    py::gil_scoped_release nogil;
    arange(o, s0, ds);
  });
  m.def("where", [](py::handle out, py::handle cond, py::handle a, py::handle b) {
    View o = parse(out, "where", true), c = parse(cond, "where"), x = parse(a, "where"), y = parse(b, "where");
    py::gil_scoped_release nogil;
    Unaliased u;
    u.fix(o, c, true);
    u.fix(o, x, true);
    u.fix(o, y, true);
    where(o, c, x, y);
  });
  const std::pair<const char*, UnaryOp> unary_ops[] = {
      {"neg", UnaryOp::Neg},         {"exp", UnaryOp::Exp},     {"log", UnaryOp::Log},
      {"sqrt", UnaryOp::Sqrt},       {"rsqrt", UnaryOp::Rsqrt}, {"tanh", UnaryOp::Tanh},
      {"abs", UnaryOp::Abs},         {"sin", UnaryOp::Sin},     {"cos", UnaryOp::Cos},
      {"sigmoid", UnaryOp::Sigmoid}, {"erf", UnaryOp::Erf},     {"log1p", UnaryOp::Log1p},
      {"expm1", UnaryOp::Expm1},     {"floor", UnaryOp::Floor}, {"ceil", UnaryOp::Ceil},
      {"round", UnaryOp::Round},     {"sign", UnaryOp::Sign},   {"logical_not", UnaryOp::LogicalNot},
      {"silu", UnaryOp::Silu},
  };
  for (const auto& [name, op] : unary_ops) {
    const char* n = name;
    const UnaryOp u = op;
    m.def(name, [n, u](py::handle out, py::handle a) {
      View o = parse(out, n, true), x = parse(a, n);
      py::gil_scoped_release nogil;
      Unaliased ua;
      ua.fix(o, x, true);
      unary(u, o, x);
    });
  }
  const std::pair<const char*, BinaryOp> binary_ops[] = {
      {"add", BinaryOp::Add},
      {"sub", BinaryOp::Sub},
      {"mul", BinaryOp::Mul},
      {"div", BinaryOp::Div},
      {"pow", BinaryOp::Pow},
      {"maximum", BinaryOp::Maximum},
      {"minimum", BinaryOp::Minimum},
      {"remainder", BinaryOp::Remainder},
      {"floor_divide", BinaryOp::FloorDivide},
      {"eq", BinaryOp::Eq},
      {"ne", BinaryOp::Ne},
      {"lt", BinaryOp::Lt},
      {"le", BinaryOp::Le},
      {"gt", BinaryOp::Gt},
      {"ge", BinaryOp::Ge},
      {"logical_and", BinaryOp::LogicalAnd},
      {"logical_or", BinaryOp::LogicalOr},
  };
  for (const auto& [name, op] : binary_ops) {
    const char* n = name;
    const BinaryOp bop = op;
    m.def(name, [n, bop](py::handle out, py::handle a, py::handle b) {
      View o = parse(out, n, true), x = parse(a, n), y = parse(b, n);
      py::gil_scoped_release nogil;
      Unaliased u;
      u.fix(o, x, true);
      u.fix(o, y, true);
      binary(bop, o, x, y);
    });
  }
}

void bind_reductions(py::module_& m) {
  const std::pair<const char*, ReduceOp> ops[] = {
      {"sum", ReduceOp::Sum},       {"prod", ReduceOp::Prod},     {"amax", ReduceOp::Amax}, {"amin", ReduceOp::Amin},
      {"argmax", ReduceOp::Argmax}, {"argmin", ReduceOp::Argmin}, {"any", ReduceOp::Any},   {"all", ReduceOp::All},
  };
  for (const auto& [name, op] : ops) {
    const char* n = name;
    const ReduceOp r = op;
    m.def(name, [n, r](py::handle out, py::handle a, py::handle dims) {
      View o = parse(out, n, true), x = parse(a, n);
      std::vector<int> ds;
      for (py::handle d : dims) ds.push_back(wrap_dim(as_int(d.ptr()), x.ndim, n));
      py::gil_scoped_release nogil;
      Unaliased u;
      u.fix(o, x, false);
      reduce(r, o, x, ds);
    });
  }
}

void bind_indexing(py::module_& m) {
  m.def("matmul", [](py::handle out, py::handle a, py::handle b) {
    View o = parse(out, "matmul", true), x = parse(a, "matmul"), y = parse(b, "matmul");
    py::gil_scoped_release nogil;
    Unaliased u;
    u.fix(o, x, false);
    u.fix(o, y, false);
    matmul(o, x, y);
  });
  m.def("gather", [](py::handle out, py::handle a, py::handle index, int64_t dim) {
    View o = parse(out, "gather", true), x = parse(a, "gather"), i = parse(index, "gather");
    const int d = wrap_dim(dim, x.ndim, "gather");
    py::gil_scoped_release nogil;
    Unaliased u;
    u.fix(o, x, false);
    u.fix(o, i, false);
    gather(o, x, i, d);
  });
  m.def("index_select", [](py::handle out, py::handle a, py::handle index, int64_t dim) {
    View o = parse(out, "index_select", true), x = parse(a, "index_select"), i = parse(index, "index_select");
    const int d = wrap_dim(dim, x.ndim, "index_select");
    py::gil_scoped_release nogil;
    Unaliased u;
    u.fix(o, x, false);
    u.fix(o, i, false);
    index_select(o, x, i, d);
  });
  m.def("index_add", [](py::handle out, py::handle index, py::handle src, int64_t dim) {
    View o = parse(out, "index_add", true), i = parse(index, "index_add"), s = parse(src, "index_add");
    const int d = wrap_dim(dim, o.ndim, "index_add");
    py::gil_scoped_release nogil;
    Unaliased u;
    u.fix(o, i, false);
    u.fix(o, s, false);
    index_add(o, i, s, d);
  });
  m.def("scatter_add", [](py::handle out, py::handle index, py::handle src, int64_t dim) {
    View o = parse(out, "scatter_add", true), i = parse(index, "scatter_add"), s = parse(src, "scatter_add");
    const int d = wrap_dim(dim, o.ndim, "scatter_add");
    py::gil_scoped_release nogil;
    Unaliased u;
    u.fix(o, i, false);
    u.fix(o, s, false);
    scatter_add(o, i, s, d);
  });
  m.def("cat", [](py::handle out, py::handle tensors, int64_t dim) {
    View o = parse(out, "cat", true);
    std::vector<View> parts;
    for (py::handle t : tensors) parts.push_back(parse(t, "cat"));
    const int d = wrap_dim(dim, o.ndim, "cat");
    py::gil_scoped_release nogil;
    Unaliased u;
    for (View& p : parts) u.fix(o, p, false);
    cat(o, parts, d);
  });
  m.def("nonzero", [](py::handle out, py::handle mask) {
    View o = parse(out, "nonzero", true), x = parse(mask, "nonzero");
    py::gil_scoped_release nogil;
    Unaliased u;
    u.fix(o, x, false);
    nonzero(o, x);
  });
  m.def("sort", [](py::handle values, py::handle indices, py::handle a, int64_t dim, bool descending) {
    View v = parse(values, "sort", true), i = parse(indices, "sort", true), x = parse(a, "sort");
    const int d = wrap_dim(dim, x.ndim, "sort");
    py::gil_scoped_release nogil;
    Unaliased u;
    u.fix(v, x, false);
    u.fix(i, x, false);
    sort(v, i, x, d, descending);
  });
  m.def("topk", [](py::handle values, py::handle indices, py::handle x, int64_t k) {
    View v = parse(values, "topk", true), i = parse(indices, "topk", true), a = parse(x, "topk");
    py::gil_scoped_release nogil;
    Unaliased u;
    u.fix(v, a, false);
    u.fix(i, a, false);
    topk(v, i, a, k);
  });
  m.def("embedding", [](py::handle out, py::handle weight, py::handle ids) {
    View o = parse(out, "embedding", true), w = parse(weight, "embedding"), i = parse(ids, "embedding");
    py::gil_scoped_release nogil;
    Unaliased u;
    u.fix(o, w, false);
    u.fix(o, i, false);
    embedding(o, w, i);
  });
}

bool tanh_form(const std::string& approximate) {
  if (approximate == "tanh") return true;
  if (approximate == "none") return false;
  raise(ErrorKind::DType, "gelu: approximate must be 'none' or 'tanh', got '" + approximate + "'");
}

// The scheme attribute of dequantize / quantized_linear (a str) as a QuantScheme.
QuantScheme quant_scheme(py::handle h, const char* op) {
  // the names of quant_formats.h, without the last ", "
  const std::string names(kQuantSchemeNames, sizeof(kQuantSchemeNames) - 3);
  if (PyUnicode_Check(h.ptr())) {
    const std::string s = py::cast<std::string>(h);
    for (int i = 0; i < kQuantSchemes; ++i) {
      const auto q = static_cast<QuantScheme>(i);
      if (s == quant_scheme_name(q)) return q;
    }
    raise(ErrorKind::Kael, detail::cat(op, ": scheme must be one of ", names, ", got '", s, "'"));
  }
  raise(ErrorKind::Kael, detail::cat(op, ": scheme must be a str (one of ", names, "), got ",
                                     py::str(py::type::of(h).attr("__name__")).cast<std::string>()));
}

void bind_fused(py::module_& m) {
  m.def("dequantize", [](py::handle out, py::handle weight, py::handle scheme) {
    View o = parse(out, "dequantize", true), w = parse(weight, "dequantize");
    const QuantScheme s = quant_scheme(scheme, "dequantize");
    py::gil_scoped_release nogil;
    Unaliased u;
    u.fix(o, w, false);
    dequantize(o, w, s);
  });
  m.def("quantized_linear", [](py::handle out, py::handle x, py::handle weight, py::handle bias, py::handle scheme) {
    const char* n = "quantized_linear";
    View o = parse(out, n, true), a = parse(x, n), w = parse(weight, n);
    View b;
    const bool has_bias = !bias.is_none();
    if (has_bias) b = parse(bias, n);
    const QuantScheme s = quant_scheme(scheme, n);
    py::gil_scoped_release nogil;
    Unaliased u;
    u.fix(o, a, false);
    u.fix(o, w, false);
    if (has_bias) u.fix(o, b, false);
    quantized_linear(o, a, w, has_bias ? &b : nullptr, s);
  });
  m.def("linear", [](py::handle out, py::handle x, py::handle weight, py::handle bias) {
    View o = parse(out, "linear", true), a = parse(x, "linear"), w = parse(weight, "linear");
    View b;
    const bool has_bias = !bias.is_none();
    if (has_bias) b = parse(bias, "linear");
    py::gil_scoped_release nogil;
    Unaliased u;
    u.fix(o, a, false);
    u.fix(o, w, false);
    if (has_bias) u.fix(o, b, false);
    linear(o, a, w, has_bias ? &b : nullptr);
  });
  m.def("gelu", [](py::handle out, py::handle x, const std::string& approximate) {
    View o = parse(out, "gelu", true), a = parse(x, "gelu");
    const bool t = tanh_form(approximate);
    py::gil_scoped_release nogil;
    Unaliased u;
    u.fix(o, a, true);
    gelu(o, a, t);
  });
  m.def("gelu_backward", [](py::handle grad_in, py::handle grad_out, py::handle x, const std::string& approximate) {
    View gi = parse(grad_in, "gelu_backward", true), go = parse(grad_out, "gelu_backward"),
         a = parse(x, "gelu_backward");
    const bool t = tanh_form(approximate);
    py::gil_scoped_release nogil;
    Unaliased u;
    u.fix(gi, go, true);
    u.fix(gi, a, true);
    gelu_backward(gi, go, a, t);
  });
  m.def("softmax", [](py::handle out, py::handle x, int64_t dim) {
    View o = parse(out, "softmax", true), a = parse(x, "softmax");
    const int d = wrap_dim(dim, a.ndim, "softmax");
    py::gil_scoped_release nogil;
    Unaliased u;
    u.fix(o, a, true);  // rows are read in full before they are written
    softmax(o, a, d);
  });
  m.def("log_softmax", [](py::handle out, py::handle x, int64_t dim) {
    View o = parse(out, "log_softmax", true), a = parse(x, "log_softmax");
    const int d = wrap_dim(dim, a.ndim, "log_softmax");
    py::gil_scoped_release nogil;
    Unaliased u;
    u.fix(o, a, true);
    log_softmax(o, a, d);
  });
  m.def("layer_norm", [](py::handle out, py::handle mean, py::handle rstd, py::handle x, py::handle weight,
                         py::handle bias, double eps) {
    View o = parse(out, "layer_norm", true), mu = parse(mean, "layer_norm", true), r = parse(rstd, "layer_norm", true),
         a = parse(x, "layer_norm");
    View w, b;
    const bool hw = !weight.is_none(), hb = !bias.is_none();
    if (hw) w = parse(weight, "layer_norm");
    if (hb) b = parse(bias, "layer_norm");
    py::gil_scoped_release nogil;
    Unaliased u;
    for (const View* ov : {&o, &mu, &r}) {
      u.fix(*ov, a, ov == &o);
      if (hw) u.fix(*ov, w, false);
      if (hb) u.fix(*ov, b, false);
    }
    layer_norm(o, mu, r, a, hw ? &w : nullptr, hb ? &b : nullptr, eps);
  });
  m.def("layer_norm_backward", [](py::handle dx, py::handle dweight, py::handle dbias, py::handle grad, py::handle x,
                                  py::handle mean, py::handle rstd, py::handle weight) {
    const char* n = "layer_norm_backward";
    View gx = parse(dx, n, true), g = parse(grad, n), a = parse(x, n), mu = parse(mean, n), r = parse(rstd, n);
    View gw, gb, w;
    const bool hgw = !dweight.is_none(), hgb = !dbias.is_none(), hw = !weight.is_none();
    if (hgw) gw = parse(dweight, n, true);
    if (hgb) gb = parse(dbias, n, true);
    if (hw) w = parse(weight, n);
    py::gil_scoped_release nogil;
    Unaliased u;
    for (View* in : {&g, &a, &mu, &r}) u.fix(gx, *in, false);
    if (hw) u.fix(gx, w, false);
    layer_norm_backward(gx, hgw ? &gw : nullptr, hgb ? &gb : nullptr, g, a, mu, r, hw ? &w : nullptr);
  });
  m.def("rms_norm", [](py::handle out, py::handle rstd, py::handle x, py::handle weight, double eps) {
    View o = parse(out, "rms_norm", true), r = parse(rstd, "rms_norm", true), a = parse(x, "rms_norm");
    View w;
    const bool hw = !weight.is_none();
    if (hw) w = parse(weight, "rms_norm");
    py::gil_scoped_release nogil;
    Unaliased u;
    u.fix(o, a, true);  // rows are read in full before they are written
    u.fix(r, a, false);
    if (hw) {
      u.fix(o, w, false);
      u.fix(r, w, false);
    }
    rms_norm(o, r, a, hw ? &w : nullptr, eps);
  });
  m.def("rope", [](py::handle out, py::handle x, py::handle cos, py::handle sin, py::handle positions) {
    View o = parse(out, "rope", true), a = parse(x, "rope"), c = parse(cos, "rope"), s = parse(sin, "rope"),
         p = parse(positions, "rope");
    py::gil_scoped_release nogil;
    Unaliased u;
    u.fix(o, a, true);  // each row reads both halves before writing: out may be x
    u.fix(o, c, false);
    u.fix(o, s, false);
    u.fix(o, p, false);
    rope(o, a, c, s, p);
  });
  m.def("silu_mul", [](py::handle out, py::handle gate, py::handle up) {
    View o = parse(out, "silu_mul", true), g = parse(gate, "silu_mul"), x = parse(up, "silu_mul");
    py::gil_scoped_release nogil;
    Unaliased u;
    u.fix(o, g, true);
    u.fix(o, x, true);
    silu_mul(o, g, x);
  });
  m.def("conv2d", [](py::handle out, py::handle x, py::handle weight, py::handle bias, std::array<int64_t, 2> stride,
                     std::array<int64_t, 2> padding, std::array<int64_t, 2> dilation, int64_t groups) {
    View o = parse(out, "conv2d", true), a = parse(x, "conv2d"), w = parse(weight, "conv2d");
    View b;
    const bool hb = !bias.is_none();
    if (hb) b = parse(bias, "conv2d");
    py::gil_scoped_release nogil;
    Unaliased u;  // the output is written at the end from a scratch buffer, but copy aliased inputs all the same
    u.fix(o, a, false);
    u.fix(o, w, false);
    if (hb) u.fix(o, b, false);
    conv2d(o, a, w, hb ? &b : nullptr, stride, padding, dilation, groups);
  });
  m.def("conv2d_backward", [](py::handle dx, py::handle dweight, py::handle dbias, py::handle grad, py::handle x,
                              py::handle weight, std::array<int64_t, 2> stride, std::array<int64_t, 2> padding,
                              std::array<int64_t, 2> dilation, int64_t groups) {
    const char* n = "conv2d_backward";
    View g = parse(grad, n), a = parse(x, n), w = parse(weight, n);
    View gx, gw, gb;
    const bool hx = !dx.is_none(), hw = !dweight.is_none(), hb = !dbias.is_none();
    if (hx) gx = parse(dx, n, true);
    if (hw) gw = parse(dweight, n, true);
    if (hb) gb = parse(dbias, n, true);
    py::gil_scoped_release nogil;
    conv2d_backward(hx ? &gx : nullptr, hw ? &gw : nullptr, hb ? &gb : nullptr, g, a, w, stride, padding, dilation,
                    groups);
  });
  m.def("max_pool2d", [](py::handle out, py::handle indices, py::handle x, std::array<int64_t, 2> kernel,
                         std::array<int64_t, 2> stride, std::array<int64_t, 2> padding, std::array<int64_t, 2> dilation,
                         bool /*ceil_mode: the frontend sized out*/) {
    View o = parse(out, "max_pool2d", true), i = parse(indices, "max_pool2d", true), a = parse(x, "max_pool2d");
    py::gil_scoped_release nogil;
    max_pool2d(o, i, a, kernel, stride, padding, dilation);  // writes out and indices last, from scratch
  });
  m.def("avg_pool2d", [](py::handle out, py::handle x, py::handle divisors, std::array<int64_t, 2> kernel,
                         std::array<int64_t, 2> stride, std::array<int64_t, 2> padding) {
    View o = parse(out, "avg_pool2d", true), a = parse(x, "avg_pool2d"), d = parse(divisors, "avg_pool2d");
    py::gil_scoped_release nogil;
    avg_pool2d(o, a, d, kernel, stride, padding);  // reads into scratch, writes out last
  });
  m.def("avg_pool2d_backward",
        [](py::handle dx, py::handle grad, py::handle divisors, std::array<int64_t, 2> /*size*/,
           std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride, std::array<int64_t, 2> padding) {
          View o = parse(dx, "avg_pool2d_backward", true), g = parse(grad, "avg_pool2d_backward"),
               d = parse(divisors, "avg_pool2d_backward");
          py::gil_scoped_release nogil;
          avg_pool2d_backward(o, g, d, kernel, stride, padding);
        });
  m.def("max_pool2d_backward", [](py::handle dx, py::handle grad, py::handle indices, std::array<int64_t, 2>,
                                  std::array<int64_t, 2>, std::array<int64_t, 2>, std::array<int64_t, 2>,
                                  std::array<int64_t, 2> /*size and window: the shapes carry what it needs*/) {
    View d = parse(dx, "max_pool2d_backward", true), g = parse(grad, "max_pool2d_backward"),
         i = parse(indices, "max_pool2d_backward");
    py::gil_scoped_release nogil;
    max_pool2d_backward(d, g, i);  // reads grad and indices into scratch before writing dx
  });
  m.def("batch_norm", [](py::handle out, py::handle mean, py::handle rstd, py::handle x, py::handle weight,
                         py::handle bias, double eps) {
    const char* n = "batch_norm";
    View o = parse(out, n, true), mu = parse(mean, n, true), r = parse(rstd, n, true), a = parse(x, n);
    View w, b;
    const bool hw = !weight.is_none(), hb = !bias.is_none();
    if (hw) w = parse(weight, n);
    if (hb) b = parse(bias, n);
    py::gil_scoped_release nogil;
    Unaliased u;  // the statistics are computed before out is written: out may not alias x
    u.fix(o, a, false);
    for (const View* ov : {&mu, &r}) u.fix(*ov, a, false);
    batch_norm(o, mu, r, a, hw ? &w : nullptr, hb ? &b : nullptr, eps);
  });
  m.def("batch_norm_eval", [](py::handle out, py::handle x, py::handle mean, py::handle var, py::handle weight,
                              py::handle bias, double eps) {
    const char* n = "batch_norm_eval";
    View o = parse(out, n, true), a = parse(x, n), mu = parse(mean, n), v = parse(var, n);
    View w, b;
    const bool hw = !weight.is_none(), hb = !bias.is_none();
    if (hw) w = parse(weight, n);
    if (hb) b = parse(bias, n);
    py::gil_scoped_release nogil;
    Unaliased u;
    u.fix(o, a, true);  // elementwise along x: out may be x itself
    for (View* in : {&mu, &v}) u.fix(o, *in, false);
    if (hw) u.fix(o, w, false);
    if (hb) u.fix(o, b, false);
    batch_norm_eval(o, a, mu, v, hw ? &w : nullptr, hb ? &b : nullptr, eps);
  });
  m.def("batch_norm_backward", [](py::handle dx, py::handle dweight, py::handle dbias, py::handle grad, py::handle x,
                                  py::handle mean, py::handle rstd, py::handle weight) {
    const char* n = "batch_norm_backward";
    View g = parse(grad, n), a = parse(x, n), mu = parse(mean, n), r = parse(rstd, n);
    View gx, gw, gb, w;
    const bool hx = !dx.is_none(), hgw = !dweight.is_none(), hgb = !dbias.is_none(), hw = !weight.is_none();
    if (hx) gx = parse(dx, n, true);
    if (hgw) gw = parse(dweight, n, true);
    if (hgb) gb = parse(dbias, n, true);
    if (hw) w = parse(weight, n);
    py::gil_scoped_release nogil;
    Unaliased u;
    if (hx) {
      for (View* in : {&g, &a}) u.fix(gx, *in, false);
    }
    batch_norm_backward(hx ? &gx : nullptr, hgw ? &gw : nullptr, hgb ? &gb : nullptr, g, a, mu, r, hw ? &w : nullptr);
  });
  m.def("cross_entropy",
        [](py::handle losses, py::handle logits, py::handle target, int64_t ignore_index, double label_smoothing) {
          View l = parse(losses, "cross_entropy", true), z = parse(logits, "cross_entropy"),
               t = parse(target, "cross_entropy");
          py::gil_scoped_release nogil;
          Unaliased u;
          u.fix(l, z, false);
          u.fix(l, t, false);
          cross_entropy(l, z, t, ignore_index, label_smoothing);
        });
  m.def("attention",
        [](py::handle out, py::handle q, py::handle k, py::handle v, double scale, bool causal, py::handle lengths) {
          View o = parse(out, "attention", true), qv = parse(q, "attention"), kv = parse(k, "attention"),
               vv = parse(v, "attention");
          View lv;
          const bool hl = !lengths.is_none();
          if (hl) lv = parse(lengths, "attention");
          py::gil_scoped_release nogil;
          Unaliased u;
          u.fix(o, qv, false);
          u.fix(o, kv, false);
          u.fix(o, vv, false);
          attention(o, qv, kv, vv, scale, causal, hl ? &lv : nullptr);
        });
  m.def("paged_attention",
        [](py::handle out, py::handle q, py::handle cache, py::handle block_table, py::handle lengths, double scale) {
          const char* n = "paged_attention";
          View o = parse(out, n, true), qv = parse(q, n), cv = parse(cache, n), tv = parse(block_table, n),
               lv = parse(lengths, n);
          py::gil_scoped_release nogil;
          Unaliased u;
          u.fix(o, qv, false);
          u.fix(o, cv, false);
          u.fix(o, tv, false);
          u.fix(o, lv, false);
          paged_attention(o, qv, cv, tv, lv, scale);
        });
  m.def("adamw_step", [](py::handle param, py::handle grad, py::handle exp_avg, py::handle exp_avg_sq, double lr,
                         double beta1, double beta2, double eps, double weight_decay, int64_t step) {
    const char* n = "adamw_step";
    View p = parse(param, n, true), g = parse(grad, n), m1 = parse(exp_avg, n, true), m2 = parse(exp_avg_sq, n, true);
    py::gil_scoped_release nogil;
    Unaliased u;
    u.fix(p, g, true);
    u.fix(m1, g, true);
    u.fix(m2, g, true);
    adamw_step(p, g, m1, m2, lr, beta1, beta2, eps, weight_decay, step);
  });
}

}  // namespace
}  // namespace kael

PYBIND11_MODULE(_C, m) {
  using namespace kael;  // NOLINT(google-build-using-namespace)
  m.doc() = "kael_backend_cpu native kernels (C++17)";
  g_names.storage = intern("_storage");
  g_names.data = intern("data");
  g_names.shape = intern("shape");
  g_names.strides = intern("_strides");
  g_names.offset = intern("_offset");
  g_names.dtype = intern("dtype");
  register_errors(m);

  m.def("_register_dtypes", [](const py::tuple& dtypes) {
    if (dtypes.size() != kNumDTypes) raise(ErrorKind::Kael, "_register_dtypes: expected the 10 kael dtypes in order");
    for (int i = 0; i < kNumDTypes; ++i) {
      Py_XDECREF(g_dtypes[i]);
      g_dtypes[i] = py::object(dtypes[static_cast<size_t>(i)]).release().ptr();
    }
  });
  m.def("allocate", &allocate, "A numpy uint8 array of nbytes bytes from the caching allocator");
  m.def("copy_from_array", &copy_from_array);
  m.def("memory_stats", &memory_stats);
  m.def("reset_peak_memory_stats", [] { host_allocator().reset_peak(); });
  m.def("empty_cache", [] { host_allocator().empty_cache(); });
  m.def("set_num_threads", [](int n) {
    py::gil_scoped_release nogil;
    set_num_threads(n);
  });
  m.def("get_num_threads", &get_num_threads);
  m.def("isa", [] { return std::string(vec().name); });
  m.def("quant_schemes", [] {  // the weight formats dequantize / quantized_linear take (quant_formats.h)
    py::tuple t(kQuantSchemes);
    for (int i = 0; i < kQuantSchemes; ++i) t[static_cast<size_t>(i)] = quant_scheme_name(static_cast<QuantScheme>(i));
    return t;
  });
  m.def("isa_info", [] {  // what vec_select.cpp sees and can pick (NOTE [runtime dispatch] in vec.h)
    py::dict features, requires;
    for (const auto& [name, on] : cpu_feature_list()) features[py::str(name)] = on;
    for (const auto& name : vec_tables_compiled()) requires[py::str(name)] = vec_table_requires(name);
    py::dict d;
    d["tables"] = vec_tables_compiled();
    d["runnable"] = vec_tables_runnable();
    d["requires"] = requires;
    d["features"] = features;
    return d;
  });
  bind_elementwise(m);
  bind_reductions(m);
  bind_indexing(m);
  bind_fused(m);
}
