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

__all__ = ["KERNELS", "decode", "SCHEMES", "BLOCK_SIZE", "BLOCK_BYTES"]

#: The weight formats, by name (kael.quant.SCHEMES).
SCHEMES: tuple[str, ...] = ("q8_0", "q4_0", "bf16", "f16")
#: Values per GGML block.
BLOCK_SIZE = 32
#: Bytes per block of each block scheme.
BLOCK_BYTES: dict[str, int] = {"q8_0": 34, "q4_0": 18}


def decode(data: np.ndarray, scheme: str, k: int) -> np.ndarray:
    """The float32 [N, k] values of weight data stored in `scheme` (the caller has checked the shapes).

    q8_0 / q4_0: data uint8 [N, k/32*B] of GGML blocks; bf16: uint16 bit patterns [N, k];
    f16: float16 [N, k] (a float32 array is also taken, for bf16 tensors read already widened).
    """
    if scheme in ("bf16", "f16"):
        if data.dtype == np.uint16:
            return bf16_bits_to_f32(data)
        return np.asarray(data, dtype=np.float32)
    if scheme not in BLOCK_BYTES:  # never a fallback to some other layout
        raise DTypeError(f"decode: unknown weight scheme {scheme!r}; expected one of {', '.join(SCHEMES)}")
    n = data.shape[0]
    nb = k // BLOCK_SIZE
    blocks = np.ascontiguousarray(data, dtype=np.uint8).reshape(n, nb, BLOCK_BYTES[scheme])
    d = blocks[..., :2].copy().view("<f2").astype(np.float32)  # [N, nb, 1]: the block scales
    if scheme == "q8_0":
        q = blocks[..., 2:].view(np.int8).astype(np.float32)  # [N, nb, 32]
    else:  # q4_0
        packed = blocks[..., 2:]  # [N, nb, 16]: value i in the low nibble, value i + 16 in the high one
        q = np.concatenate([packed & 15, packed >> 4], axis=-1).astype(np.float32) - 8.0
    return (d * q).reshape(n, k)


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
