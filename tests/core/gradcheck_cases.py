"""A test helper: the gradient-case machinery shared by the gradcheck test files.

A ``Case`` is a function ``fn(m, *tensors)`` written once against the API that kael and
PyTorch share (``m`` is the ``kael`` or ``torch`` module), plus a generator of float64
inputs chosen away from the op's kinks (``nrm``, ``pos``, ``away0``, ``off_int``,
``distinct``, ``ints``, combined by ``args``). ``check_case`` runs
``kael.testing.gradcheck`` on it (central differences in float64, always) and, when
PyTorch is installed, compares outputs and gradients with PyTorch's autograd on the same
inputs and the same random output weights.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import kael
import numpy as np
import pytest
from kael.testing import gradcheck

__all__ = ["F", "Arrays", "Case", "args", "away0", "check_case", "distinct", "ints", "nrm", "off_int", "pos"]

Arrays = list[Any]


@dataclass
class Case:
    name: str
    fn: Callable[..., Any]
    make: Callable[[np.random.Generator], Arrays]
    fused: bool = False  # run through the fused kernel and through the decomposition
    torch: bool = True  # compare with PyTorch (False where the two APIs differ)


def nrm(*shape: int) -> Callable[[np.random.Generator], np.ndarray]:
    return lambda r: r.standard_normal(shape)


def pos(*shape: int, lo: float = 0.5, hi: float = 2.0) -> Callable[[np.random.Generator], np.ndarray]:
    return lambda r: r.uniform(lo, hi, shape)


def away0(*shape: int) -> Callable[[np.random.Generator], np.ndarray]:
    """Magnitudes in [0.2, 2] with random signs: away from the kink at 0."""
    return lambda r: r.uniform(0.2, 2.0, shape) * r.choice([-1.0, 1.0], shape)


def off_int(*shape: int) -> Callable[[np.random.Generator], np.ndarray]:
    """Values k + [0.2, 0.4]: away from integers and from .5 (floor, ceil, round)."""
    return lambda r: r.integers(-3, 3, shape) + r.uniform(0.2, 0.4, shape)


def distinct(*shape: int) -> Callable[[np.random.Generator], np.ndarray]:
    """A random permutation of well-separated values (no ties for max/min/sort)."""
    n = int(np.prod(shape))
    return lambda r: (r.permutation(n) * 0.37 - n * 0.15).reshape(shape)


def ints(hi: int, *shape: int) -> Callable[[np.random.Generator], np.ndarray]:
    return lambda r: r.integers(0, hi, shape).astype(np.int64)


def args(*makers: Callable[[np.random.Generator], Any]) -> Callable[[np.random.Generator], Arrays]:
    return lambda r: [mk(r) for mk in makers]


def F(m: Any) -> Any:
    return m.nn.functional


def _inputs(case: Case) -> Arrays:
    return case.make(np.random.default_rng(zlib.crc32(case.name.encode())))


def _kael_args(arrays: Arrays) -> list[Any]:
    out = []
    for a in arrays:
        t = kael.tensor(a)
        if a.dtype == np.float64:
            t.requires_grad_(True)
        out.append(t)
    return out


def _outputs(r: Any) -> list[Any]:
    return list(r) if isinstance(r, (tuple, list)) else [r]


def check_case(case: Case) -> None:
    arrays = _inputs(case)
    kargs = _kael_args(arrays)
    # 1. finite differences (always)
    gradcheck(lambda *a: case.fn(kael, *a), kargs, name=case.name)
    # 2. PyTorch autograd on the same inputs (when installed)
    if not case.torch:
        return
    torch = pytest.importorskip("torch")
    targs = [torch.tensor(a, requires_grad=a.dtype == np.float64) for a in arrays]
    kargs = _kael_args(arrays)
    k_out, t_out = _outputs(case.fn(kael, *kargs)), _outputs(case.fn(torch, *targs))
    assert len(k_out) == len(t_out)
    rng = np.random.default_rng(7)
    k_loss: Any = 0.0
    t_loss: Any = 0.0
    for ko, to in zip(k_out, t_out):
        assert tuple(ko.shape) == tuple(to.shape), f"{case.name}: output shape {ko.shape} vs torch {tuple(to.shape)}"
        np.testing.assert_allclose(
            ko.detach().numpy(),
            to.detach().numpy(),
            rtol=1e-7,
            atol=1e-9,
            err_msg=f"{case.name}: forward differs from torch",
        )
        w = rng.standard_normal(tuple(ko.shape))
        k_loss = k_loss + (ko * kael.tensor(w)).sum()
        t_loss = t_loss + (to * torch.tensor(w)).sum()
    k_loss.backward()
    t_loss.backward()
    for i, (kt, tt) in enumerate(zip(kargs, targs)):
        if not tt.requires_grad:
            continue
        assert (kt.grad is None) == (tt.grad is None), f"{case.name}: input {i} grad presence differs from torch"
        if tt.grad is not None:
            np.testing.assert_allclose(
                kt.grad.numpy(),
                tt.grad.numpy(),
                rtol=1e-7,
                atol=1e-9,
                err_msg=f"{case.name}: gradient of input {i} differs from torch",
            )
