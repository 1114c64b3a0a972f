"""The raw kernels' NumPy twins against float64 oracles written independently (loops, math module).

The CUDA sources themselves run on a GPU only (``kael_backend_cuda/scripts/validate.py``);
here they are checked for structure, and compiled with NVRTC where CuPy and NVRTC are
installed (no GPU needed to compile).
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from kael_backend_cuda import _quant
from kael_backend_cuda import _raw_kernels as raw


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("log", [False, True])
def test_softmax_rows(emulate, dtype, log):
    x = _rng(0).standard_normal((4, 37)).astype(dtype) * 5
    x[1, 3] = -np.inf
    y = np.empty_like(x)
    raw.softmax_rows(x, y, log)
    for r in range(4):
        row = [float(v) for v in x[r]]
        m = max(row)
        s = math.fsum(math.exp(v - m) for v in row)
        want = [(v - m) - math.log(s) if log else math.exp(v - m) / s for v in row]
        np.testing.assert_allclose(y[r], want, rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-7)


def test_softmax_rows_in_place_and_nan(emulate):
    x = np.array([[1.0, np.nan, 2.0], [1.0, 2.0, 3.0]], np.float32)
    raw.softmax_rows(x, x, False)
    assert np.isnan(x[0]).all()
    np.testing.assert_allclose(x[1].sum(), 1.0, rtol=1e-6)


@pytest.mark.parametrize("affine", [False, True])
def test_layer_norm_rows_and_backward(emulate, affine):
    rng = _rng(1)
    x = rng.standard_normal((3, 10))
    w = rng.standard_normal(10) if affine else None
    b = rng.standard_normal(10) if affine else None
    y, mean, rstd = np.empty_like(x), np.empty(3), np.empty(3)
    raw.layer_norm_rows(x, w, b, y, mean, rstd, 1e-5)
    for r in range(3):
        mu = math.fsum(x[r]) / 10
        var = math.fsum((v - mu) ** 2 for v in x[r]) / 10
        assert mean[r] == pytest.approx(mu, rel=1e-12) and rstd[r] == pytest.approx(1 / math.sqrt(var + 1e-5))
        want = [
            (v - mu) / math.sqrt(var + 1e-5) * (w[j] if affine else 1) + (b[j] if affine else 0)
            for j, v in enumerate(x[r])
        ]
        np.testing.assert_allclose(y[r], want, rtol=1e-10, atol=1e-12)
    # dx against central finite differences of sum(g * layer_norm(x))
    g = rng.standard_normal((3, 10))
    dx = np.empty_like(x)
    raw.layer_norm_backward_rows(g, x, mean, rstd, w, dx)

    def loss(xx: np.ndarray) -> float:
        yy, mm, rr = np.empty_like(xx), np.empty(3), np.empty(3)
        raw.layer_norm_rows(xx, w, b, yy, mm, rr, 1e-5)
        return float((g * yy).sum())

    fd = np.zeros_like(x)
    for i in np.ndindex(*x.shape):
        e = np.zeros_like(x)
        e[i] = 1e-6
        fd[i] = (loss(x + e) - loss(x - e)) / 2e-6
    np.testing.assert_allclose(dx, fd, rtol=1e-5, atol=1e-6)


def test_cross_entropy_rows(emulate):
    rng = _rng(2)
    z = rng.standard_normal((5, 7))
    t = np.array([0, 6, -100, 9, 3], np.int64)  # ignored row, out-of-range target
    losses = np.empty(5)
    raw.cross_entropy_rows(z, t, losses, -100, 0.2)
    for r in range(5):
        lse = math.log(math.fsum(math.exp(v) for v in z[r]))
        if t[r] == -100:
            assert losses[r] == 0
        elif not 0 <= t[r] < 7:
            assert math.isnan(losses[r])
        else:
            nll = lse - z[r, t[r]]
            mean_logp = math.fsum(v - lse for v in z[r]) / 7
            assert losses[r] == pytest.approx(0.8 * nll - 0.2 * mean_logp, rel=1e-12)


def test_attention_softmax_masks(emulate):
    b, h, tq, tk = 2, 2, 3, 5
    s = _rng(3).standard_normal((b, h, tq, tk))
    lengths = np.array([4, 0], np.int64)  # row 1 sees no key at all
    p = s.copy()
    raw.attention_softmax(p, lengths, h, tq, 0.5, True)
    for bi, hi, i in np.ndindex(b, h, tq):
        n = min(i + (tk - tq) + 1, int(lengths[bi]))
        row = [0.5 * v for v in s[bi, hi, i, :n]]
        if n == 0:
            assert (p[bi, hi, i] == 0).all()
            continue
        m = max(row)
        den = math.fsum(math.exp(v - m) for v in row)
        want = [math.exp(v - m) / den for v in row] + [0.0] * (tk - n)
        np.testing.assert_allclose(p[bi, hi, i], want, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("approx", [False, True])
def test_gelu_and_its_derivative(emulate, approx):
    x = np.linspace(-4, 4, 41)
    y, dx = np.empty_like(x), np.empty_like(x)
    raw.gelu(x, y, approx)
    c = math.sqrt(2 / math.pi)

    def f(v: float) -> float:
        if approx:
            return 0.5 * v * (1 + math.tanh(c * (v + 0.044715 * v**3)))
        return 0.5 * v * (1 + math.erf(v / math.sqrt(2)))

    np.testing.assert_allclose(y, [f(v) for v in x], rtol=1e-12, atol=1e-15)
    g = np.full_like(x, 2.0)
    raw.gelu_backward(g, x, dx, approx)
    fd = [2 * (f(v + 1e-6) - f(v - 1e-6)) / 2e-6 for v in x]
    np.testing.assert_allclose(dx, fd, rtol=1e-6, atol=1e-8)


def test_adamw_in_place_on_strided_views(emulate):
    rng = _rng(4)
    buf = rng.standard_normal((4, 6))
    p = buf[:, ::2]  # a strided parameter view
    g, m, v = rng.standard_normal((3, 4, 3))
    m, v = m.copy(), np.abs(v)
    p0, m0, v0 = p.copy(), m.copy(), v.copy()
    step, lr, b1, b2, eps, wd = 3, 1e-2, 0.9, 0.999, 1e-8, 0.1
    raw.adamw(p, g, m, v, lr, b1, b2, eps, wd, 1 - b1**step, 1 - b2**step)
    for i in np.ndindex(*p.shape):
        mm = b1 * m0[i] + (1 - b1) * g[i]
        vv = b2 * v0[i] + (1 - b2) * g[i] ** 2
        want = p0[i] * (1 - lr * wd) - lr * (mm / (1 - b1**step)) / (math.sqrt(vv / (1 - b2**step)) + eps)
        assert m[i] == pytest.approx(mm) and v[i] == pytest.approx(vv) and p[i] == pytest.approx(want, rel=1e-12)
    assert (buf[:, 1::2] != 0).all()  # untouched


def test_erf(emulate):
    x = np.linspace(-3, 3, 13, dtype=np.float32)
    y = np.empty_like(x)
    raw.erf(x, y)
    np.testing.assert_allclose(y, [math.erf(v) for v in x], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_silu(emulate, dtype):
    x = np.array([-80.0, -3.0, -0.5, 0.0, 0.25, 2.0, 40.0], dtype)
    y = np.empty_like(x)
    raw.pointwise("silu", x, y)
    np.testing.assert_allclose(y, [v / (1 + math.exp(-v)) for v in x.tolist()], rtol=1e-6, atol=1e-30)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_silu_mul(emulate, dtype):
    g = np.array([-80.0, -3.0, -0.5, 0.0, 0.25, 2.0, 40.0], dtype)
    u = np.array([1.5, -2.0, 3.0, 7.0, -0.5, 0.75, 2.0], dtype)
    y = np.empty_like(g)
    raw.silu_mul(g, u, y)
    want = [a / (1 + math.exp(-a)) * b for a, b in zip(g.tolist(), u.tolist())]
    np.testing.assert_allclose(y, want, rtol=1e-6 if dtype == np.float32 else 1e-14, atol=1e-30)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gelu_tanh_mul(emulate, dtype):
    g = np.array([-80.0, -6.0, -3.0, -0.5, 0.0, 0.25, 2.0, 40.0], dtype)
    u = np.array([1.5, -2.0, 3.0, 7.0, -0.5, 0.75, 2.0, -1.0], dtype)
    y = np.empty_like(g)
    raw.gelu_tanh_mul(g, u, y)
    k = math.sqrt(2 / math.pi)
    # (1 + tanh(z)) / 2 = 1 / (1 + exp(-2z)): the oracle in the form that keeps the digits 1 + tanh(z) loses
    # for a << 0 (in float64 too), so the kernel is held to relative accuracy there as well
    want = [a / (1 + math.exp(min(-2 * k * (a + 0.044715 * a**3), 700.0))) * b for a, b in zip(g.tolist(), u.tolist())]
    np.testing.assert_allclose(y, want, rtol=2e-6 if dtype == np.float32 else 1e-13, atol=1e-300)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softcap(emulate, dtype):
    x = np.array([-1e4, -80.0, -3.0, -0.5, 0.0, 0.25, 2.0, 40.0, 1e30], dtype)
    y = np.empty_like(x)
    raw.softcap(x, 30.0, y)
    want = [30.0 * math.tanh(v / 30.0) for v in x.tolist()]
    np.testing.assert_allclose(y, want, rtol=1e-6 if dtype == np.float32 else 1e-14, atol=1e-30)
    x0 = x.copy()
    raw.softcap(x, 0.5, x)  # in place
    np.testing.assert_allclose(x, [0.5 * math.tanh(v / 0.5) for v in x0.tolist()], rtol=1e-6, atol=1e-30)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("weight", [False, True])
def test_rms_norm_rows(emulate, dtype, weight):
    rng = _rng(5)
    x = rng.standard_normal((3, 10)).astype(dtype)
    w = rng.standard_normal(10).astype(dtype) if weight else None
    y, rstd = np.empty_like(x), np.empty(3, dtype)
    raw.rms_norm_rows(x, w, y, rstd, 1e-6)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    for r in range(3):
        row = [float(v) for v in x[r]]
        want_r = 1 / math.sqrt(math.fsum(v * v for v in row) / 10 + 1e-6)
        assert rstd[r] == pytest.approx(want_r, rel=tol)
        want = [v * want_r * (float(w[j]) if weight else 1.0) for j, v in enumerate(row)]
        np.testing.assert_allclose(y[r], want, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rope_rows(emulate, dtype):
    rng = _rng(6)
    b, h, t, d, p = 2, 3, 4, 6, 9
    x = rng.standard_normal((b, h, t, d)).astype(dtype)
    ang = rng.uniform(-3, 3, (p, d // 2))
    cos, sin = np.cos(ang).astype(dtype), np.sin(ang).astype(dtype)
    pos = rng.integers(0, p, (b, t)).astype(np.int64)
    y = np.empty_like(x)
    raw.rope_rows(x, cos, sin, pos, y)
    tol = 1e-6 if dtype == np.float32 else 1e-14
    for bi, hi, ti in np.ndindex(b, h, t):
        for j in range(d // 2):
            a = ang[pos[bi, ti], j]
            x1, x2 = float(x[bi, hi, ti, j]), float(x[bi, hi, ti, j + d // 2])
            # a rotation of the pair (x1, x2) by the angle a
            assert y[bi, hi, ti, j] == pytest.approx(x1 * math.cos(a) - x2 * math.sin(a), rel=tol, abs=tol)
            assert y[bi, hi, ti, j + d // 2] == pytest.approx(x2 * math.cos(a) + x1 * math.sin(a), rel=tol, abs=tol)


def test_every_elementwise_source_named_after_a_catalogue_op_is_its_kernel(emulate):
    from kael.backends import catalogue

    from kael_backend_cuda import _elementwise

    for name in raw.ELEMENTWISE_SOURCES:
        if name in catalogue.POINTWISE_OPS:
            assert _elementwise.KERNELS[name].__name__ == name
            assert _elementwise.KERNELS[name].__qualname__.startswith("_source"), name


def test_block_sizes_are_warp_multiples():
    for cols, want in [(1, 32), (32, 32), (33, 64), (768, 1024), (50257, 1024)]:
        assert raw._block(cols) == want


def test_cuda_source_defines_every_launched_kernel():
    src = raw.ROW_KERNELS_SOURCE
    for name in {n.split("<")[0] for n in raw.row_kernel_names()}:
        assert re.search(rf"__global__ void {name}\(", src), name
    for name, (ins, outs, body) in raw.ELEMENTWISE_SOURCES.items():
        assert body.strip() and ins and outs, name


def _nvrtc() -> object:
    """CuPy's NVRTC binding if CuPy and an NVRTC library are installed (no GPU needed), else skip."""
    try:
        from cupy_backends.cuda.libs import nvrtc

        nvrtc.getVersion()
    except Exception as exc:
        pytest.skip(f"NVRTC not available: {type(exc).__name__}: {exc}")
    return nvrtc


