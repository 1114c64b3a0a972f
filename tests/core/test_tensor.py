"""The Tensor itself: creation, metadata, conversions, in-place ops and the version counter, item/tolist."""

from __future__ import annotations

import math
from typing import Any

import kael
import numpy as np
import pytest
from kael import _dtype as dt
from kael.testing import assert_close

ALL = [d.name for d in dt.ALL_DTYPES]


# -- creation --------------------------------------------------------------------------------


def test_tensor_infers_dtypes_like_torch() -> None:
    assert kael.tensor([1, 2]).dtype is kael.int64
    assert kael.tensor([1.0, 2]).dtype is kael.float32
    assert kael.tensor(True).dtype is kael.bool
    assert kael.tensor(np.array([1, 2], np.int16)).dtype is kael.int16
    assert kael.tensor(np.array([1.0], np.float64)).dtype is kael.float64  # arrays keep their dtype
    assert kael.tensor([[1, 2], [3, 4]], dtype=kael.float16).dtype is kael.float16
    assert kael.tensor([]).shape == (0,) and kael.tensor([]).dtype is kael.float32
    assert kael.tensor(5).shape == () and kael.tensor(5).item() == 5


@pytest.mark.parametrize("name", ALL)
def test_tensor_round_trips_every_dtype(name: str) -> None:
    d = dt.BY_NAME[name]
    values = [[0, 1, 2], [3, 1, 0]]
    t = kael.tensor(values, dtype=d)
    assert t.dtype is d and t.shape == (2, 3) and t.is_contiguous()
    want = np.array(values).astype(bool).tolist() if d is kael.bool else values
    assert t.tolist() == want
    assert kael.tensor(3, dtype=d).shape == ()  # 0-d stays 0-d in every dtype (bfloat16 too)


def test_tensor_copies_its_data() -> None:
    a = np.arange(3.0)
    t = kael.tensor(a)
    a[0] = 99
    assert t.tolist() == [0.0, 1.0, 2.0]
    s = kael.tensor(t)
    assert s.data_ptr() != t.data_ptr() and s.tolist() == t.tolist()


def test_from_numpy_shares_memory_and_strides() -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = kael.from_numpy(a)
    assert t.data_ptr() == a.__array_interface__["data"][0]
    a[0, 0] = 5
    assert t[0, 0].item() == 5
    v = kael.from_numpy(a[:, ::2])
    assert v.shape == (3, 2) and v.stride() == (4, 2)
    assert v.tolist() == a[:, ::2].tolist()
    r = kael.from_numpy(a[::-1])  # negative strides: copied
    assert r.tolist() == a[::-1].tolist()


def test_factories() -> None:
    assert kael.zeros(2, 3).tolist() == [[0.0] * 3] * 2
    assert kael.ones((2,), dtype=kael.int8).tolist() == [1, 1]
    assert kael.full((2, 2), 7).dtype is kael.int64 and kael.full((2, 2), 7.5).dtype is kael.float32
    assert kael.full((2,), True).dtype is kael.bool
    assert kael.empty(0, 3).shape == (0, 3)
    assert kael.arange(5).tolist() == [0, 1, 2, 3, 4] and kael.arange(5).dtype is kael.int64
    assert kael.arange(1, 2, 0.25).tolist() == [1.0, 1.25, 1.5, 1.75]
    assert kael.arange(5, 0, -2).tolist() == [5, 3, 1]
    assert_close(kael.linspace(0, 1, 5), np.linspace(0, 1, 5).astype(np.float32))
    assert kael.linspace(0, 1, 0).shape == (0,)
    assert kael.eye(2, 3).tolist() == [[1, 0, 0], [0, 1, 0]]
    x = kael.ones(2, 3, dtype=kael.float64)
    assert kael.zeros_like(x).dtype is kael.float64 and kael.zeros_like(x).tolist() == [[0.0] * 3] * 2
    assert kael.full_like(x, 2).tolist() == [[2.0] * 3] * 2
    assert kael.ones_like(x, dtype=kael.int32).dtype is kael.int32
    assert kael.empty_like(x).shape == (2, 3)


def test_requires_grad_rules() -> None:
    x = kael.ones(2, requires_grad=True)
    assert x.requires_grad and x.is_leaf and x.grad is None
    with pytest.raises(kael.DTypeError):
        kael.ones(2, dtype=kael.int64).requires_grad_()
    y = x * 2
    assert y.requires_grad and not y.is_leaf and y.grad_fn is not None
    assert not y.detach().requires_grad
    with kael.no_grad():
        assert not (x * 2).requires_grad


# -- metadata ------------------------------------------------------------------------------------


