"""Random kernels: seeded reproducibility, ranges and moments, and writes confined to the output view."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import kael
from kael.backends import dtypes as dt
from kael.testing.conformance import host_values

N = 40_000
UNIFORM = [(d, "uniform", -2.0, 3.0) for d in ("float32", "float64", "float16", "bfloat16")]
NORMAL = [(d, "normal", 1.5, 2.0) for d in ("float32", "float64", "float16", "bfloat16")]
RANDINT = [(d, "randint", -3, 7) for d in ("int64", "int32", "int16", "float32")] + [("uint8", "randint", 2, 9)]
ALL = UNIFORM + NORMAL + RANDINT


def _draw(backend: Any, device: Any, op: str, dtype: str, a: Any, b: Any, seed: int, shape: Any = (N,)) -> Any:
    out = kael.empty(shape, dtype=dt.by_name(dtype), device=device)
    gen = kael.Generator(device).manual_seed(seed)
    backend.kernel(op)(out, a, b, gen)
    return out


@pytest.mark.parametrize(("dtype", "op", "a", "b"), ALL, ids=lambda v: str(v))
def test_reproducible_per_seed(dtype: str, op: str, a: Any, b: Any, kael_backend: Any, kael_device: Any) -> None:
    x = host_values(_draw(kael_backend, kael_device, op, dtype, a, b, 1234, (500,)))
    y = host_values(_draw(kael_backend, kael_device, op, dtype, a, b, 1234, (500,)))
    z = host_values(_draw(kael_backend, kael_device, op, dtype, a, b, 4321, (500,)))
    assert np.array_equal(x, y), f"{op} {dtype}: the same seed gave different values"
    assert not np.array_equal(x, z), f"{op} {dtype}: different seeds gave the same values"


@pytest.mark.parametrize(("dtype", "op", "a", "b"), ALL, ids=lambda v: str(v))
def test_distribution(dtype: str, op: str, a: Any, b: Any, kael_backend: Any, kael_device: Any) -> None:
    v = host_values(_draw(kael_backend, kael_device, op, dtype, a, b, 7)).astype(np.float64)
    low_precision = dtype in ("float16", "bfloat16")
    if op == "uniform":
        assert v.min() >= a and (v.max() <= b if low_precision else v.max() < b), (
            f"uniform {dtype}: values outside [{a}, {b}): min {v.min()}, max {v.max()}"
        )
        mean, std = (a + b) / 2, (b - a) / np.sqrt(12)
    elif op == "normal":
        mean, std = a, b
    else:
        assert np.all(v == np.round(v)), f"randint {dtype}: non-integer values"
        assert v.min() >= a and v.max() < b, f"randint {dtype}: values outside [{a}, {b}): {v.min()}..{v.max()}"
        assert set(np.unique(v)) == set(range(a, b)), f"randint {dtype}: not every value in [{a}, {b}) drawn"
        mean, std = (a + b - 1) / 2, np.sqrt(((b - a) ** 2 - 1) / 12)
    tol = 6 * std / np.sqrt(N) + (0.02 * std if low_precision else 0)
    assert abs(v.mean() - mean) < tol, f"{op} {dtype}: mean {v.mean():.4f}, expected {mean:.4f} +- {tol:.4f}"
    assert abs(v.std() - std) < 0.03 * std, f"{op} {dtype}: std {v.std():.4f}, expected {std:.4f}"


@pytest.mark.parametrize("op", ["uniform", "normal", "randint"])
def test_writes_only_its_view(op: str, kael_backend: Any, kael_device: Any) -> None:
    a, b = (0, 5) if op == "randint" else (0.0, 1.0)
    buf = kael.tensor(np.full((4, 9), 77.0, np.float32), device=kael_device)
    view = buf[:, 1::2]
    kael_backend.kernel(op)(view, a, b, kael.Generator(kael_device).manual_seed(3))
    h = host_values(buf)
    assert np.all(h[:, ::2] == 77.0), f"{op}: the kernel wrote outside its strided output view"
    assert not np.any(h[:, 1::2] == 77.0)
    for shape in ((), (0,), (2, 0)):
        out = kael.empty(shape, device=kael_device)
        kael_backend.kernel(op)(out, a, b, kael.Generator(kael_device).manual_seed(3))
        assert host_values(out).shape == shape
