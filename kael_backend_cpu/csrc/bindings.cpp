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
#include "bindings_glue.h"
#include "buffer.h"
#include "kernels.h"
#include "thread_pool.h"
#include "vec.h"

namespace py = pybind11;

namespace kael {
namespace {

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