def _compile(nvrtc: object, src: str, names: list[str]) -> None:
    prog = nvrtc.createProgram(src, "kael.cu", [], [])  # type: ignore[attr-defined]
    for n in names:
        nvrtc.addNameExpression(prog, n)  # type: ignore[attr-defined]
    try:
        nvrtc.compileProgram(prog, ["--std=c++14", "--gpu-architecture=compute_75"])  # type: ignore[attr-defined]
    except Exception:
        pytest.fail(nvrtc.getProgramLog(prog))  # type: ignore[attr-defined]


def test_cuda_sources_compile_with_nvrtc():
    nvrtc = _nvrtc()
    _compile(nvrtc, raw.ROW_KERNELS_SOURCE, raw.row_kernel_names())
    _compile(nvrtc, _quant.QUANT_KERNELS_SOURCE, [])
    types = {"T": "T", "int32": "int", "int64": "long long", "float32": "float", "float64": "double"}
    for ins, outs, body in raw.ELEMENTWISE_SOURCES.values():
        decls = "".join(
            f"{types[p.split()[0]]} {p.split()[1]} = {types[p.split()[0]]}(1);\n" for p in f"{ins}, {outs}".split(",")
        )
        src = f"template <typename T> __global__ void check(T* sink) {{\n{decls}{body}\nsink[0] = T(0);\n}}\n"
        _compile(nvrtc, src, ["check<float>", "check<double>"])


