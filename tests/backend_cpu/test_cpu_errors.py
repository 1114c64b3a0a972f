"""C++ errors arrive as kael exceptions naming the op, the values and the expectation."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip("kael_backend_cpu")

import kael  # noqa: E402
from cpu_helpers import cpu_empty, place  # noqa: E402
from kael import _dtype as dt  # noqa: E402
from kael._tensor import Tensor  # noqa: E402


def test_integer_division_by_zero(cpu: Any) -> None:
    a = place(np.array([1, 2, 3]), dt.int32, "contiguous")
    b = place(np.array([1, 0, 3]), dt.int32, "contiguous")
    out = cpu_empty(cpu, (3,), dt.int32)
    for op in ("remainder", "floor_divide"):
        with pytest.raises(ZeroDivisionError, match=f"{op}: integer division by zero") as info:
            cpu.kernel(op)(out, a, b)
        assert isinstance(info.value, kael.KaelError)


def test_negative_integer_power(cpu: Any) -> None:
    a = place(np.array([2, 2]), dt.int64, "contiguous")
    b = place(np.array([1, -1]), dt.int64, "contiguous")
    with pytest.raises(kael.DTypeError, match="negative integer powers"):
        cpu.kernel("pow")(cpu_empty(cpu, (2,), dt.int64), a, b)


def test_shape_mismatch_names_the_op(cpu: Any) -> None:
    a = place(np.zeros((2, 3)), dt.float32, "contiguous")
    with pytest.raises(kael.ShapeError, match="matmul"):
        cpu.kernel("matmul")(cpu_empty(cpu, (2, 2), dt.float32), a, a)


def test_views_outside_their_storage_are_refused(cpu: Any) -> None:
    t = cpu_empty(cpu, (4,), dt.float32)
    bad = Tensor._make(t._storage, (8,), (1,), 0, dt.float32)
    with pytest.raises(kael.ShapeError, match="outside its storage"):
        cpu.kernel("fill")(bad, 1.0)


def test_read_only_outputs_are_refused(cpu: Any) -> None:
    arr = np.zeros(3, np.float32)
    arr.flags.writeable = False
    t = kael.from_numpy(arr)
    with pytest.raises(kael.KaelError, match="read-only"):
        cpu.kernel("fill")(t, 1.0)


def test_bad_fill_value(cpu: Any) -> None:
    with pytest.raises(kael.DTypeError, match="fill"):
        cpu.kernel("fill")(cpu_empty(cpu, (2,), dt.float32), "x")
