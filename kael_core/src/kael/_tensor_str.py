"""Tensor repr in PyTorch's format (torch/_tensor_str.py): same widths, modes, wrapping and suffixes.

One formatter per tensor picks a mode from the nonzero finite values: integers
(``1.``), fixed point with 4 decimals, or scientific (``1.0000e+08``) when the
values span more than 1000x, exceed 1e8 or fall below 1e-4; every element is
right-aligned to the widest. Lines wrap at 80 columns; tensors of more than 1000
elements show their first and last 3 entries per dimension around ``...``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["tensor_repr"]

PRECISION = 4
LINEWIDTH = 80
THRESHOLD = 1000
EDGEITEMS = 3


class _Formatter:
    def __init__(self, values: np.ndarray, floating: bool) -> None:
        self.floating = floating
        self.int_mode = True
        self.sci_mode = False
        self.width = 1
        flat = values.reshape(-1)
        if not floating:
            for v in flat.tolist():
                self.width = max(self.width, len(str(v)))
            return
        with np.errstate(all="ignore"):
            nz = flat[np.isfinite(flat) & (flat != 0)].astype(np.float64)
        if nz.size == 0:
            return
        mag = np.abs(nz)
        lo, hi = float(mag.min()), float(mag.max())
        self.int_mode = bool(np.all(nz == np.ceil(nz)))
        if self.int_mode:
            if hi / lo > 1000.0 or hi > 1.0e8:
                self.sci_mode = True
                self.width = max(len(f"{v:.{PRECISION}e}") for v in nz.tolist())
            else:
                self.width = max(len(f"{v:.0f}") + 1 for v in nz.tolist())
        elif hi / lo > 1000.0 or hi > 1.0e8 or lo < 1.0e-4:
            self.sci_mode = True
            self.width = max(len(f"{v:.{PRECISION}e}") for v in nz.tolist())
        else:
            self.width = max(len(f"{v:.{PRECISION}f}") for v in nz.tolist())

    def format(self, v: Any) -> str:
        if self.floating:
            if self.sci_mode:
                s = f"{v:{self.width}.{PRECISION}e}"
            elif self.int_mode:
                s = f"{v:.0f}" + ("" if math.isinf(v) or math.isnan(v) else ".")
            else:
                s = f"{v:.{PRECISION}f}"
        else:
            s = str(v)
        return (self.width - len(s)) * " " + s


def _summarized(a: np.ndarray) -> np.ndarray:
    """The first and last EDGEITEMS entries along every dim that has more than twice that."""
    for d in range(a.ndim):
        if a.shape[d] > 2 * EDGEITEMS:
            a = np.concatenate(
                [a.take(range(EDGEITEMS), axis=d), a.take(range(a.shape[d] - EDGEITEMS, a.shape[d]), axis=d)], axis=d
            )
    return a


def _vector(a: np.ndarray, indent: int, summarize: bool, fmt: _Formatter) -> str:
    per_line = max(1, (LINEWIDTH - indent) // (fmt.width + 2))
    if summarize and a.shape[0] > 2 * EDGEITEMS:
        data = (
            [fmt.format(v) for v in a[:EDGEITEMS].tolist()]
            + [" ..."]
            + [fmt.format(v) for v in a[-EDGEITEMS:].tolist()]
        )
    else:
        data = [fmt.format(v) for v in a.tolist()]
    lines = [", ".join(data[i : i + per_line]) for i in range(0, len(data), per_line)]
    return "[" + ("," + "\n" + " " * (indent + 1)).join(lines) + "]"


def _nested(a: np.ndarray, indent: int, summarize: bool, fmt: _Formatter) -> str:
    if a.ndim == 0:
        return fmt.format(a.item())
    if a.ndim == 1:
        return _vector(a, indent, summarize, fmt)
    n = a.shape[0]
    if summarize and n > 2 * EDGEITEMS:
        rows = (
            [_nested(a[i], indent + 1, summarize, fmt) for i in range(EDGEITEMS)]
            + ["..."]
            + [_nested(a[i], indent + 1, summarize, fmt) for i in range(n - EDGEITEMS, n)]
        )
    else:
        rows = [_nested(a[i], indent + 1, summarize, fmt) for i in range(n)]
    return "[" + ("," + "\n" * (a.ndim - 1) + " " * (indent + 1)).join(rows) + "]"


def _add_suffixes(body: str, suffixes: list[str], indent: int) -> str:
    parts = [body]
    last = len(body) - body.rfind("\n") + 1
    for s in suffixes:
        if last + len(s) + 2 > LINEWIDTH:
            parts.append(",\n" + " " * indent + s)
            last = indent + len(s)
        else:
            parts.append(", " + s)
            last += len(s) + 2
    return "".join(parts) + ")"


def tensor_repr(t: Any) -> str:
    from . import _dtype as dt

    prefix = "tensor("
    indent = len(prefix)
    suffixes = []
    if t.device.type != "cpu":
        suffixes.append(f"device='{t.device}'")
    default = t.dtype in (dt.get_default_dtype(), dt.int64, dt.bool_)
    if t.numel() == 0:
        if t.ndim != 1:
            suffixes.append(f"size={tuple(t.shape)}")
        if t.dtype is not dt.get_default_dtype():
            suffixes.append(f"dtype=kael.{t.dtype.name}")
        body = "[]"
    else:
        if not default:
            suffixes.append(f"dtype=kael.{t.dtype.name}")
        a = np.asarray(t.detach()._host())
        if a.dtype == np.float16:
            a = a.astype(np.float32)
        summarize = a.size > THRESHOLD
        fmt = _Formatter(_summarized(a) if summarize else a, t.dtype.is_floating_point)
        body = _nested(a, indent, summarize, fmt)
    if t.grad_fn is not None:
        suffixes.append(f"grad_fn=<{t.grad_fn.name()}>")
    elif t.requires_grad:
        suffixes.append("requires_grad=True")
    return _add_suffixes(prefix + body, suffixes, indent)