def test_metadata() -> None:
    t = kael.zeros(2, 3, 4, dtype=kael.float16)
    assert t.shape == (2, 3, 4) and t.size() == (2, 3, 4) and t.size(-1) == 4
    assert t.stride() == (12, 4, 1) and t.stride(0) == 12
    assert t.ndim == 3 and t.dim() == 3 and t.numel() == 24 and len(t) == 2
    assert t.element_size() == 2 and t.nbytes == 48
    assert t.is_floating_point() and not kael.zeros(1, dtype=kael.int8).is_floating_point()
    assert t.device == kael.device("cpu") and t.device == "cpu" and not t.is_cuda
    assert t.storage_offset() == 0 and t[1].storage_offset() == 12
    with pytest.raises(kael.IndexError_):
        t.size(3)


def test_devices() -> None:
    assert kael.device("cpu") is kael.device("cpu:0")
    d = kael.device("cuda:1")
    assert d.type == "cuda" and d.index == 1 and str(d) == "cuda:1" and repr(d) == "device(type='cuda', index=1)"
    assert kael.device("cuda", 1) is d
    for bad in ("", "cuda:x", "cuda:-1", ":0", 3):
        with pytest.raises(kael.DeviceError):
            kael.device(bad)  # type: ignore[arg-type]


# -- conversions ---------------------------------------------------------------------------------


@pytest.mark.parametrize("src", ALL)
@pytest.mark.parametrize("dst", ALL)
def test_to_dtype_matches_numpy_casts(src: str, dst: str) -> None:
    values = np.array([0, 1, 2.5, 3, 0.25, 7]) if dt.BY_NAME[src].is_floating_point else np.array([0, 1, 2, 3, 0, 7])
    t = kael.tensor(values, dtype=dt.BY_NAME[src])
    r = t.to(dt.BY_NAME[dst])
    assert r.dtype is dt.BY_NAME[dst]
    host_src = values.astype(np.float32 if src == "bfloat16" else dt.BY_NAME[src].np)
    want = host_src.astype(np.float32 if dst == "bfloat16" else dt.BY_NAME[dst].np)
    assert_close(r, want, rtol=0, atol=0, msg=f"{src} -> {dst}")
    assert t.to(dt.BY_NAME[src]) is t  # no-op casts return the tensor itself


def test_casting_methods_and_copy_flag() -> None:
    t = kael.tensor([1.7, -2.2])
    assert t.long().tolist() == [1, -2] and t.int().dtype is kael.int32 and t.double().dtype is kael.float64
    assert t.half().dtype is kael.float16 and t.bfloat16().dtype is kael.bfloat16 and t.bool().tolist() == [True] * 2
    assert t.to("cpu") is t
    c = t.to(kael.float32, copy=True)
    assert c is not t and c.data_ptr() != t.data_ptr()
    assert t.type_as(kael.zeros(1, dtype=kael.float64)).dtype is kael.float64


def test_bfloat16_rounds_to_nearest_even() -> None:
    x = kael.tensor([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 3.0e38], dtype=kael.float32)
    assert x.to(kael.bfloat16).tolist() == [1.0, 1 + 2**-6, -1.0, 3.00405527047391e38]  # as torch
    assert math.isnan(kael.tensor([float("nan")], dtype=kael.bfloat16).item())


def test_item_tolist_numpy_array() -> None:
    t = kael.tensor([[1.5, 2.0]])
    assert t[0, 1].item() == 2.0 and isinstance(kael.tensor(3).item(), int)
    assert isinstance(kael.tensor(True).item(), bool)
    assert t.tolist() == [[1.5, 2.0]] and kael.tensor(2.5).tolist() == 2.5
    a = t.numpy()
    assert a.dtype == np.float32 and np.shares_memory(a, t.numpy())
    a[0, 0] = 9
    assert t[0, 0].item() == 9  # numpy() shares memory
    assert np.asarray(t).tolist() == [[9.0, 2.0]]
    assert np.asarray(kael.tensor([1.5], dtype=kael.bfloat16)).dtype == np.float32
    with pytest.raises(kael.ShapeError):
        t.item()
    with pytest.raises(kael.AutogradError):
        kael.ones(1, requires_grad=True).numpy()
    with pytest.raises(kael.DTypeError):
        kael.ones(1, dtype=kael.bfloat16).numpy()
    assert float(kael.tensor([2.5])) == 2.5 and int(kael.tensor(3)) == 3 and bool(kael.tensor([1]))
    assert [1, 2, 3][kael.tensor(1)] == 2  # __index__


