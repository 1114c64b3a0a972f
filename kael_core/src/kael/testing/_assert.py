"""assert_close: compare tensors, arrays and numbers with dtype-aware tolerances.

Failures raise AssertionError with what a person fixing a kernel needs: the shapes,
the number of mismatched elements, the worst element (its index, both values, the
absolute and relative difference) and the tolerances used.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["assert_close", "default_tolerances", "to_numpy"]

#: (rtol, atol) per dtype name; integer and bool dtypes compare exactly.
TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-7),
    "float32": (1.3e-6, 1e-5),
    "float16": (1e-3, 1e-3),
    "bfloat16": (1.6e-2, 1e-2),
}


def _dtype_name(x: Any) -> str:
    d = getattr(x, "dtype", None)
    name = getattr(d, "name", None)
    if isinstance(name, str) and not isinstance(d, np.dtype):
        return name  # a kael DType
    if isinstance(d, np.dtype):
        return str(d)
    if isinstance(x, bool):
        return "bool"
    if isinstance(x, int):
        return "int64"
    return "float64" if isinstance(x, float) else "float32"


def default_tolerances(*values: Any) -> tuple[float, float]:
    """The loosest (rtol, atol) among the values' dtypes ((0, 0) when all are exact types)."""
    rtol = atol = 0.0
    for v in values:
        r, a = TOLERANCES.get(_dtype_name(v), (0.0, 0.0))
        rtol, atol = max(rtol, r), max(atol, a)
    return rtol, atol


def to_numpy(x: Any) -> np.ndarray:
    """Host NumPy values of a kael Tensor (any device, bfloat16 widened), array, list or number."""
    from kael import Tensor

    if isinstance(x, Tensor):
        return np.array(np.asarray(x.detach()), copy=True)
    return np.asarray(x)


def _fmt_index(idx: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(int(i)) for i in idx) + ")" if idx else "()"


def assert_close(
    actual: Any,
    expected: Any,
    *,
    rtol: float | None = None,
    atol: float | None = None,
    equal_nan: bool = True,
    check_dtype: bool = False,
    check_shape: bool = True,
    msg: str = "",
) -> None:
    """Assert |actual - expected| <= atol + rtol * |expected| elementwise (NaNs equal if equal_nan).

    Accepts kael Tensors on any device, NumPy arrays, nested lists and numbers. Default
    tolerances come from the dtypes (the loosest of the two); integer and bool values must
    match exactly. ``msg`` is prefixed to the failure message (say which op, dtype, sample).
    """
    prefix = f"{msg}: " if msg else ""
    if check_dtype:
        da, de = _dtype_name(actual), _dtype_name(expected)
        if da != de:
            raise AssertionError(f"{prefix}dtype mismatch: actual {da}, expected {de}")
    a, e = to_numpy(actual), to_numpy(expected)
    if check_shape and a.shape != e.shape:
        raise AssertionError(f"{prefix}shape mismatch: actual {list(a.shape)}, expected {list(e.shape)}")
    d_rtol, d_atol = default_tolerances(actual, expected)
    rtol = d_rtol if rtol is None else rtol
    atol = d_atol if atol is None else atol
    try:
        a, e = np.broadcast_arrays(a, e)
    except ValueError:
        raise AssertionError(f"{prefix}shapes {list(a.shape)} and {list(e.shape)} cannot be compared") from None
    if a.size == 0:
        return
    if a.dtype.kind in "biu" and e.dtype.kind in "biu":
        bad = a != e
        diff = np.abs(a.astype(np.float64) - e.astype(np.float64))
    else:
        af, ef = a.astype(np.float64), e.astype(np.float64)
        with np.errstate(invalid="ignore", over="ignore"):
            diff = np.abs(af - ef)
            bad = ~(diff <= atol + rtol * np.abs(ef))
        same_inf = np.isinf(af) & np.isinf(ef) & (af == ef)
        bad &= ~same_inf
        if equal_nan:
            bad &= ~(np.isnan(af) & np.isnan(ef))
        diff = np.where(same_inf | (np.isnan(af) & np.isnan(ef)), 0.0, diff)
    n_bad = int(np.count_nonzero(bad))
    if not n_bad:
        return
    score = np.where(bad, np.nan_to_num(diff, nan=np.inf, posinf=np.inf), -1.0)
    flat = int(np.argmax(score))
    idx = tuple(int(i) for i in np.unravel_index(flat, a.shape)) if a.ndim else ()
    av, ev = a[idx].item(), e[idx].item()
    worst = float(diff[idx])
    finite_diffs = diff[np.isfinite(diff)]
    max_abs = float(finite_diffs.max()) if finite_diffs.size else float("inf")
    rel = worst / abs(float(ev)) if float(ev) != 0 else float("inf")
    raise AssertionError(
        f"{prefix}{n_bad} of {a.size} elements differ (max abs diff {max_abs:.6g}); worst at index "
        f"{_fmt_index(idx)}: actual {av!r}, expected {ev!r} (abs diff {worst:.6g}, rel diff {rel:.6g}); "
        f"rtol={rtol:g}, atol={atol:g}, shape {list(a.shape)}"
    )
