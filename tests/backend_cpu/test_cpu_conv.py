"""The C++ conv2d / conv2d_backward kernels (csrc/conv.cpp) and the reductions over (0, 2, 3) they lean on.

conv kernels are called directly and compared with the NumPy host kernels (float64
math) and torch on random shapes, strides, paddings, dilations and groups, strided
operands and outputs, dtypes, wanted-gradient subsets and thread counts; bad shapes
raise KaelErrors naming the op. The reductions over a batch dim plus contiguous trailing
dims (the broadcast-bias backward; csrc/reduce.cpp's run-combining path) are checked
against NumPy for every reduce op. Skipped when the installed extension has no conv2d.
"""

from __future__ import annotations

from typing import Any

import kael
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("kael_backend_cpu")

from kael.backends import host  # noqa: E402
from kael_backend_cpu._native import C  # noqa: E402

pytestmark = pytest.mark.skipif(
    not hasattr(C, "conv2d"), reason="this build of kael_backend_cpu._C has no conv2d (built before it was added)"
)
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
TOL = {"float64": (1e-12, 1e-12), "float32": (1e-5, 2e-5), "float16": (2e-3, 2e-3), "bfloat16": (1.6e-2, 1.6e-2)}


@st.composite
def geometry(draw: Any) -> dict[str, Any]:
    g = draw(st.sampled_from([1, 1, 2, 4]))
    c, o = g * draw(st.integers(1, 3)), g * draw(st.integers(1, 3))
    kh, kw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    s = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    p = (draw(st.integers(0, 3)), draw(st.integers(0, 3)))
    d = (draw(st.integers(1, 3)), draw(st.integers(1, 2)))
    h = draw(st.integers(max(1, d[0] * (kh - 1) + 1 - 2 * p[0]), 10))
    w = draw(st.integers(max(1, d[1] * (kw - 1) + 1 - 2 * p[1]), 10))
    return {"x": (draw(st.integers(0, 3)), c, h, w), "w": (o, c // g, kh, kw), "attrs": (s, p, d, g)}


def _out_shape(geo: dict[str, Any]) -> tuple[int, int, int, int]:
    (n, _, h, w), (o, _, kh, kw) = geo["x"], geo["w"]
    s, p, d, _ = geo["attrs"]
    return n, o, (h + 2 * p[0] - d[0] * (kh - 1) - 1) // s[0] + 1, (w + 2 * p[1] - d[1] * (kw - 1) - 1) // s[1] + 1


def _t(v: np.ndarray, dtype: str, layout: str = "contiguous") -> kael.Tensor:
    t = kael.tensor(v).to(dtype=getattr(kael, dtype))
    if layout == "channels_last":
        return kael.tensor(np.ascontiguousarray(v.transpose(0, 2, 3, 1))).to(dtype=t.dtype).permute(0, 3, 1, 2)
    if layout == "strided":  # every other element of a buffer twice as long in the last dim
        big = kael.zeros(*v.shape[:-1], 2 * v.shape[-1], dtype=t.dtype)
        view = big[..., ::2]
        view.copy_(t)
        return view
    return t


def _np(t: kael.Tensor) -> np.ndarray:
    return t.to(dtype=kael.float64).numpy()


def _close(a: kael.Tensor, b: kael.Tensor, dtype: str, msg: str) -> None:
    rtol, atol = TOL[dtype]
    np.testing.assert_allclose(_np(a), _np(b), rtol=rtol, atol=atol, err_msg=msg)


@given(geo=geometry(), dtype=st.sampled_from(["float64", "float32", "float16", "bfloat16"]), seed=st.integers(0, 99))
@SETTINGS
def test_forward_and_backward_match_the_host_kernels(geo: dict[str, Any], dtype: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    unit = dtype in ("float16", "bfloat16")
    draw = (lambda s: rng.uniform(-1, 1, s)) if unit else rng.standard_normal
    x, w, b, g = draw(geo["x"]), draw(geo["w"]), draw(geo["w"][0]), draw(_out_shape(geo))
    lx = ["contiguous", "channels_last", "strided"][seed % 3]
    args = (_t(x, dtype, lx), _t(w, dtype), _t(b, dtype))
    kd = getattr(kael, dtype)
    out, want = kael.empty(*_out_shape(geo), dtype=kd), kael.empty(*_out_shape(geo), dtype=kd)
    C.conv2d(out, *args, *geo["attrs"])
    host.kernel("conv2d")(want, *args, *geo["attrs"])
    _close(out, want, dtype, "out")
    grads = [kael.empty(*s, dtype=kd) for s in (geo["x"], geo["w"], (geo["w"][0],))]
    wants = [kael.empty(*s, dtype=kd) for s in (geo["x"], geo["w"], (geo["w"][0],))]
    gt = _t(g, dtype, "channels_last" if seed % 2 else "contiguous")
    C.conv2d_backward(*grads, gt, args[0], args[1], *geo["attrs"])
    host.kernel("conv2d_backward")(*wants, gt, args[0], args[1], *geo["attrs"])
    for name, a, e in zip(("dx", "dweight", "dbias"), grads, wants):
        _close(a, e, dtype, name)


def test_float32_against_torch_with_threads_and_subsets_of_gradients() -> None:
    rng = np.random.default_rng(0)
    x, w, b = rng.standard_normal((8, 6, 15, 13)), rng.standard_normal((10, 3, 3, 5)), rng.standard_normal(10)
    attrs = ((2, 1), (1, 2), (1, 2), 2)
    tx, tw, tb = (torch.tensor(v, dtype=torch.float32, requires_grad=True) for v in (x, w, b))
    ty = torch.nn.functional.conv2d(tx, tw, tb, *attrs)
    g = rng.standard_normal(tuple(ty.shape))
    ty.backward(torch.tensor(g, dtype=torch.float32))
    args = [kael.tensor(v).to(dtype=kael.float32) for v in (x, w, b)]
    before = kael.get_num_threads()
    try:
        for threads in (1, 2):
            kael.set_num_threads(threads)
            out = kael.empty(*ty.shape)
            C.conv2d(out, *args, *attrs)
            np.testing.assert_allclose(out.numpy(), ty.detach().numpy(), rtol=1e-4, atol=1e-4)
            for want in [(0,), (1,), (2,), (0, 1, 2)]:
                shapes = (x.shape, w.shape, (10,))
                outs = [kael.empty(*shapes[i]) if i in want else None for i in range(3)]
                C.conv2d_backward(*outs, kael.tensor(g).to(dtype=kael.float32), args[0], args[1], *attrs)
                for i, ref in enumerate((tx.grad, tw.grad, tb.grad)):
                    got = outs[i]
                    if got is not None and ref is not None:
                        np.testing.assert_allclose(got.numpy(), ref.numpy(), rtol=1e-4, atol=1e-4)
    finally:
        kael.set_num_threads(before)


@given(geo=geometry(), seed=st.integers(0, 99))
@SETTINGS
def test_a_sample_alone_gives_its_rows_of_the_batch_bit_for_bit(geo: dict[str, Any], seed: int) -> None:
    """Output and dx of each sample computed alone equal its rows of the batched call exactly (csrc/conv.cpp's
    NOTE [conv2d columns]); dweight and dbias equal float64 torch's within float32 rounding."""
    rng = np.random.default_rng(seed)
    n = 2 + seed % 17  # past one block of samples (kSamplesPerBlock) at times
    xs = (n,) + geo["x"][1:]
    x, w, b = rng.standard_normal(xs), rng.standard_normal(geo["w"]), rng.standard_normal(geo["w"][0])
    oshape = (n,) + _out_shape(geo)[1:]
    g = rng.standard_normal(oshape)
    kx, kw_, kb, kg = (kael.tensor(v).to(dtype=kael.float32) for v in (x, w, b, g))
    out = kael.empty(*oshape)
    C.conv2d(out, kx, kw_, kb, *geo["attrs"])
    grads = [kael.empty(*xs), kael.empty(*geo["w"]), kael.empty(geo["w"][0])]
    C.conv2d_backward(*grads, kg, kx, kw_, *geo["attrs"])
    for i in (0, n // 2, n - 1):
        one, dxi = kael.empty(1, *oshape[1:]), kael.empty(1, *xs[1:])
        C.conv2d(one, kael.tensor(x[i : i + 1]).to(dtype=kael.float32), kw_, kb, *geo["attrs"])
        C.conv2d_backward(
            dxi,
            None,
            None,
            kael.tensor(g[i : i + 1]).to(dtype=kael.float32),
            kael.tensor(x[i : i + 1]).to(dtype=kael.float32),
            kw_,
            *geo["attrs"],
        )
        np.testing.assert_array_equal(one.numpy()[0], out.numpy()[i])
        np.testing.assert_array_equal(dxi.numpy()[0], grads[0].numpy()[i])
    tx, tw = (torch.tensor(v, requires_grad=True) for v in (x, w))
    ty = torch.nn.functional.conv2d(tx, tw, torch.tensor(b), *geo["attrs"])
    ty.backward(torch.tensor(g))
    assert tx.grad is not None and tw.grad is not None
    np.testing.assert_allclose(out.numpy(), ty.detach().numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(grads[0].numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(grads[1].numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(grads[2].numpy(), g.sum(axis=(0, 2, 3)), rtol=1e-5, atol=1e-4)


def test_gradients_do_not_depend_on_the_thread_count() -> None:
    """dweight is summed per fixed block of samples and the blocks in order: 1 and 2 threads agree exactly."""
    rng = np.random.default_rng(1)
    x, w, g = (
        rng.standard_normal((21, 4, 12, 12)),
        rng.standard_normal((6, 2, 3, 3)),
        rng.standard_normal((21, 6, 6, 6)),
    )
    attrs = ((2, 2), (1, 1), (1, 1), 2)
    kx, kw_, kg = (kael.tensor(v).to(dtype=kael.float32) for v in (x, w, g))
    before = kael.get_num_threads()
    got = []
    try:
        for threads in (1, 2):
            kael.set_num_threads(threads)
            outs = [kael.empty(*x.shape), kael.empty(*w.shape), kael.empty(6)]
            C.conv2d_backward(*outs, kg, kx, kw_, *attrs)
            got.append([t.numpy() for t in outs])
    finally:
        kael.set_num_threads(before)
    for a, e in zip(got[0], got[1], strict=True):
        np.testing.assert_array_equal(a, e)


def test_strided_output_is_written_in_place_and_nothing_else() -> None:
    rng = np.random.default_rng(1)
    x, w = kael.tensor(rng.standard_normal((2, 3, 5, 5))), kael.tensor(rng.standard_normal((4, 3, 3, 3)))
    big = kael.full((2, 4, 3, 6), 7.0, dtype=kael.float64)
    C.conv2d(big[..., ::2], x, w, None, (1, 1), (0, 0), (1, 1), 1)
    want = kael.empty(2, 4, 3, 3, dtype=kael.float64)
    host.kernel("conv2d")(want, x, w, None, (1, 1), (0, 0), (1, 1), 1)
    np.testing.assert_allclose(big.numpy()[..., ::2], want.numpy(), rtol=1e-12)
    np.testing.assert_array_equal(big.numpy()[..., 1::2], 7.0)


def test_bad_shapes_raise_kael_errors_naming_the_op() -> None:
    x, w = kael.zeros(1, 4, 5, 5), kael.zeros(2, 4, 3, 3)
    with pytest.raises(kael.ShapeError, match=r"conv2d: output/grad must be \[1, 2, 3, 3\], got \[1, 2, 4, 4\]"):
        C.conv2d(kael.empty(1, 2, 4, 4), x, w, None, (1, 1), (0, 0), (1, 1), 1)
    with pytest.raises(kael.ShapeError, match="conv2d: groups 3 must divide in_channels 4"):
        C.conv2d(kael.empty(1, 2, 3, 3), x, w, None, (1, 1), (0, 0), (1, 1), 3)
    with pytest.raises(kael.ShapeError, match=r"conv2d: the dilated kernel \(3, 3\) is larger than the padded input"):
        C.conv2d(kael.empty(1, 2, 1, 1), kael.zeros(1, 4, 2, 2), w, None, (1, 1), (0, 0), (1, 1), 1)
    with pytest.raises(kael.ShapeError, match=r"conv2d: stride \(0, 1\)"):
        C.conv2d(kael.empty(1, 2, 3, 3), x, w, None, (0, 1), (0, 0), (1, 1), 1)
    with pytest.raises(kael.DTypeError, match="conv2d: x and weight must share a float dtype"):
        C.conv2d(kael.empty(1, 2, 3, 3), x, w.to(dtype=kael.float64), None, (1, 1), (0, 0), (1, 1), 1)
    with pytest.raises(kael.ShapeError, match="conv2d_backward: dweight must have weight's shape"):
        C.conv2d_backward(None, kael.empty(2, 4, 3, 2), None, kael.zeros(1, 2, 3, 3), x, w, (1, 1), (0, 0), (1, 1), 1)


@given(
    shape=st.tuples(st.integers(1, 5), st.integers(1, 4), st.integers(1, 6), st.integers(8, 40)),
    dims=st.sampled_from([(0, 2, 3), (0, 3), (0, 1, 3), (1, 3), (0, 2)]),
    op=st.sampled_from(["sum", "amax", "amin", "prod", "any"]),
    dtype=st.sampled_from(["float32", "float64", "int32", "int64"]),
    seed=st.integers(0, 99),
)
@SETTINGS
def test_reductions_over_a_leading_dim_and_contiguous_runs_match_numpy(
    shape: tuple[int, ...], dims: tuple[int, ...], op: str, dtype: str, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    v = rng.uniform(0.5, 1.5, shape) if op == "prod" else rng.standard_normal(shape) * 4
    v = v.astype(dtype)
    if op == "any":
        v = (v * (rng.random(shape) < 0.02)).astype(dtype)
    out_dtype = {"any": kael.bool, "sum": None, "prod": None}.get(op)
    if out_dtype is None:
        out_dtype = kael.int64 if op in ("sum", "prod") and dtype.startswith("int") else getattr(kael, dtype)
    keep = tuple(1 if i in dims else n for i, n in enumerate(shape))
    out = kael.empty(*keep, dtype=out_dtype)
    kernel: Any = getattr(C, op)
    kernel(out, kael.tensor(v), dims)
    fn: Any = {"sum": np.sum, "amax": np.max, "amin": np.min, "prod": np.prod, "any": np.any}[op]
    want = fn(v.astype(np.float64) if op in ("sum", "prod") else v, axis=dims, keepdims=True)
    np.testing.assert_allclose(out.numpy().astype(np.float64), np.asarray(want, dtype=np.float64), rtol=1e-5, atol=1e-4)
