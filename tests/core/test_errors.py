"""Bad input raises the right KaelError subclass, with a message naming the op, never a bare NumPy/Python error."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import kael
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kael.backends.reference import ReferenceBackend


def _t(*shape: int, dtype: Any = None) -> kael.Tensor:
    return kael.ones(*shape, dtype=dtype)


T = kael.tensor
# (description, call, expected error, a word the message must contain)
CASES: list[tuple[str, Callable[[], Any], type[Exception], str]] = [
    # shapes
    ("broadcast", lambda: _t(2, 3) + _t(3, 2), kael.ShapeError, "add"),
    ("matmul inner", lambda: _t(2, 3) @ _t(2, 3), kael.ShapeError, "matmul"),
    ("matmul 0-d", lambda: kael.matmul(T(1.0), _t(2)), kael.ShapeError, "matmul"),
    ("matmul batch", lambda: _t(2, 3, 4) @ _t(3, 4, 5), kael.ShapeError, "matmul"),
    ("view size", lambda: _t(6).view(4), kael.ShapeError, "view"),
    ("reshape two -1", lambda: _t(6).reshape(-1, -1), kael.ShapeError, "reshape"),
    ("expand", lambda: _t(2, 3).expand(4, 3), kael.ShapeError, "expand"),
    ("cat shapes", lambda: kael.cat([_t(2, 3), _t(2, 4)]), kael.ShapeError, "cat"),
    ("cat 0-d", lambda: kael.cat([T(1.0), T(2.0)]), kael.ShapeError, "cat"),
    ("stack shapes", lambda: kael.stack([_t(2), _t(3)]), kael.ShapeError, "stack"),
    ("negative size", lambda: kael.zeros(-1), kael.ShapeError, "zeros"),
    ("item", lambda: _t(2).item(), kael.ShapeError, "item"),
    ("permute count", lambda: _t(2, 3).permute(0), kael.ShapeError, "permute"),
    ("flatten order", lambda: _t(2, 3, 4).flatten(2, 1), kael.ShapeError, "flatten"),
    ("split sections", lambda: _t(5).split([2, 2]), kael.ShapeError, "split"),
    ("gather ndim", lambda: kael.gather(_t(2, 3), 1, T([0, 1])), kael.ShapeError, "gather"),
    ("copy_", lambda: _t(2, 3).copy_(_t(3, 2)), kael.ShapeError, "copy_"),
    ("ragged", lambda: T([[1, 2], [3]]), kael.ShapeError, "tensor"),
    ("layer_norm", lambda: kael.layer_norm(_t(2, 3), 4), kael.ShapeError, "layer_norm"),
    ("linear", lambda: kael.linear(_t(2, 3), _t(4, 5)), kael.ShapeError, "linear"),
    ("cross_entropy", lambda: kael.cross_entropy(_t(2, 3), T([0, 1, 2])), kael.ShapeError, "cross_entropy"),
    ("attention", lambda: kael.attention(_t(1, 1, 2, 4), _t(1, 1, 3, 5), _t(1, 1, 3, 5)), kael.ShapeError, "attention"),
    ("inplace bcast", lambda: _t(3).add_(_t(2, 3)), kael.ShapeError, "add"),
    ("setitem value", lambda: _t(2, 3).__setitem__(T([0]), _t(2, 2)), kael.ShapeError, "setitem"),
    ("topk k", lambda: kael.topk(_t(3), 4), kael.ShapeError, "topk"),
    ("len 0-d", lambda: len(T(1.0)), kael.ShapeError, "0-d"),
    # dtypes
    ("mean int", lambda: T([1, 2]).mean(), kael.DTypeError, "mean"),
    ("requires_grad int", lambda: T([1]).requires_grad_(), kael.DTypeError, "requires_grad"),
    ("bool sub", lambda: T([True]) - T([False]), kael.DTypeError, "sub"),
    ("bool neg", lambda: -T([True]), kael.DTypeError, "neg"),
    ("invert float", lambda: ~_t(2), kael.DTypeError, "~"),
    ("strings", lambda: T(["a"]), kael.DTypeError, "tensor"),
    ("unknown dtype", lambda: kael.zeros(2, dtype="float8"), kael.DTypeError, "float8"),
    ("numpy dtype", lambda: kael.zeros(2, dtype=np.complex64), kael.DTypeError, "complex64"),
    ("softmax int", lambda: kael.softmax(T([1, 2]), 0), kael.DTypeError, "softmax"),
    ("where cond", lambda: kael.where(_t(2), _t(2), _t(2)), kael.DTypeError, "where"),
    ("inplace float into int", lambda: T([1]).add_(0.5), kael.DTypeError, "add"),
    ("int negative power", lambda: T([2]) ** T([-1]), kael.DTypeError, "pow"),
    ("full overflow", lambda: kael.full((2,), 300, dtype=kael.uint8), kael.DTypeError, "full"),
    ("fill_ overflow", lambda: kael.zeros(2, dtype=kael.int8).fill_(1000), kael.DTypeError, "fill_"),
    ("fill_ nan into int", lambda: kael.zeros(2, dtype=kael.int32).fill_(float("nan")), kael.DTypeError, "fill_"),
    ("default dtype", lambda: kael.set_default_dtype(kael.int32), kael.DTypeError, "set_default_dtype"),
    ("from_numpy object", lambda: kael.from_numpy(np.array([object()])), kael.DTypeError, "from_numpy"),
    ("from_numpy list", lambda: kael.from_numpy([1, 2]), kael.DTypeError, "from_numpy"),  # type: ignore[arg-type]
    ("operand type", lambda: _t(2) + "x", kael.DTypeError, "add"),
    ("no tensor", lambda: kael.add(1, 2), kael.DTypeError, "add"),
    ("embedding ids", lambda: kael.embedding(_t(2), _t(3, 2)), kael.DTypeError, "embedding"),
    ("seed", lambda: kael.Generator().manual_seed("x"), kael.DTypeError, "manual_seed"),  # type: ignore[arg-type]
    ("numpy bf16", lambda: _t(2, dtype=kael.bfloat16).numpy(), kael.DTypeError, "numpy"),
    ("clamp none", lambda: kael.clamp(_t(2)), kael.DTypeError, "clamp"),
    ("gelu approximate", lambda: kael.gelu(_t(2), approximate="fast"), kael.DTypeError, "gelu"),
    (
        "reduction name",
        lambda: kael.cross_entropy(_t(2, 3), T([0, 1]), reduction="avg"),
        kael.DTypeError,
        "cross_entropy",
    ),
    ("int division by zero", lambda: T([1]) // T([0]), kael.KaelError, "floor_divide"),
    # devices
    ("device string", lambda: kael.device("cuda:x"), kael.DeviceError, "cuda:x"),
    ("device type", lambda: kael.device(3), kael.DeviceError, "device"),  # type: ignore[arg-type]
    ("unserved device", lambda: kael.ones(2, device="nosuchdev"), kael.DeviceError, "nosuchdev"),
    ("to unserved", lambda: _t(2).to("nosuchdev:1"), kael.DeviceError, "nosuchdev"),
    # indices
    ("int index", lambda: _t(3)[3], kael.IndexError_, "3"),
    ("negative index", lambda: _t(3)[-4], kael.IndexError_, "-4"),
    ("too many", lambda: _t(2, 2)[0, 0, 0], kael.IndexError_, "too many"),
    ("tensor index", lambda: _t(3)[T([0, 3])], kael.IndexError_, "3"),
    ("tensor index negative", lambda: _t(3)[T([-4])], kael.IndexError_, "-4"),
    ("float index", lambda: _t(3)[1.5], kael.IndexError_, "1.5"),
    ("float tensor index", lambda: _t(3)[T([0.0])], kael.IndexError_, "float"),
    ("mask shape", lambda: _t(3)[T([True, False])], kael.IndexError_, "mask"),
    ("select", lambda: _t(3).select(0, 5), kael.IndexError_, "select"),
    ("narrow", lambda: _t(3).narrow(0, 2, 2), kael.IndexError_, "narrow"),
    ("sum dim", lambda: _t(2, 3).sum(2), kael.IndexError_, "sum"),
    ("softmax dim", lambda: kael.softmax(_t(2), 1), kael.IndexError_, "softmax"),
    ("unsqueeze dim", lambda: _t(2).unsqueeze(3), kael.IndexError_, "unsqueeze"),
    ("transpose dim", lambda: _t(2, 3).transpose(0, 2), kael.IndexError_, "transpose"),
    ("gather range", lambda: kael.gather(_t(2, 3), 1, T([[0], [3]])), kael.IndexError_, "gather"),
    ("index_select range", lambda: kael.index_select(_t(2, 3), 0, T([2])), kael.IndexError_, "index_select"),
    ("embedding range", lambda: kael.embedding(T([0, 5]), _t(5, 2)), kael.IndexError_, "embedding"),
    ("cross_entropy range", lambda: kael.cross_entropy(_t(2, 3), T([0, 3])), kael.IndexError_, "cross_entropy"),
    ("setitem range", lambda: _t(3).__setitem__(T([3]), 1.0), kael.IndexError_, "3"),
    ("size dim", lambda: _t(2).size(1), kael.IndexError_, "size"),
]


@pytest.mark.parametrize(("desc", "call", "error", "word"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_raises_kael_error(desc: str, call: Callable[[], Any], error: type[Exception], word: str) -> None:
    with pytest.raises(error) as info:
        call()
    assert isinstance(info.value, kael.KaelError), f"{desc}: {type(info.value).__name__} is not a KaelError"
    assert word in str(info.value), f"{desc}: message {str(info.value)!r} does not mention {word!r}"


def test_errors_keep_builtin_bases() -> None:
    """Code that catches ValueError / TypeError / IndexError keeps working."""
    with pytest.raises(ValueError):
        _t(2) + _t(3)
    with pytest.raises(TypeError):
        T([1]).mean()
    with pytest.raises(IndexError):
        _t(2)[5]


def test_autograd_errors() -> None:
    x = kael.ones(2, requires_grad=True)
    y = (x * x).sum()
    y.backward()
    with pytest.raises(kael.AutogradError, match="second time"):
        y.backward()
    with pytest.raises(kael.AutogradError, match="scalar"):
        (x * 2).backward()
    with pytest.raises(kael.AutogradError, match="leaf"):
        x.add_(1)
    z = x.exp()
    z2 = z * 1
    z.add_(1)  # exp saved its output, which this modifies
    with pytest.raises(kael.AutogradError, match="modified by an in-place"):
        (z2 + z).sum().backward()


class _FakeDevice(ReferenceBackend):
    """The reference kernels serving a second device type, to mix devices."""

    name = "fake-device"
    device_type = "fakedev"


class _FakePlugin:
    @kael.hookimpl
    def kael_backends(self) -> list[kael.Backend]:
        return [_FakeDevice()]


@pytest.fixture
def fakedev() -> Iterator[str]:
    kael.backends.register(_FakePlugin(), "test-fakedev")
    try:
        yield "fakedev"
    finally:
        from kael._plugins import manager

        manager.unregister("test-fakedev")


def test_mixed_devices(fakedev: str) -> None:
    a, b = kael.ones(2), kael.ones(2, device=fakedev)
    assert b.device.type == "fakedev" and (b + b).tolist() == [2.0, 2.0]
    for call, op in [
        (lambda: a + b, "add"),
        (lambda: kael.matmul(a, b), "matmul"),
        (lambda: kael.cat([a, b]), "cat"),
        (lambda: kael.where(a > 0, a, b), "where"),
        (lambda: a.add_(b), "add"),
        (lambda: kael.linear(kael.ones(1, 2), kael.ones(3, 2, device=fakedev)), "linear"),
    ]:
        with pytest.raises(kael.DeviceError, match=op):
            call()
    with pytest.raises(kael.DeviceError, match="cpu"):
        b.numpy()
    assert b.to("cpu").device == kael.device("cpu") and b.cpu().tolist() == [1.0, 1.0]


# -- fuzzing the surface: anything goes in, only KaelError comes out -------------------------------

VALUES: list[Any] = [
    kael.ones(2, 3),
    kael.ones(3),
    kael.tensor(1.5),
    kael.zeros(0),
    kael.tensor([1, 2]),
    kael.tensor([True]),
    kael.ones(2, 3).T,
    kael.ones(2, dtype=kael.bfloat16),
    0,
    -1,
    3,
    2.5,
    True,
    None,
    "x",
    [1, 2],
    (0, 1),
    -7,
    kael.tensor([[0, 5]]),
    kael.tensor([-9]),
    float("nan"),
]
FUNCS: list[tuple[str, Callable[..., Any], int]] = [
    ("add", kael.add, 2),
    ("sub", kael.sub, 2),
    ("mul", kael.mul, 2),
    ("div", kael.div, 2),
    ("pow", kael.pow, 2),
    ("matmul", kael.matmul, 2),
    ("maximum", kael.maximum, 2),
    ("eq", kael.eq, 2),
    ("remainder", kael.remainder, 2),
    ("sum", kael.sum, 2),
    ("mean", kael.mean, 2),
    ("amax", kael.amax, 2),
    ("argmax", kael.argmax, 2),
    ("prod", kael.prod, 2),
    ("any", kael.any, 2),
    ("var", kael.var, 2),
    ("reshape", kael.reshape, 2),
    ("view", kael.view, 2),
    ("permute", kael.permute, 2),
    ("transpose", kael.transpose, 3),
    ("expand", kael.expand, 2),
    ("squeeze", kael.squeeze, 2),
    ("unsqueeze", kael.unsqueeze, 2),
    ("flatten", kael.flatten, 3),
    ("narrow", kael.narrow, 4),
    ("select", kael.select, 3),
    ("gather", kael.gather, 3),
    ("index_select", kael.index_select, 3),
    ("cat", lambda a, b: kael.cat([a, b]), 2),
    ("stack", lambda a, b: kael.stack([a, b]), 2),
    ("split", kael.split, 2),
    ("chunk", kael.chunk, 2),
    ("where", kael.where, 3),
    ("clamp", kael.clamp, 3),
    ("softmax", kael.softmax, 2),
    ("log_softmax", kael.log_softmax, 2),
    ("getitem", lambda a, k: a[k], 2),
    ("setitem", lambda a, k, v: a.clone().__setitem__(k, v), 3),
    ("add_", lambda a, b: a.clone().add_(b), 2),
    ("copy_", lambda a, b: a.clone().copy_(b), 2),
    ("fill_", lambda a, b: a.clone().fill_(b), 2),
    ("tensor", kael.tensor, 1),
    ("zeros", kael.zeros, 1),
    ("full", kael.full, 2),
    ("arange", kael.arange, 2),
    ("embedding", kael.embedding, 2),
    ("linear", kael.linear, 2),
    ("layer_norm", kael.layer_norm, 2),
    ("cross_entropy", kael.cross_entropy, 2),
    ("topk", kael.topk, 2),
    ("to", lambda a, d: a.to(d), 2),
    ("item", lambda a: a.item(), 1),
    ("nonzero", kael.nonzero, 1),
    ("gelu", kael.gelu, 1),
]


_METHODS = {"getitem", "setitem", "add_", "copy_", "fill_", "to", "item"}


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(f=st.sampled_from(FUNCS), data=st.data())
def test_only_kael_errors_escape(f: tuple[str, Callable[..., Any], int], data: st.DataObject) -> None:
    name, fn, arity = f
    args = [data.draw(st.sampled_from(VALUES)) for _ in range(arity)]
    try:
        fn(*args)
    except kael.KaelError:
        pass
    except Exception as exc:  # noqa: BLE001 - the point of the test
        if not isinstance(args[0], kael.Tensor) and name in _METHODS:
            return  # a method called on a Python value: Python's own error is right
        raise AssertionError(f"{name}{tuple(args)!r} raised a bare {type(exc).__name__}: {exc}") from exc
