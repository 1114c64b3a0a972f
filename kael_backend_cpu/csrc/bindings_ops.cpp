// The kernel wrappers of the primitive ops: elementwise, reductions, indexing (NOTE [thin glue]
// in bindings.cpp): each parses its Tensors with the GIL held, then runs the kernel without it.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "bindings_glue.h"
#include "buffer.h"
#include "kernels.h"

namespace kael {

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

}  // namespace kael
