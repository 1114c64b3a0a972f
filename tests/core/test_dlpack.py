"""DLPack: zero-copy exchange with NumPy both ways, and with PyTorch both ways when it is installed."""

from __future__ import annotations

from typing import Any

import kael
import numpy as np
import pytest
from kael import _dtype as dt

NP_DTYPES = [d.name for d in dt.ALL_DTYPES if d is not kael.bfloat16]


def _ptr(a: np.ndarray) -> int:
    return int(a.__array_interface__["data"][0])


@pytest.mark.parametrize("name", NP_DTYPES)
def test_numpy_to_kael_shares_memory(name: str) -> None:
    a = (np.arange(12) % 3).astype(dt.BY_NAME[name].np).reshape(3, 4)
    t = kael.from_dlpack(a)
    assert t.dtype is dt.BY_NAME[name] and t.shape == (3, 4) and t.data_ptr() == _ptr(a)
    assert t.tolist() == a.tolist()


def test_numpy_views_keep_their_strides() -> None:
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    v = base[1:, ::2].T
    t = kael.from_dlpack(v)
    assert t.shape == v.shape and t.stride() == tuple(s // 4 for s in v.strides) and t.data_ptr() == _ptr(v)
    base[2, 2] = -1
    assert t.tolist() == v.tolist()
    t.mul_(2)  # writes land in NumPy's memory
    assert np.array_equal(v, np.asarray(t))
    for a in (np.full((), 2.5, np.float32), np.zeros((0, 3), np.int64)):
        u = kael.from_dlpack(a)
        assert u.shape == a.shape and u.tolist() == a.tolist()


@pytest.mark.parametrize("name", NP_DTYPES)
def test_kael_to_numpy_shares_memory(name: str) -> None:
    t = kael.arange(12).reshape(3, 4).to(dt.BY_NAME[name])
    try:
        a = np.from_dlpack(t)
    except BufferError as exc:  # NumPy versions without bool DLPack
        pytest.skip(str(exc))
    assert _ptr(a) == t.data_ptr() and a.tolist() == t.tolist()
    v = t[:, 1::2].T
    b = np.from_dlpack(v)
    assert b.shape == v.shape and _ptr(b) == v.data_ptr() and b.tolist() == v.tolist()


def test_kael_round_trip_and_device() -> None:
    t = kael.arange(6.0).reshape(2, 3)
    assert t.__dlpack_device__() == (1, 0)
    u = kael.from_dlpack(t)
    assert u.data_ptr() == t.data_ptr() and u.tolist() == t.tolist()
    with pytest.raises(kael.AutogradError):
        np.from_dlpack(kael.ones(2, requires_grad=True))
    with pytest.raises(kael.DTypeError):
        np.from_dlpack(kael.ones(2, dtype=kael.bfloat16))
    with pytest.raises(kael.DTypeError):
        kael.from_dlpack(object())


@pytest.mark.parametrize("name", ["float32", "float64", "float16", "int64", "int32", "int16", "int8", "uint8", "bool"])
def test_torch_both_ways(name: str, torch: Any) -> None:
    src = torch.arange(12).reshape(3, 4).to(getattr(torch, name))
    t = kael.from_dlpack(src)
    assert t.dtype is dt.BY_NAME[name] and t.data_ptr() == src.data_ptr() and t.tolist() == src.tolist()
    back = torch.from_dlpack(kael.arange(12).reshape(3, 4).to(dt.BY_NAME[name])[:, ::2])
    assert back.dtype == getattr(torch, name) and back.tolist() == src[:, ::2].tolist()
    k = kael.zeros(2, 3, dtype=dt.BY_NAME[name])
    tk = torch.from_dlpack(k)
    assert tk.data_ptr() == k.data_ptr()


def test_torch_writes_are_visible(torch: Any) -> None:
    x = torch.zeros(2, 3)
    t = kael.from_dlpack(x.T)
    x[1, 2] = 5.0
    assert t[2, 1].item() == 5.0
    t.add_(1)
    assert x.tolist() == [[1.0, 1.0, 1.0], [1.0, 1.0, 6.0]]
