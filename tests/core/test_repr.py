"""repr like PyTorch's: the same text for the same values (dtype names say kael. instead of torch.)."""

from __future__ import annotations

from typing import Any

import kael
import numpy as np
import pytest

CASES: dict[str, tuple[Any, str]] = {
    "floats_2d": ([[1.5, -2.25], [3.0, 40.125]], "float32"),
    "ints_as_floats": ([[1.0, 2.0], [3.0, -4.0]], "float32"),
    "ints": ([[1, -20], [300, 4]], "int64"),
    "bools": ([True, False, True], "bool"),
    "scalar_float": (3.5, "float32"),
    "scalar_int": (7, "int64"),
    "scalar_bool": (False, "bool"),
    "empty": ([], "float32"),
    "empty_int": ([], "int64"),
    "empty_2d": (np.zeros((2, 0)), "float32"),
    "float16": ([0.5, 1.25, -3.0], "float16"),
    "bfloat16": ([0.5, 1.25, -3.0], "bfloat16"),
    "float64": ([1.0 / 3, 2.0], "float64"),
    "int8": ([1, -2], "int8"),
    "uint8": ([1, 200], "uint8"),
    "sci_small": ([1e-5, 1.0], "float32"),
    "sci_large": ([1e9, 1.0], "float32"),
    "sci_int_ratio": ([1.0, 5000.0], "float32"),
    "nonfinite": ([float("inf"), float("-inf"), float("nan"), 1.5], "float32"),
    "nonfinite_ints": ([float("inf"), 2.0, float("nan")], "float32"),
    "all_zero": ([0.0, -0.0], "float32"),
    "long_line": (np.linspace(-1, 1, 30), "float32"),
    "summarized": (np.arange(2000, dtype=np.float64).reshape(40, 50) / 7, "float32"),
    "summarized_1d": (np.arange(1500), "int64"),
    "3d": (np.arange(24).reshape(2, 3, 4) - 12, "int64"),
    "3d_floats": (np.arange(12).reshape(2, 3, 2) / 4, "float32"),
}


def _kael(values: Any, dtype: str, **kw: Any) -> kael.Tensor:
    return kael.tensor(
        np.asarray(values) if not isinstance(values, np.ndarray) else values,
        dtype=getattr(kael, dtype if dtype != "bool" else "bool"),
        **kw,
    )


@pytest.mark.parametrize("name", sorted(CASES))
def test_repr_matches_torch(name: str, torch: Any) -> None:
    values, dtype = CASES[name]
    k = _kael(values, dtype)
    t = torch.tensor(
        np.asarray(values, dtype=np.float64 if dtype in ("float16", "bfloat16") else None), dtype=getattr(torch, dtype)
    )
    assert repr(k) == repr(t).replace("torch.", "kael.")


def test_requires_grad_and_grad_fn(torch: Any) -> None:
    k = kael.tensor([1.0, 2.0], requires_grad=True)
    t = torch.tensor([1.0, 2.0], requires_grad=True)
    assert repr(k) == repr(t)
    assert repr(k * 2) == "tensor([2., 4.], grad_fn=<MulBackward>)"
    assert repr(t * 2) == "tensor([2., 4.], grad_fn=<MulBackward0>)"  # torch numbers its nodes; kael does not


def test_fixed_strings() -> None:
    """The format without the torch oracle."""
    assert repr(kael.tensor([[1.0, 2.0], [3.0, 4.0]])) == "tensor([[1., 2.],\n        [3., 4.]])"
    assert repr(kael.tensor([0.1, -2.5])) == "tensor([ 0.1000, -2.5000])"
    assert repr(kael.tensor([1, 2])) == "tensor([1, 2])"
    assert repr(kael.tensor([1, 2], dtype=kael.int32)) == "tensor([1, 2], dtype=kael.int32)"
    assert repr(kael.tensor(True)) == "tensor(True)"
    assert repr(kael.zeros(2, 0, dtype=kael.int64)) == "tensor([], size=(2, 0), dtype=kael.int64)"
    assert repr(kael.tensor([1e-5, 1.0])) == "tensor([1.0000e-05, 1.0000e+00])"
    assert repr(kael.ones(1, requires_grad=True)) == "tensor([1.], requires_grad=True)"
    assert repr(kael.tensor([2.5], dtype=kael.bfloat16)) == "tensor([2.5000], dtype=kael.bfloat16)"


def test_repr_of_views_and_default_dtype() -> None:
    t = kael.arange(6.0).reshape(2, 3).T
    assert repr(t) == "tensor([[0., 3.],\n        [1., 4.],\n        [2., 5.]])"
    kael.set_default_dtype(kael.float64)
    try:
        assert repr(kael.tensor([1.5])) == "tensor([1.5000])"
        assert repr(kael.tensor([1.5], dtype=kael.float32)) == "tensor([1.5000], dtype=kael.float32)"
    finally:
        kael.set_default_dtype(kael.float32)
