"""Property tests (hypothesis): elementwise, reduction, matmul, indexing and shape ops against NumPy.

Operands come in random shapes (0-d and empty included), dtypes and memory layouts:
contiguous, permuted (non-contiguous strides), strided slices with offsets, and
stride-0 expansions; binary operands are mutually broadcastable. The oracle is NumPy
computing in the dtype PyTorch's promotion rules pick.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import kael
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from kael import _dtype as dt
from kael.testing import assert_close

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FLOATS = [kael.float32, kael.float64]
INTS = [kael.int32, kael.int64, kael.uint8, kael.int8]
ALL = FLOATS + INTS + [kael.bool]
LAYOUTS = ["contiguous", "permuted", "strided", "expanded"]


def _values(rng: np.random.Generator, shape: tuple[int, ...], d: dt.DType, kind: str) -> np.ndarray:
    if d is kael.bool:
        return rng.random(shape) < 0.5
    if d.category == 1:
        lo, hi = {"positive": (1, 5), "small": (0, 4)}.get(kind, (-4, 5) if d.is_signed else (0, 9))
        return rng.integers(lo, hi, size=shape).astype(d.np)
    if kind == "positive":
        return rng.uniform(0.25, 3.0, shape).astype(d.np)
    if kind == "small":
        return rng.uniform(-1.5, 1.5, shape).astype(d.np)
    return (rng.standard_normal(shape) * 3).astype(d.np)


@st.composite
def operands(
    draw: st.DrawFn, shape: tuple[int, ...], dtypes: list[dt.DType], kind: str = "normal"
) -> tuple[kael.Tensor, np.ndarray]:
    """A kael tensor of `shape` in a random layout, and the NumPy array of its values."""
    d = draw(st.sampled_from(dtypes))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    layout = draw(st.sampled_from(LAYOUTS))
    nd = len(shape)
    if layout == "expanded" and nd:
        ones = draw(st.lists(st.booleans(), min_size=nd, max_size=nd))
        small = tuple(1 if o else n for o, n in zip(ones, shape))
        a = _values(rng, small, d, kind)
        return kael.tensor(a).expand(*shape), np.broadcast_to(a, shape)
    a = _values(rng, shape, d, kind)
    if layout == "permuted" and nd > 1:
        perm = draw(st.permutations(range(nd)))
        inv = tuple(int(i) for i in np.argsort(perm))
        stored = np.ascontiguousarray(a.transpose(perm))
        t = kael.tensor(stored).permute(*inv)
        assert t.shape == shape
        return t, a
    if layout == "strided" and nd:
        big = np.zeros(tuple(2 * n + 1 for n in shape), dtype=a.dtype)
        sl = tuple(slice(1, None, 2) for _ in shape)
        big[sl] = a
        return kael.tensor(big)[sl], a
    return kael.tensor(a), a


SHAPES = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4)


def _np_dtype(t: kael.Tensor) -> Any:
    return t.dtype.np


def _check(got: kael.Tensor, want: np.ndarray, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
    if got.dtype.is_floating_point:
        assert_close(got, want, rtol=rtol, atol=atol)
    else:
        assert got.tolist() == want.tolist()


# -- elementwise -----------------------------------------------------------------------------------

UNARY: dict[str, tuple[Callable[[Any], Any], Callable[[np.ndarray], np.ndarray], str, list[dt.DType]]] = {
    "neg": (lambda t: -t, np.negative, "normal", FLOATS + [kael.int32, kael.int64]),
    "abs": (kael.abs, np.abs, "normal", FLOATS + [kael.int32, kael.int64]),
    "exp": (kael.exp, np.exp, "normal", FLOATS),
    "log": (kael.log, np.log, "positive", FLOATS),
    "sqrt": (kael.sqrt, np.sqrt, "positive", FLOATS),
    "tanh": (kael.tanh, np.tanh, "normal", FLOATS),
    "sin": (kael.sin, np.sin, "normal", FLOATS),
    "sigmoid": (kael.sigmoid, lambda a: 1 / (1 + np.exp(-a)), "normal", FLOATS),
    "floor": (kael.floor, np.floor, "normal", FLOATS),
    "round": (kael.round, np.round, "normal", FLOATS),
    "sign": (kael.sign, np.sign, "normal", FLOATS + [kael.int64]),
    "relu": (kael.relu, lambda a: np.maximum(a, 0).astype(a.dtype), "normal", FLOATS + [kael.int64]),
    "logical_not": (kael.logical_not, np.logical_not, "normal", ALL),
}


@pytest.mark.parametrize("name", sorted(UNARY))
@SETTINGS
@given(data=st.data())
def test_unary(name: str, data: st.DataObject) -> None:
    kop, nop, kind, dtypes = UNARY[name]
    shape = data.draw(SHAPES)
    t, a = data.draw(operands(shape, dtypes, kind))
    with np.errstate(all="ignore"):
        want = np.asarray(nop(a))
    _check(kop(t), want.astype(want.dtype), rtol=2e-6 if t.dtype is kael.float32 else 1e-12)


BINARY: dict[str, tuple[Callable[[Any, Any], Any], Callable[[Any, Any], Any], str, list[dt.DType]]] = {
    "add": (lambda a, b: a + b, np.add, "normal", ALL),
    "sub": (lambda a, b: a - b, np.subtract, "normal", FLOATS + INTS),
    "mul": (lambda a, b: a * b, np.multiply, "normal", ALL),
    "div": (lambda a, b: a / b, np.true_divide, "positive", FLOATS + INTS),
    "pow": (lambda a, b: a**b, np.power, "small", FLOATS + [kael.int64]),
    "maximum": (kael.maximum, np.maximum, "normal", ALL),
    "minimum": (kael.minimum, np.minimum, "normal", FLOATS + INTS),
    "remainder": (lambda a, b: a % b, np.remainder, "positive", FLOATS + [kael.int32, kael.int64]),
    "floor_divide": (lambda a, b: a // b, np.floor_divide, "positive", FLOATS + [kael.int64]),
    "eq": (lambda a, b: a == b, np.equal, "small", ALL),
    "lt": (lambda a, b: a < b, np.less, "normal", ALL),
    "ge": (lambda a, b: a >= b, np.greater_equal, "normal", ALL),
    "logical_and": (lambda a, b: kael.logical_and(a, b), np.logical_and, "normal", ALL),
}
_BOOL_OUT = {"eq", "lt", "ge", "logical_and"}


@pytest.mark.parametrize("name", sorted(BINARY))
@SETTINGS
@given(data=st.data())
def test_binary_broadcast_and_promotion(name: str, data: st.DataObject) -> None:
    kop, nop, kind, dtypes = BINARY[name]
    shapes = data.draw(hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3, max_side=4))
    ta, a = data.draw(operands(shapes.input_shapes[0], dtypes, "small" if name == "pow" else "normal"))
    tb, b = data.draw(operands(shapes.input_shapes[1], dtypes, kind))
    if name == "sub" and ta.dtype is kael.bool and tb.dtype is kael.bool:
        return
    ctype = kael.result_type(ta, tb)
    if name == "div" and not ctype.is_floating_point:
        ctype = kael.float32
    if name == "logical_and":
        ctype = kael.bool
    if name == "pow" and ctype.category == 1 and (b < 0).any():
        return  # integers to negative powers are an error, tested in test_errors
    got = kop(ta, tb)
    with np.errstate(all="ignore"):
        want = np.asarray(nop(a.astype(ctype.np), b.astype(ctype.np)))
    want = want.astype(bool if name in _BOOL_OUT else ctype.np)
    assert got.dtype is (kael.bool if name in _BOOL_OUT else ctype)
    _check(got, want, rtol=3e-6 if ctype is kael.float32 else 1e-12)


@pytest.mark.parametrize("name", ["add", "mul", "sub", "div", "maximum", "lt"])
@SETTINGS
@given(
    data=st.data(),
    scalar=st.one_of(st.integers(-3, 3), st.floats(-3, 3, width=32), st.booleans()),
    reflected=st.booleans(),
)
def test_python_scalar_operands(name: str, data: st.DataObject, scalar: Any, reflected: bool) -> None:
    kop, nop, _, dtypes = BINARY[name]
    t, a = data.draw(operands(data.draw(SHAPES), [d for d in dtypes if d is not kael.bool]))
    if name == "div" and scalar == 0:
        return
    ctype = kael.result_type(t, scalar)
    if name == "div" and not ctype.is_floating_point:
        ctype = kael.float32
    got = kop(scalar, t) if reflected else kop(t, scalar)
    x = a.astype(ctype.np)
    s = np.asarray(scalar).astype(ctype.np)
    with np.errstate(all="ignore"):
        want = np.asarray(nop(s, x) if reflected else nop(x, s))
    if name != "lt":
        assert got.dtype is ctype
        want = want.astype(ctype.np)
    _check(got, want, rtol=3e-6 if ctype is kael.float32 else 1e-12)


@SETTINGS
@given(data=st.data())
def test_where_and_clamp(data: st.DataObject) -> None:
    shapes = data.draw(hnp.mutually_broadcastable_shapes(num_shapes=3, min_dims=0, max_dims=3, max_side=3))
    tc, c = data.draw(operands(shapes.input_shapes[0], [kael.bool]))
    ta, a = data.draw(operands(shapes.input_shapes[1], FLOATS + INTS))
    tb, b = data.draw(operands(shapes.input_shapes[2], FLOATS + INTS))
    ctype = kael.result_type(ta, tb)
    _check(kael.where(tc, ta, tb), np.where(c, a.astype(ctype.np), b.astype(ctype.np)))
    tf, f = data.draw(operands(shapes.input_shapes[1], FLOATS))
    _check(kael.clamp(tf, -1.0, 2.0), np.clip(f, -1.0, 2.0))


# -- reductions ------------------------------------------------------------------------------------


@st.composite
def reduce_args(draw: st.DrawFn, dtypes: list[dt.DType], nonempty: bool = False) -> tuple[Any, ...]:
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=1 if nonempty else 0, max_side=4))
    t, a = draw(operands(shape, dtypes))
    nd = len(shape)
    dims = (
        draw(
            st.one_of(
                st.none(),
                st.lists(st.integers(0, max(nd - 1, 0)), unique=True, min_size=1, max_size=max(nd, 1)).map(tuple),
            )
        )
        if nd
        else None
    )
    if dims is not None and draw(st.booleans()):
        dims = tuple(d - nd for d in dims)  # negative dims
    return t, a, dims, draw(st.booleans())


def _np_axis(dims: Any) -> Any:
    return None if dims is None else tuple(dims)


@SETTINGS
@given(args=reduce_args(FLOATS + INTS + [kael.bool]))
def test_sum_prod(args: tuple[Any, ...]) -> None:
    t, a, dims, keep = args
    acc = np.int64 if t.dtype.category < 2 else t.dtype.np
    _check(t.sum(dims, keepdim=keep), np.sum(a, axis=_np_axis(dims), keepdims=keep, dtype=acc), rtol=1e-5, atol=1e-5)
    if t.numel() <= 12:
        _check(t.prod(dims, keepdim=keep), np.prod(a, axis=_np_axis(dims), keepdims=keep, dtype=acc), rtol=1e-5)


@SETTINGS
@given(args=reduce_args(FLOATS))
def test_mean_var_std(args: tuple[Any, ...]) -> None:
    t, a, dims, keep = args
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # NumPy warns on empty means and ddof >= n
        want_mean = np.mean(a, axis=_np_axis(dims), keepdims=keep)
        want_var = np.var(a, axis=_np_axis(dims), keepdims=keep, ddof=1)
    _check(t.mean(dims, keepdim=keep), np.asarray(want_mean, t.dtype.np), rtol=1e-5, atol=1e-5)
    _check(t.var(dims, keepdim=keep), np.asarray(want_var, t.dtype.np), rtol=1e-4, atol=1e-4)
    _check(t.std(dims, keepdim=keep), np.sqrt(np.asarray(want_var, t.dtype.np)), rtol=1e-4, atol=1e-4)


@SETTINGS
@given(args=reduce_args(FLOATS + INTS, nonempty=True), which=st.sampled_from(["max", "min"]))
def test_amax_amin_argmax(args: tuple[Any, ...], which: str) -> None:
    t, a, dims, keep = args
    f = np.max if which == "max" else np.min
    _check(
        (kael.amax if which == "max" else kael.amin)(t, dims, keepdim=keep), f(a, axis=_np_axis(dims), keepdims=keep)
    )
    argf = np.argmax if which == "max" else np.argmin
    if dims is None:
        _check((kael.argmax if which == "max" else kael.argmin)(t), np.asarray(argf(a)))
    else:
        d = dims[0]
        got_v, got_i = (kael.max if which == "max" else kael.min)(t, d, keepdim=keep)
        _check(got_v, f(a, axis=d, keepdims=keep))
        _check(got_i, argf(a, axis=d, keepdims=keep) if a.ndim else np.asarray(0))


@SETTINGS
@given(args=reduce_args(ALL))
def test_any_all(args: tuple[Any, ...]) -> None:
    t, a, dims, keep = args
    _check(kael.any(t, dims, keepdim=keep), np.any(a, axis=_np_axis(dims), keepdims=keep))
    _check(kael.all(t, dims, keepdim=keep), np.all(a, axis=_np_axis(dims), keepdims=keep))


# -- matmul ------------------------------------------------------------------------------------------


@SETTINGS
@given(data=st.data())
def test_matmul_batch_broadcast(data: st.DataObject) -> None:
    m, k, n = (data.draw(st.integers(0, 4)) for _ in range(3))
    batch = data.draw(hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=2, max_side=3))
    vec_a, vec_b = data.draw(st.booleans()), data.draw(st.booleans())
    sa = (k,) if vec_a else batch.input_shapes[0] + (m, k)
    sb = (k,) if vec_b else batch.input_shapes[1] + (k, n)
    ta, a = data.draw(operands(sa, FLOATS + [kael.int64]))
    tb, b = data.draw(operands(sb, FLOATS + [kael.int64]))
    ctype = kael.promote_types(ta.dtype, tb.dtype)
    want = np.matmul(a.astype(ctype.np), b.astype(ctype.np))
    _check(ta @ tb, np.asarray(want), rtol=1e-5, atol=1e-5)


# -- indexing and shapes -----------------------------------------------------------------------------


@st.composite
def basic_keys(draw: st.DrawFn, shape: tuple[int, ...]) -> tuple[Any, ...]:
    key: list[Any] = []
    dims = list(shape)
    use_ellipsis = draw(st.booleans())
    for i, n in enumerate(dims):
        if use_ellipsis and i == len(dims) // 2 and draw(st.booleans()):
            key.append(Ellipsis)
            break
        kind = draw(st.sampled_from(["int", "slice", "none", "full"]) if n else st.sampled_from(["slice", "none"]))
        if kind == "int":
            key.append(draw(st.integers(-n, n - 1)))
        elif kind == "slice":
            key.append(
                slice(
                    draw(st.one_of(st.none(), st.integers(-5, 5))),
                    draw(st.one_of(st.none(), st.integers(-5, 5))),
                    draw(st.one_of(st.none(), st.integers(1, 3))),
                )
            )
        elif kind == "none":
            key.append(None)
            key.append(slice(None))
        else:
            key.append(slice(None))
    return tuple(key)


@SETTINGS
@given(data=st.data())
def test_basic_getitem_is_a_view(data: st.DataObject) -> None:
    shape = data.draw(SHAPES)
    t, a = data.draw(operands(shape, FLOATS + INTS))
    key = data.draw(basic_keys(shape))
    got = t[key]
    want = a[key]
    assert got._storage is t._storage
    _check(got, np.asarray(want))


@SETTINGS
@given(data=st.data())
def test_advanced_getitem(data: st.DataObject) -> None:
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4))
    t, a = data.draw(operands(shape, FLOATS + INTS))
    if data.draw(st.booleans()):
        mask = np.asarray(data.draw(hnp.arrays(bool, shape[: data.draw(st.integers(1, len(shape)))])))
        _check(t[kael.tensor(mask)], a[mask])
    else:
        dim = data.draw(st.integers(0, len(shape) - 1))
        idx = np.asarray(data.draw(st.lists(st.integers(-shape[dim], shape[dim] - 1), max_size=5)), dtype=np.int64)
        key = (slice(None),) * dim + (kael.tensor(idx),)
        _check(t[key], a[(slice(None),) * dim + (idx,)])


@SETTINGS
@given(data=st.data())
def test_gather_index_select_cat_stack(data: st.DataObject) -> None:
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4))
    t, a = data.draw(operands(shape, FLOATS + INTS))
    dim = data.draw(st.integers(0, len(shape) - 1))
    rng = np.random.default_rng(data.draw(st.integers(0, 1000)))
    idx_shape = tuple(rng.integers(1, n + 1) if i != dim else rng.integers(0, 5) for i, n in enumerate(shape))
    idx = rng.integers(0, shape[dim], size=idx_shape)
    _check(
        kael.gather(t, dim, kael.tensor(idx)),
        np.take_along_axis(
            a[tuple(slice(0, n) if i != dim else slice(None) for i, n in enumerate(idx_shape))], idx, dim
        ),
    )
    sel = rng.integers(0, shape[dim], size=rng.integers(0, 5))
    _check(kael.index_select(t, dim, kael.tensor(sel, dtype=kael.int64)), np.take(a, sel, axis=dim))
    u, b = data.draw(operands(shape, [t.dtype]))
    _check(kael.cat([t, u], dim), np.concatenate([a, b], dim))
    _check(kael.stack([t, u], dim), np.stack([a, b], dim))


@SETTINGS
@given(data=st.data())
def test_reshape_permute_flatten(data: st.DataObject) -> None:
    shape = data.draw(SHAPES)
    t, a = data.draw(operands(shape, FLOATS + INTS))
    _check(t.reshape(-1), a.reshape(-1))
    if len(shape) >= 1:
        perm = data.draw(st.permutations(range(len(shape))))
        _check(t.permute(*perm), a.transpose(perm))
        _check(t.flatten(), a.reshape(-1))
        _check(t.unsqueeze(0).squeeze(0), a)
    _check(t.contiguous(), a)
    _check(t.clone(), a)


@SETTINGS
@given(data=st.data())
def test_softmax_family(data: st.DataObject) -> None:
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=5))
    t, a = data.draw(operands(shape, FLOATS))
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    e = np.exp(a - a.max(axis=dim, keepdims=True))
    sm = e / e.sum(axis=dim, keepdims=True)
    _check(kael.softmax(t, dim), sm.astype(a.dtype), rtol=1e-5, atol=1e-6)
    _check(kael.log_softmax(t, dim), np.log(sm).astype(a.dtype), rtol=1e-5, atol=1e-5)