def test_truth_value_and_iteration() -> None:
    with pytest.raises(kael.ShapeError):
        bool(kael.ones(2))
    with pytest.raises(kael.ShapeError):
        iter(kael.tensor(1.0))
    assert [r.tolist() for r in kael.tensor([[1, 2], [3, 4]])] == [[1, 2], [3, 4]]


# -- in place and the version counter ---------------------------------------------------------------


def test_inplace_ops_bump_the_version() -> None:
    t = kael.zeros(3)
    v = t._version()
    for op in (
        lambda: t.add_(1),
        lambda: t.mul_(2),
        lambda: t.sub_(kael.ones(3)),
        lambda: t.div_(2),
        lambda: t.fill_(4),
        lambda: t.zero_(),
        lambda: t.copy_(kael.arange(3)),
        lambda: t.exp_(),
        lambda: t.clamp_(0, 1),
        lambda: t.__setitem__(0, 5.0),
        lambda: t.__setitem__(kael.tensor([1]), 2.0),
    ):
        op()
        assert t._version() > v, "in-place op did not bump the version counter"
        v = t._version()
    assert t.tolist() == [5.0, 2.0, 1.0]
    view = t[1:]
    view.add_(1)
    assert t._version() == view._version() == v + 1  # views share the counter with their base


def test_inplace_results_and_promotion_rules() -> None:
    t = kael.tensor([1, 2, 3])
    t += 2
    assert t.tolist() == [3, 4, 5] and t.dtype is kael.int64
    t.mul_(kael.tensor([2, 2, 2], dtype=kael.int8))
    assert t.tolist() == [6, 8, 10] and t.dtype is kael.int64
    with pytest.raises(kael.DTypeError):
        t.add_(0.5)  # float result cannot be stored in an int tensor (like torch)
    f = kael.ones(2, 3)
    f.add_(kael.tensor([1.0, 2.0, 3.0]))
    assert f.tolist() == [[2.0, 3.0, 4.0]] * 2
    with pytest.raises(kael.ShapeError):
        kael.ones(3).add_(kael.ones(2, 3))  # the result would not fit in place
    f.add_(kael.ones(3), alpha=2)
    assert f.tolist() == [[4.0, 5.0, 6.0]] * 2


def test_copy_casts_and_broadcasts() -> None:
    t = kael.zeros(2, 3, dtype=kael.int32)
    t.copy_(kael.tensor([1.9, 2.5, -3.7]))
    assert t.tolist() == [[1, 2, -3]] * 2
    with pytest.raises(kael.ShapeError):
        t.copy_(kael.ones(3, 2))


def test_clone_contiguous_detach() -> None:
    t = kael.arange(6.0).reshape(2, 3).T
    c = t.contiguous()
    assert c.is_contiguous() and c.tolist() == t.tolist() and c.data_ptr() != t.data_ptr()
    a = kael.arange(4.0)
    assert a.contiguous() is a
    k = a.clone()
    k.add_(1)
    assert a.tolist() == [0.0, 1.0, 2.0, 3.0]
    d = a.detach()
    assert d.data_ptr() == a.data_ptr()


@pytest.mark.parametrize("shape", [(), (0,), (3,), (2, 3)])
def test_elementwise_matches_numpy(shape: Any, rng: np.random.Generator) -> None:
    a = rng.standard_normal(shape).astype(np.float32)
    b = rng.uniform(0.5, 2.0, shape).astype(np.float32)
    ka, kb = kael.tensor(a), kael.tensor(b)
    assert_close(ka + kb, a + b)
    assert_close(ka - kb, a - b)
    assert_close(ka * kb, a * b)
    assert_close(ka / kb, a / b)
    assert_close(kb**ka, b**a, rtol=1e-5)
    assert_close(-ka, -a)
    assert_close(abs(ka), np.abs(a))
    assert_close(ka % kb, np.mod(a, b), rtol=1e-5, atol=1e-6)
    assert_close(ka // kb, np.floor_divide(a, b))
    assert_close(kael.exp(ka), np.exp(a), rtol=1e-6)
    assert_close(kael.sqrt(kb), np.sqrt(b))
    assert_close(kael.sigmoid(ka), 1 / (1 + np.exp(-a)), rtol=1e-6)
    assert_close(kael.relu(ka), np.maximum(a, 0))
    assert_close(ka > kb, a > b)
    assert_close((ka > 0) & (kb > 1), (a > 0) & (b > 1))
    assert_close((ka > 0) | (kb > 1), (a > 0) | (b > 1))
    assert_close(~(ka > 0), ~(a > 0))
    assert_close(1 - ka, 1 - a)
    assert_close(2 / kb, 2 / b)
    assert_close(2.0**ka, 2.0**a, rtol=1e-6)
