"""The case model of the conformance table: a Case names (op, dtype, sample) and builds a Call.

A ``Call`` lists the kernel's positional arguments exactly as ``kael.backends.catalogue`` documents
them: ``Operand`` (input tensor), ``Out`` (preallocated output), ``Alias`` (the
tensor of another argument again, e.g. in-place ``add(t, t, b)``), lists of
operands (``cat``), and plain Python values (dims, scalars, flags).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kael.backends import dtypes as dt

from ._layout import Alias, Operand, Out

__all__ = [
    "Case",
    "Call",
    "vals",
    "operand",
    "fixed",
    "DTYPES",
    "FLOATS",
    "INTS",
    "SIGNED",
    "NUMERIC",
    "KERNEL_TOL",
    "by_name",
]

DTYPES: tuple[dt.DType, ...] = dt.ALL_DTYPES
FLOATS: tuple[dt.DType, ...] = (dt.float16, dt.bfloat16, dt.float32, dt.float64)
INTS: tuple[dt.DType, ...] = (dt.uint8, dt.int8, dt.int16, dt.int32, dt.int64)
SIGNED: tuple[dt.DType, ...] = (dt.int8, dt.int16, dt.int32, dt.int64)
NUMERIC: tuple[dt.DType, ...] = INTS + FLOATS

#: (rtol, atol) for kernel-vs-reference comparisons, per output dtype; ints and bools are exact.
KERNEL_TOL: dict[str, tuple[float, float]] = {
    "float64": (1e-9, 1e-12),
    "float32": (2e-6, 1e-6),
    "float16": (2e-3, 1e-3),
    "bfloat16": (1.6e-2, 1e-2),
}


def by_name(name: str) -> dt.DType:
    return dt.by_name(name)


@dataclass
class Call:
    """The positional arguments of one kernel call, and optional tolerance overrides."""

    args: list[Any]
    rtol: float | None = None
    atol: float | None = None

    def outputs(self) -> list[int]:
        """Positions of the output arguments (Out and Alias)."""
        return [i for i, a in enumerate(self.args) if isinstance(a, (Out, Alias))]


@dataclass(frozen=True)
class Case:
    """One row of the table: op x dtype x sample, built lazily from a seeded RNG."""

    op: str
    dtype: str
    sample: str
    build: Callable[[np.random.Generator], Call] = field(compare=False, repr=False)

    @property
    def id(self) -> str:
        return f"{self.op}-{self.dtype}-{self.sample}"

    def call(self) -> Call:
        seed = sum(ord(c) * (i + 1) for i, c in enumerate(self.id)) % (2**32)
        return self.build(np.random.default_rng(seed))

    def where(self) -> str:
        return f"op {self.op!r}, dtype {self.dtype}, sample {self.sample!r}"


def vals(rng: np.random.Generator, shape: tuple[int, ...], dtype: dt.DType, kind: str = "normal") -> np.ndarray:
    """Logical values for an operand: float64 for floats, int64 for ints, bool for bool.

    kinds: normal, positive (> 0), unit (|x| < 0.9), halves (multiples of 0.5, for rounding),
    nonzero (|x| >= 0.5 for floats, != 0 for ints), small (ints 0..3), index:<n> (0..n-1).
    """
    r: np.ndarray
    if kind.startswith("index:"):
        return rng.integers(0, int(kind.split(":")[1]), size=shape).astype(np.int64)
    if dtype is dt.bool_:
        return rng.random(shape) < 0.5
    if dtype.category == 1:
        lo, hi = (0, 10) if not dtype.is_signed else (-5, 6)
        if kind == "positive":
            lo, hi = 1, 6
        elif kind == "small":
            lo, hi = 0, 4
        ints = rng.integers(lo, hi, size=shape).astype(np.int64)
        return np.where(ints == 0, 1, ints) if kind == "nonzero" else ints
    if kind == "positive":
        r = rng.uniform(0.1, 4.0, size=shape)
    elif kind == "unit":
        r = rng.uniform(-0.9, 0.9, size=shape)
    elif kind == "halves":
        r = rng.integers(-6, 7, size=shape) * 0.5
    elif kind == "nonzero":
        r = rng.uniform(0.5, 3.0, size=shape) * rng.choice([-1.0, 1.0], size=shape)
    else:
        r = rng.standard_normal(shape) * 2.0
    return np.asarray(r, dtype=np.float64)


def fixed(*args: Any, rtol: float | None = None, atol: float | None = None) -> Callable[[np.random.Generator], Call]:
    """A builder of a Call whose arguments do not depend on the RNG."""
    return lambda rng: Call(list(args), rtol, atol)


def operand(
    rng: np.random.Generator,
    shape: tuple[int, ...],
    dtype: dt.DType,
    layout: str = "contiguous",
    kind: str = "normal",
    small: tuple[int, ...] | None = None,
) -> Operand:
    """An operand of logical shape `shape`; for layout 'broadcast', values of shape `small` expanded."""
    if layout == "broadcast":
        assert small is not None
        return Operand(vals(rng, small, dtype, kind), dtype, "broadcast", shape)
    return Operand(vals(rng, shape, dtype, kind), dtype, layout)


_ = Alias
