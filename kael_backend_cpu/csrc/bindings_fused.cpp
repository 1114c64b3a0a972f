// The kernel wrappers of the fused ops (NOTE [thin glue] in bindings.cpp): quantized weights,
// norms, attention, losses, the mixture-of-experts ops, convolution, pooling, batch norm and the
// optimizer steps.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "batch_norm.h"
#include "bindings_glue.h"
#include "buffer.h"
#include "conv.h"
#include "kernels.h"
#include "pool.h"

namespace kael {
namespace {

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

}  // namespace

void bind_fused(py::module_& m) {
  m.def("dequantize", [](py::handle out, py::handle weight, py::handle scheme) {
    View o = parse(out, "dequantize", true), w = parse(weight, "dequantize");
    const QuantScheme s = quant_scheme(scheme, "dequantize");
    py::gil_scoped_release nogil;
    Unaliased u;
    u.fix(o, w, false);
    dequantize(o, w, s);
  });
  m.def(
      "quantized_linear",
      [](py::handle out, py::handle x, py::handle weight, py::handle bias, py::handle scheme, py::handle packed) {
        const char* n = "quantized_linear";
        View o = parse(out, n, true), a = parse(x, n), w = parse(weight, n);
        View b, p;
        const bool has_bias = !bias.is_none(), has_packed = !packed.is_none();
        if (has_bias) b = parse(bias, n);
        if (has_packed) p = parse(packed, n);
        const QuantScheme s = quant_scheme(scheme, n);
        py::gil_scoped_release nogil;
        Unaliased u;
        u.fix(o, a, false);
        u.fix(o, w, false);
        if (has_bias) u.fix(o, b, false);
        if (has_packed) u.fix(o, p, false);
        quantized_linear(o, a, w, has_bias ? &b : nullptr, s, has_packed ? &p : nullptr);
      },
      py::arg("out"), py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("scheme"),
      py::arg("packed") = py::none());
  // NOTE [repacked rows] (vec_quant_packed.h): whether this CPU can use a repacked copy of a scheme's weights, and
  // the repacking itself (out: a contiguous uint8 tensor of weight's shape)
  m.def("packable", [](py::handle scheme) { return packable(quant_scheme(scheme, "packable")); });
  // NOTE [bfloat16 GEMM pays] (vec_bf16_dot.h)
  m.def("bf16_issue_ratio", [] { return bf16_issue_ratio(); });
  m.def("bf16_gemm_pays", [] { return bf16_gemm_pays(); });
  m.def("bf16_gemm_kernel", [] { return std::string(bf16_gemm_kernel()); });
  m.def("pack_quantized", [](py::handle out, py::handle weight, py::handle scheme) {
    View o = parse(out, "pack_quantized", true), w = parse(weight, "pack_quantized");
    const QuantScheme s = quant_scheme(scheme, "pack_quantized");
    py::gil_scoped_release nogil;
    pack_quantized(o, w, s);
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
  m.def("gelu_tanh_mul", [](py::handle out, py::handle gate, py::handle up) {
    View o = parse(out, "gelu_tanh_mul", true), g = parse(gate, "gelu_tanh_mul"), x = parse(up, "gelu_tanh_mul");
    py::gil_scoped_release nogil;
    Unaliased u;
    u.fix(o, g, true);
    u.fix(o, x, true);
    gelu_tanh_mul(o, g, x);
  });
  m.def("softcap", [](py::handle out, py::handle x, double cap) {
    View o = parse(out, "softcap", true), a = parse(x, "softcap");
    py::gil_scoped_release nogil;
    Unaliased u;
    u.fix(o, a, true);
    softcap(o, a, cap);
  });
  m.def("moe_route", [](py::handle weights, py::handle experts, py::handle logits, int64_t k, bool normalize) {
    const char* n = "moe_route";
    View w = parse(weights, n, true), e = parse(experts, n, true), z = parse(logits, n);
    py::gil_scoped_release nogil;
    Unaliased u;
    u.fix(w, z, false);
    u.fix(e, z, false);
    moe_route(w, e, z, k, normalize);
  });
  m.def("expert_linear", [](py::handle out, py::handle x, py::handle weight, py::handle experts) {
    const char* n = "expert_linear";
    View o = parse(out, n, true), a = parse(x, n), w = parse(weight, n), e = parse(experts, n);
    py::gil_scoped_release nogil;
    Unaliased u;
    u.fix(o, a, false);
    u.fix(o, w, false);
    u.fix(o, e, false);
    expert_linear(o, a, w, e);
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
  m.def(
      "attention",
      [](py::handle out, py::handle q, py::handle k, py::handle v, double scale, bool causal, py::handle lengths,
         int64_t window) {
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
        attention(o, qv, kv, vv, scale, causal, hl ? &lv : nullptr, window);
      },
      py::arg("out"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("scale"), py::arg("causal"), py::arg("lengths"),
      py::arg("window") = 0);
  m.def(
      "paged_attention",
      [](py::handle out, py::handle q, py::handle cache, py::handle block_table, py::handle lengths, double scale,
         int64_t window) {
        const char* n = "paged_attention";
        View o = parse(out, n, true), qv = parse(q, n), cv = parse(cache, n), tv = parse(block_table, n),
             lv = parse(lengths, n);
        py::gil_scoped_release nogil;
        Unaliased u;
        u.fix(o, qv, false);
        u.fix(o, cv, false);
        u.fix(o, tv, false);
        u.fix(o, lv, false);
        paged_attention(o, qv, cv, tv, lv, scale, window);
      },
      py::arg("out"), py::arg("q"), py::arg("cache"), py::arg("block_table"), py::arg("lengths"), py::arg("scale"),
      py::arg("window") = 0);
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

}  // namespace kael
