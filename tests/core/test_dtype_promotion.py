"""Type promotion: PyTorch's rules for tensor/tensor, 0-d tensors and Python scalars, checked against torch."""

from __future__ import annotations

import itertools
from typing import Any

import kael
import numpy as np
import pytest
from kael import _dtype as dt

NAMES = [d.name for d in dt.ALL_DTYPES]
NUMERIC = [n for n in NAMES if n != "bool"]
SCALARS: list[Any] = [True, 2, 2.5]


def _kt(name: str, shape: tuple[int, ...] = (2,)) -> kael.Tensor:
    return kael.ones(shape, dtype=dt.BY_NAME[name])


def _tt(torch: Any, name: str, shape: tuple[int, ...] = (2,)) -> Any:
    return torch.ones(shape, dtype=getattr(torch, name))


# -- fixed expectations (hold without torch) --------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b", "want"),
    [
        ("uint8", "int8", "int16"),
        ("uint8", "int16", "int16"),
        ("uint8", "int64", "int64"),
        ("int8", "int32", "int32"),
        ("float16", "bfloat16", "float32"),
        ("bool", "uint8", "uint8"),
        ("bool", "float16", "float16"),
        ("int64", "float16", "float16"),
        ("int32", "bfloat16", "bfloat16"),
        ("float32", "float64", "float64"),
        ("int64", "int64", "int64"),
    ],
)
def test_promote_types_table(a: str, b: str, want: str) -> None:
    assert kael.promote_types(dt.BY_NAME[a], dt.BY_NAME[b]) is dt.BY_NAME[want]
    assert kael.promote_types(dt.BY_NAME[b], dt.BY_NAME[a]) is dt.BY_NAME[want]


def test_python_scalars_do_not_widen() -> None:
    f32 = kael.ones(3)
    assert (f32 * 2.0).dtype is kael.float32
    assert (2.0 * f32).dtype is kael.float32
    assert (f32 + 1).dtype is kael.float32
    i32 = kael.ones(3, dtype=kael.int32)
    assert (i32 + 2.5).dtype is kael.float32  # int tensor + float scalar -> default float
    assert (i32 + 2).dtype is kael.int32
    assert (i32 * True).dtype is kael.int32
    b = kael.ones(3, dtype=kael.bool)
    assert (b + 1).dtype is kael.int64 and (b + 1.5).dtype is kael.float32
    h = kael.ones(3, dtype=kael.float16)
    assert (h * 1e3).dtype is kael.float16
    u8 = kael.ones(3, dtype=kael.uint8)
    assert (u8 + 300).dtype is kael.uint8  # like torch: the scalar's category is not higher


def test_zero_dim_tensors_are_a_middle_tier() -> None:
    f16 = kael.ones(3, dtype=kael.float16)
    assert (f16 + kael.tensor(1.0, dtype=kael.float64)).dtype is kael.float16  # same category: dims win
    i16 = kael.ones(3, dtype=kael.int16)
    assert (i16 + kael.tensor(1, dtype=kael.int64)).dtype is kael.int16
    assert (i16 + kael.tensor(1.0, dtype=kael.float64)).dtype is kael.float64  # higher category: its own dtype
    assert (kael.tensor(1, dtype=kael.int8) + kael.tensor(1, dtype=kael.int32)).dtype is kael.int32
    assert (kael.tensor(1, dtype=kael.int32) + 2.5).dtype is kael.float32
    assert (kael.tensor(1.0, dtype=kael.float64) * 2.0).dtype is kael.float64


def test_default_dtype_drives_float_scalars() -> None:
    i = kael.ones(2, dtype=kael.int64)
    kael.set_default_dtype(kael.float64)
    try:
        assert (i * 0.5).dtype is kael.float64
        assert kael.tensor([1.5]).dtype is kael.float64
    finally:
        kael.set_default_dtype(kael.float32)
    assert (i * 0.5).dtype is kael.float32


def test_division_and_comparisons() -> None:
    i = kael.tensor([1, 2, 3])
    assert (i / 2).dtype is kael.float32 and (i / 2).tolist() == [0.5, 1.0, 1.5]
    assert (i // 2).dtype is kael.int64 and (i // 2).tolist() == [0, 1, 1]
    assert (i < 2.5).dtype is kael.bool and (i < 2.5).tolist() == [True, True, False]
    assert (kael.ones(2, dtype=kael.bfloat16) == 1).dtype is kael.bool


# -- against torch: every dtype pair and scalar kind ------------------------------------------


@pytest.mark.parametrize(("a", "b"), list(itertools.product(NAMES, NAMES)))
def test_tensor_pairs_match_torch(torch: Any, a: str, b: str) -> None:
    want = (_tt(torch, a) + _tt(torch, b)).dtype if not (a == b == "bool") else torch.bool
    got = kael.result_type(_kt(a), _kt(b))
    assert got.name == str(want).removeprefix("torch."), f"{a} + {b}"
    # 0-d against dimensioned, both ways round
    assert kael.result_type(_kt(a), _kt(b, ())).name == str(
        torch.result_type(_tt(torch, a), _tt(torch, b, ()))
    ).removeprefix("torch.")
    assert kael.result_type(_kt(a, ()), _kt(b)).name == str(
        torch.result_type(_tt(torch, a, ()), _tt(torch, b))
    ).removeprefix("torch.")


@pytest.mark.parametrize("a", NAMES)
@pytest.mark.parametrize("s", SCALARS, ids=lambda v: type(v).__name__)
@pytest.mark.parametrize("zero_dim", [False, True])
def test_scalars_match_torch(torch: Any, a: str, s: Any, zero_dim: bool) -> None:
    shape = () if zero_dim else (2,)
    want = str(torch.result_type(_tt(torch, a, shape), s)).removeprefix("torch.")
    assert kael.result_type(_kt(a, shape), s).name == want
    assert kael.result_type(s, _kt(a, shape)).name == want


@pytest.mark.parametrize(("a", "b"), list(itertools.product(NUMERIC, NUMERIC)))
def test_binary_ops_produce_promoted_values(torch: Any, a: str, b: str) -> None:
    x = np.array([1, 2, 3])
    y = np.array([3, 1, 2])
    kx, ky = kael.tensor(x, dtype=dt.BY_NAME[a]), kael.tensor(y, dtype=dt.BY_NAME[b])
    tx, ty = torch.tensor(x, dtype=getattr(torch, a)), torch.tensor(y, dtype=getattr(torch, b))
    for kop, top in (
        (kael.add, torch.add),
        (kael.mul, torch.mul),
        (kael.maximum, torch.maximum),
        (kael.div, torch.div),
    ):
        r, w = kop(kx, ky), top(tx, ty)
        assert r.dtype.name == str(w.dtype).removeprefix("torch."), f"{kop.__name__}({a}, {b})"
        np.testing.assert_allclose(np.asarray(r, dtype=np.float64), w.double().numpy(), rtol=1e-2)
