"""dtypes: the ten element types kael knows, PyTorch's type-promotion rules, and bfloat16's bits.

bfloat16 has no NumPy dtype: it is stored as uint16 bits (the upper half of a float32),
widened to float32 to compute and rounded back to nearest even (``f32_to_bf16_bits``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._errors import DTypeError

__all__ = [
    "DType",
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
    "promote_types",
    "result_type",
    "as_dtype",
    "get_default_dtype",
    "set_default_dtype",
    "ALL_DTYPES",
    "BY_NAME",
    "f32_to_bf16_bits",
    "bf16_bits_to_f32",
]


class DType:
    """An element type. `np` is the NumPy dtype used for storage (uint16 bits for bfloat16)."""

    __slots__ = ("_rank", "category", "is_floating_point", "is_signed", "itemsize", "name", "np")

    def __init__(self, name: str, itemsize: int, np_dtype: Any, category: int, rank: int, signed: bool):
        self.name = name
        self.itemsize = itemsize
        self.np = np.dtype(np_dtype)
        self.category = category  # 0 bool, 1 integer, 2 floating point
        self.is_floating_point = category == 2
        self.is_signed = signed
        self._rank = rank

    def __repr__(self) -> str:
        return f"kael.{self.name}"

    def __reduce__(self) -> str:
        return self.name if self.name != "bool" else "bool_"


bool_ = DType("bool", 1, np.bool_, 0, 0, False)
uint8 = DType("uint8", 1, np.uint8, 1, 1, False)
int8 = DType("int8", 1, np.int8, 1, 1, True)
int16 = DType("int16", 2, np.int16, 1, 2, True)
int32 = DType("int32", 4, np.int32, 1, 3, True)
int64 = DType("int64", 8, np.int64, 1, 4, True)
float16 = DType("float16", 2, np.float16, 2, 1, True)
bfloat16 = DType("bfloat16", 2, np.uint16, 2, 1, True)
float32 = DType("float32", 4, np.float32, 2, 2, True)
float64 = DType("float64", 8, np.float64, 2, 3, True)

ALL_DTYPES: tuple[DType, ...] = (bool_, uint8, int8, int16, int32, int64, float16, bfloat16, float32, float64)
BY_NAME: dict[str, DType] = {d.name: d for d in ALL_DTYPES}
_FROM_NP: dict[np.dtype[Any], DType] = {d.np: d for d in ALL_DTYPES if d is not bfloat16}

_default_float = float32


def get_default_dtype() -> DType:
    """The dtype of new floating-point tensors made without one (float32 unless set_default_dtype changed it)."""
    return _default_float


def set_default_dtype(d: DType) -> None:
    """Make ``d`` (a floating-point kael dtype) the default of new floating-point tensors; a DTypeError otherwise."""
    global _default_float
    if not isinstance(d, DType) or not d.is_floating_point:
        raise DTypeError(f"set_default_dtype: expected a floating-point kael dtype, got {d!r}")
    _default_float = d


def as_dtype(d: Any) -> DType:
    """Accept a DType, a name ("float32"), a NumPy dtype or a Python type."""
    if isinstance(d, DType):
        return d
    if isinstance(d, str):
        found = BY_NAME.get(d)
        if found is None:
            raise DTypeError(f"unknown dtype {d!r}; expected one of {sorted(BY_NAME)}")
        return found
    if d is bool:
        return bool_
    if d is int:
        return int64
    if d is float:
        return _default_float
    try:
        npd = np.dtype(d)
    except TypeError:
        raise DTypeError(f"cannot interpret {d!r} as a kael dtype") from None
    found = _FROM_NP.get(npd)
    if found is None:
        raise DTypeError(f"NumPy dtype {npd} has no kael equivalent; expected one of {sorted(BY_NAME)}")
    return found


def from_numpy_dtype(npd: np.dtype[Any]) -> DType:
    """The kael dtype stored as NumPy dtype npd (bfloat16 has none: its uint16 bits read as uint16)."""
    found = _FROM_NP.get(npd)
    if found is None:
        raise DTypeError(f"from_numpy: NumPy dtype {npd} is not supported; expected one of {sorted(BY_NAME)}")
    return found


def f32_to_bf16_bits(x: Any) -> np.ndarray:
    """float32 values (any array-like) -> bfloat16 bits (uint16), rounded to nearest even; NaN stays NaN."""
    f = np.array(x, dtype=np.float32, order="C")  # not ascontiguousarray: that makes 0-d arrays 1-d
    bits = f.view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    nan = np.isnan(f)
    out = np.asarray(rounded, dtype=np.uint16)  # an array even for 0-d input (ufuncs return scalars there)
    if nan.any():
        out = np.where(nan, np.uint16(0x7FC0), out).astype(np.uint16)
    return out


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bits (uint16) -> their float32 values (exact); an array, 0-d included."""
    return np.asarray(np.asarray(bits).astype(np.uint32) << np.uint32(16)).view(np.float32)


def _promote_slow(a: DType, b: DType) -> DType:
    if a is b:
        return a
    if a.category != b.category:
        return a if a.category > b.category else b
    if a.category == 1:
        if a.is_signed == b.is_signed:
            return a if a._rank >= b._rank else b
        u, s = (a, b) if not a.is_signed else (b, a)
        # uint8 with a signed type: the signed type if it is wider, else int16.
        return s if s._rank > u._rank else int16
    if {a, b} == {float16, bfloat16}:
        return float32
    return a if a._rank >= b._rank else b


_PROMOTE: dict[tuple[DType, DType], DType] = {(a, b): _promote_slow(a, b) for a in ALL_DTYPES for b in ALL_DTYPES}


def promote_types(a: DType, b: DType) -> DType:
    """PyTorch's promote_types: the smallest dtype both values fit in."""
    return _PROMOTE[(a, b)]


def scalar_dtype(v: object) -> DType:
    if isinstance(v, bool):
        return bool_
    if isinstance(v, int):
        return int64
    if isinstance(v, float):
        return _default_float
    raise DTypeError(f"expected a tensor or a Python bool/int/float, got {type(v).__name__}")


def result_type(*operands: Any) -> DType:
    """PyTorch's result_type over tensors and Python scalars.

    Three tiers: dimensioned tensors, then 0-d tensors, then scalars. A lower tier only
    changes the result when it is of a higher category (bool < integer < float); it then
    contributes its own dtype (0-d tensor) or the default of its category (scalar).
    """
    dim_t: DType | None = None
    zero_t: DType | None = None
    scal: DType | None = None
    for o in operands:
        d = getattr(o, "dtype", None)
        if isinstance(d, DType):
            if o.ndim:
                dim_t = d if dim_t is None else _PROMOTE[(dim_t, d)]
            else:
                zero_t = d if zero_t is None else _PROMOTE[(zero_t, d)]
        else:
            s = scalar_dtype(o)
            scal = s if scal is None else _PROMOTE[(scal, s)]
    result = dim_t
    for tier in (zero_t, scal):
        if tier is None:
            continue
        if result is None:
            result = tier
        elif tier.category > result.category:
            result = tier
    assert result is not None, "result_type needs at least one operand"
    return result
