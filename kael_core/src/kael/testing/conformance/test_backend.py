"""The backend's declarations and memory: names, primitives, allocate / from_host / to_host per dtype."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import kael
from kael.backends import API_VERSION
from kael.backends import dtypes as dt
from kael.backends.catalogue import CATALOGUE, PRIMITIVES
from kael.testing import assert_close
from kael.testing.conformance import host_bits

SHAPES = [(), (0,), (5,), (3, 4), (2, 0, 3), (2, 3, 5)]


def test_declarations(kael_backend: Any) -> None:
    b = kael_backend
    assert isinstance(b, kael.Backend), f"{b!r} is not a kael.Backend"
    assert b.name and isinstance(b.name, str), "a backend needs a non-empty name"
    assert b.device_type and isinstance(b.device_type, str), "a backend needs a device_type"
    assert isinstance(b.priority, int), f"priority must be an int, got {b.priority!r}"
    assert str(b.api_version).split(".")[0] == API_VERSION.split(".")[0], (
        f"api_version {b.api_version} does not match kael's {API_VERSION}"
    )
    ok, reason = b.is_available()
    assert ok, f"backend is not available: {reason}"
    assert b.device_count() >= 1
    stats = b.memory_stats()
    assert isinstance(stats, dict) and all(isinstance(k, str) and isinstance(v, int) for k, v in stats.items()), (
        f"memory_stats() must return dict[str, int], got {stats!r}"
    )


def test_serves_its_device_type(kael_backend: Any) -> None:
    assert kael.backends.current(kael_backend.device_type) is kael_backend


def test_every_primitive_is_implemented(kael_backend: Any) -> None:
    missing = sorted(PRIMITIVES - set(kael_backend.supported_ops()))
    assert not missing, f"backend {kael_backend.name!r} lacks primitive ops {missing}"


def test_kernels_are_callable(kael_backend: Any) -> None:
    for op in sorted(set(kael_backend.supported_ops()) & set(CATALOGUE)):
        assert callable(kael_backend.kernel(op)), f"kernel({op!r}) is not callable"


@pytest.mark.parametrize("dtype", [d.name for d in dt.ALL_DTYPES])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)) or "0d")
def test_host_round_trip(dtype: str, shape: tuple[int, ...], kael_backend: Any, kael_device: Any) -> None:
    d = dt.by_name(dtype)
    rng = np.random.default_rng(0)
    values = (rng.random(shape) < 0.5) if d is dt.bool_ else rng.integers(0, 100, size=shape).astype(np.float64)
    t = kael.empty(shape, dtype=d, device=kael_device)
    assert t.device == kael_device
    if t.numel():
        kael_backend.from_host(t, host_bits(values, d))
    back = kael_backend.to_host(t)
    assert tuple(back.shape) == shape, f"to_host returned shape {back.shape}, expected {shape}"
    assert np.asarray(back).dtype == d.np, f"to_host returned {np.asarray(back).dtype}, expected {d.np}"
    assert_close(np.asarray(back), host_bits(values, d), rtol=0, atol=0, msg=f"{dtype} round trip")


def test_to_host_honours_views(kael_backend: Any, kael_device: Any) -> None:
    host = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    t = kael.tensor(host, device=kael_device)
    views = [
        (t.permute(2, 0, 1), host.transpose(2, 0, 1)),
        (t[1:, ::2, 3], host[1:, ::2, 3]),
        (t[2], host[2]),
        (t[1, 2, 3], host[1, 2, 3]),
        (t[:, :1].expand(3, 4, 5), host[:, :1].repeat(4, 1)),
    ]
    for view, want in views:
        got = kael_backend.to_host(view)
        assert_close(np.asarray(got), want, rtol=0, atol=0, msg=f"to_host of a view {view.shape} {view.stride()}")


def test_zero_byte_allocation(kael_backend: Any, kael_device: Any) -> None:
    kael_backend.allocate(0, kael_device)
    t = kael.empty((0, 3), device=kael_device)
    assert t.shape == (0, 3) and t.numel() == 0
    kael_backend.synchronize(kael_device)
