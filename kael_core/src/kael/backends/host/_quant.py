"""The weight-format kernels as plain NumPy: dequantize and quantized_linear (NOTE [weight formats]).

``decode(data, scheme, k)`` turns a weight matrix stored in a weight format into its
float32 values; it is the one NumPy definition of the GGML block layouts, used by these
kernels and by ``kael.quant.dequantize_array``. The layouts are described in NOTE
[weight formats] (``kael/quant/_formats.py``).

quantized_linear multiplies row by row (one matrix-vector product per row of x), so
the result of a row is the same whether x has one row or many (the catalogue's batch
invariance: batched decoding equals decoding alone, bit for bit).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..._errors import DTypeError
from ._io import bf16_bits_to_f32, rd, wr

__all__ = ["KERNELS", "decode"]


def decode(data: np.ndarray, scheme: str, k: int) -> np.ndarray:
    """The float32 [N, k] values of weight data stored in `scheme` (the caller has checked the shapes).

    Block schemes: data uint8 [N, k/bv*bb] of GGML blocks, decoded by the registry's reference
    dequantizer (``kael.quant.formats``, bit-exact with ``gguf.quants``); bf16: uint16 bit patterns
    [N, k]; f16: float16 [N, k] (a float32 array is also taken, for bf16 tensors read already widened).
    """
    if scheme in ("bf16", "f16"):
        if data.dtype == np.uint16:
            return bf16_bits_to_f32(data)
        return np.asarray(data, dtype=np.float32)
    from ...quant.formats import FORMATS  # on first use: kael.quant imports this module

    fmt = FORMATS.get(scheme)
    if fmt is None or not fmt.blocked:  # never a fallback to some other layout
        known = ", ".join(name for name in FORMATS if name != "f32")
        raise DTypeError(f"decode: unknown weight scheme {scheme!r}; expected one of {known}")
    rows = np.ascontiguousarray(data, dtype=np.uint8)
    if rows.ndim != 2:  # kernels pass [N, bytes]; a caller with another shape has its rows flattened
        rows = rows.reshape(rows.shape[0], -1) if rows.size else rows.reshape(rows.shape[0], 0)
    return fmt.dequantize(rows, k)


def dequantize(out: Any, weight: Any, scheme: str) -> None:
    wr(out, decode(rd(weight), scheme, out.shape[1]))


def quantized_linear(out: Any, x: Any, weight: Any, bias: Any, scheme: str) -> None:
    k = x.shape[-1]
    w = decode(rd(weight), scheme, k)  # [N, K] float32
    n = w.shape[0]
    xs = np.asarray(rd(x), dtype=np.float32).reshape(-1, k)
    y = np.empty((xs.shape[0], n), np.float32)
    for i in range(xs.shape[0]):  # one matrix-vector product per row: a row's result never depends on the others
        np.matmul(w, xs[i], out=y[i])
    if bias is not None:
        y += np.asarray(rd(bias), dtype=np.float32)
    wr(out, y.reshape(out.shape))


KERNELS: dict[str, Callable[..., None]] = {"dequantize": dequantize, "quantized_linear": quantized_linear}
