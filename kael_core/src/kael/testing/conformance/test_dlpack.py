"""DLPack: zero-copy exchange with NumPy (CPU backends) and with kael itself (any device)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import kael
from kael.backends import dtypes as dt

DTYPES = [d.name for d in dt.ALL_DTYPES if d is not dt.bfloat16]


def _cpu_only(kael_backend: Any) -> None:
    if kael_backend.device_type != "cpu":
        pytest.skip("NumPy DLPack exchange needs a CPU backend")


@pytest.mark.parametrize("dtype", DTYPES)
def test_to_numpy_zero_copy(dtype: str, kael_backend: Any, kael_device: Any) -> None:
    _cpu_only(kael_backend)
    t = kael.arange(12, device=kael_device).reshape(3, 4).to(dt.by_name(dtype))
    try:
        a = np.from_dlpack(t)
    except (BufferError, TypeError) as exc:  # NumPy versions without bool DLPack support
        pytest.skip(f"NumPy cannot import {dtype} through DLPack: {exc}")
    np.testing.assert_array_equal(a, np.arange(12).reshape(3, 4).astype(dt.by_name(dtype).np))
    assert a.__array_interface__["data"][0] == t.data_ptr(), "np.from_dlpack copied the tensor"
    v = t.T[1:]
    av = np.from_dlpack(v)
    np.testing.assert_array_equal(av, np.arange(12).reshape(3, 4).astype(dt.by_name(dtype).np).T[1:])
    assert av.__array_interface__["data"][0] == v.data_ptr()


def test_from_numpy_zero_copy(kael_backend: Any) -> None:
    _cpu_only(kael_backend)
    a = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2]
    t = kael.from_dlpack(a)
    assert t.shape == (3, 2) and t.stride() == (4, 2)
    a[1, 1] = 42.0
    assert t[1, 1].item() == 42.0, "kael.from_dlpack copied the array"
    t.add_(1)  # runs the backend's add kernel on NumPy-owned memory
    want = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2] + 1
    want[1, 1] = 43.0
    np.testing.assert_array_equal(a, want)


def test_self_round_trip(kael_backend: Any, kael_device: Any) -> None:
    t = kael.arange(6, dtype=kael.float32, device=kael_device).reshape(2, 3)
    if kael_backend.device_type != "cpu" and not hasattr(kael_backend, "from_dlpack"):
        pytest.skip(f"backend {kael_backend.name!r} has no DLPack support")
    u = kael.from_dlpack(t)
    assert u.device == t.device and u.shape == t.shape and u.dtype is t.dtype
    assert u.data_ptr() == t.data_ptr(), "kael.from_dlpack(kael tensor) copied"
    assert u.tolist() == t.tolist()