def _instantiations() -> str:
    """Explicit instantiations of every row kernel for float and double (what CuPy's name_expressions ask for)."""
    lines = []
    for name in sorted({n.split("<")[0] for n in raw.row_kernel_names()}):
        m = re.search(rf"__global__ void {name}\(([^)]*)\)", raw.ROW_KERNELS_SOURCE)
        assert m, name
        for t in ("float", "double"):
            params = re.sub(r"\bT\b", t, m.group(1))
            lines.append(f"template __global__ void {name}<{t}>({params});")
    return "\n".join(lines)


def test_cuda_sources_compile_with_nvcc(tmp_path):
    """With nvcc on PATH (no GPU needed), every CUDA source compiles to PTX for sm_80, both T."""
    import shutil
    import subprocess

    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH")
    types = {"T": "T", "int32": "int", "int64": "long long", "float32": "float", "float64": "double"}
    sources = {"rows": raw.ROW_KERNELS_SOURCE + "\n" + _instantiations() + "\n"}
    sources["quant"] = _quant.QUANT_KERNELS_SOURCE  # extern "C" kernels (test_quant.py also checks sm_90)
    for name, (ins, outs, body) in raw.ELEMENTWISE_SOURCES.items():
        decls = "".join(
            f"{types[p.split()[0]]} {p.split()[1]} = {types[p.split()[0]]}(1);\n" for p in f"{ins}, {outs}".split(",")
        )
        sources[name] = (
            f"template <typename T> __global__ void check(T* sink) {{\n{decls}{body}\nsink[0] = T(0);\n}}\n"
            "template __global__ void check<float>(float*);\ntemplate __global__ void check<double>(double*);\n"
        )
    for name, src in sources.items():
        cu = tmp_path / f"{name}.cu"
        cu.write_text(src)
        r = subprocess.run(
            [nvcc, "-arch=sm_80", "-std=c++14", "--ptx", str(cu), "-o", str(tmp_path / f"{name}.ptx")],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0, f"{name}: nvcc failed:\n{r.stderr}"
    entries = re.findall(r"\.entry (\w+)\(", (tmp_path / "rows.ptx").read_text())
    for name in {n.split("<")[0] for n in raw.row_kernel_names()}:
        mangled = {e for e in entries if e.startswith(f"_Z{len(name)}{name}I")}
        assert len(mangled) == 2, (name, mangled)  # the float and the double entry point


# -- launch arguments against the CUDA signatures (the GPU path, without a GPU) ----------------------------
_CTYPES = {"int": np.int32, "long long": np.int64}


def _signature(name: str) -> list[str]:
    """The parameter types of __global__ kernel `name` in ROW_KERNELS_SOURCE, e.g. ['const T*', 'int', ...]."""
    m = re.search(rf"__global__ void {name}\(([^)]*)\)", raw.ROW_KERNELS_SOURCE)
    assert m, name
    return [" ".join(p.split()[:-1]) for p in m.group(1).replace("\n", " ").split(",")]


def _check_row_args(name: str, dtype: type, args: tuple) -> None:
    params = _signature(name)
    assert len(args) == len(params), (name, params, args)
    for ptype, arg in zip(params, args):
        base = ptype.replace("const", "").strip()
        if base.endswith("*"):  # a device pointer: a C-contiguous array of the pointee type
            want = dtype if base[:-1].strip() == "T" else _CTYPES[base[:-1].strip()]
            assert isinstance(arg, np.ndarray) and arg.dtype == want and arg.flags.c_contiguous, (name, ptype, arg)
        else:  # a scalar passed by value: a NumPy scalar of exactly the C type's width
            want = dtype if base == "T" else _CTYPES[base]
            assert type(arg) is want, (name, ptype, type(arg))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_launch_arguments_match_the_cuda_signatures(monkeypatch, dtype):
    from kael_backend_cuda import _pointwise_kernels, _xp

    launched: list[tuple] = []
    elementwise: list[tuple] = []
    monkeypatch.setattr(_xp, "_state", _xp._State(np, False, True, "", 1, None))  # "a GPU" with NumPy arrays
    monkeypatch.setattr(
        raw, "_launch", lambda name, rows, cols, dt, args: launched.append((name, rows, cols, dt, args))
    )
    monkeypatch.setattr(_pointwise_kernels, "_ew", lambda name: lambda *args: elementwise.append((name, args)))
    x = np.ones((3, 5), dtype)
    v = np.ones(3, dtype)
    raw.softmax_rows(x, x.copy(), True)
    raw.layer_norm_rows(x, None, np.ones(5, dtype), x.copy(), v.copy(), v.copy(), 1e-5)
    raw.layer_norm_backward_rows(x, x, v, v, np.ones(5, dtype), x.copy())
    raw.cross_entropy_rows(x, np.zeros(3, np.int64), v.copy(), -100, 0.1)
    raw.attention_softmax(np.ones((1, 3, 2, 4), dtype), np.ones(1, np.int64), 3, 2, 0.5, True)
    raw.attention_softmax(np.ones((1, 3, 2, 4), dtype), None, 3, 2, 0.5, False)
    raw.rms_norm_rows(x, np.ones(5, dtype), x.copy(), v.copy(), 1e-6)
    raw.rms_norm_rows(x, None, x.copy(), v.copy(), 1e-6)
    tables = np.ones((4, 2), dtype)
    raw.rope_rows(
        np.ones((2, 3, 2, 4), dtype), tables, tables.copy(), np.zeros((2, 2), np.int64), np.ones((2, 3, 2, 4), dtype)
    )
    raw.paged_attention_rows(
        np.ones((2, 4, 2, 3), dtype),
        np.ones((5, 2, 2, 4, 3), dtype),
        np.zeros((2, 2), np.int64),
        np.full(2, 3, np.int64),
        np.ones((2, 4, 2, 3), dtype),
        0.5,
    )
    for name, rows, cols, dt, args in launched:
        assert dt == dtype and rows >= 1 and cols >= 1
        _check_row_args(name, dtype, args)
    assert {n for n, *_ in launched} == {n.split("<")[0] for n in raw.row_kernel_names()}

    y = np.ones(4, dtype)
    raw.erf(y, y.copy())
    raw.pointwise("silu", y, y.copy())
    raw.silu_mul(y, y.copy(), y.copy())
    raw.gelu_tanh_mul(y, y.copy(), y.copy())
    raw.softcap(y, 30.0, y.copy())
    raw.gelu(y, y.copy(), True)
    raw.gelu_backward(y, y, y.copy(), False)
    raw.adamw(y.copy(), y, y.copy(), y.copy(), 1e-3, 0.9, 0.999, 1e-8, 0.01, 0.1, 0.001)
    for name, args in elementwise:
        ins, outs, _ = raw.ELEMENTWISE_SOURCES[name]
        params = [p.split()[0] for p in f"{ins}, {outs}".split(",")]
        assert len(args) == len(params), (name, params)
        for ptype, arg in zip(params, args):
            if ptype == "T":
                assert isinstance(arg, np.ndarray) and arg.dtype == dtype, (name, arg)
            elif ptype == "int32":
                assert type(arg) is np.int32, (name, type(arg))
            else:
                assert ptype == "float64" and isinstance(arg, float), (name, ptype, arg)
    assert {n for n, _ in elementwise} == set(raw.ELEMENTWISE_SOURCES)
