"""``kael.backends.dtypes``: the element types a backend stores, and how to look them up.

Each ``DType`` has ``name``, ``itemsize`` (bytes), ``np`` (the NumPy dtype of its
storage: uint16 bits for bfloat16, which NumPy lacks), ``category`` (``BOOL`` 0,
``INTEGER`` 1, ``FLOATING`` 2), ``is_floating_point`` and ``is_signed``. Dtypes are
singletons: compare them with ``is``.

* ``ALL_DTYPES``: the ten dtypes, in a fixed order (bool, uint8, int8, int16, int32,
  int64, float16, bfloat16, float32, float64); ``BY_NAME``: name -> DType.
* ``FLOATING_DTYPES``, ``INTEGER_DTYPES``: the float and integer ones.
* ``by_name(name)``: the DType (``DTypeError`` naming the known ones otherwise).
* ``from_numpy_dtype(npd)``: the DType stored as NumPy dtype npd (not bfloat16).
"""

from __future__ import annotations

from .._dtype import (
    ALL_DTYPES,
    BY_NAME,
    DType,
    as_dtype,
    bfloat16,
    bool_,
    float16,
    float32,
    float64,
    from_numpy_dtype,
    int8,
    int16,
    int32,
    int64,
    uint8,
)
from .._errors import DTypeError

__all__ = [
    "DType",
    "ALL_DTYPES",
    "BY_NAME",
    "FLOATING_DTYPES",
    "INTEGER_DTYPES",
    "BOOL",
    "INTEGER",
    "FLOATING",
    "by_name",
    "from_numpy_dtype",
    "bool_",
    "uint8",
    "int8",
    "int16",
    "int32",
    "int64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
]

BOOL, INTEGER, FLOATING = 0, 1, 2
FLOATING_DTYPES: tuple[DType, ...] = tuple(d for d in ALL_DTYPES if d.category == FLOATING)
INTEGER_DTYPES: tuple[DType, ...] = tuple(d for d in ALL_DTYPES if d.category == INTEGER)


def by_name(name: str) -> DType:
    """The dtype called `name` ("float32", "bool", ...)."""
    if not isinstance(name, str):
        raise DTypeError(f"unknown dtype {name!r}; expected one of {sorted(BY_NAME)}")
    return as_dtype(name)  # the one name lookup, with its error
