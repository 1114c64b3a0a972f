"""Weight formats: the byte layouts, and the NumPy reference quantize / dequantize.

NOTE [weight formats]
=====================
A weight matrix W [N, K] (a linear layer's [out_features, in_features]) is stored in
one of the schemes of the format registry (``SCHEMES``: every row of NOTE [format
registry] in ``formats/_registry.py`` except f32, that is the legacy block types, the
K-quants, IQ4_NL / IQ4_XS, bf16 and f16); ``kael.ops.dequantize`` and ``quantized_linear`` take it
in exactly this form, and GGUF files hold it byte for byte the same. The first four,
as examples of the block layouts:

* ``q8_0`` (GGML type Q8_0): each row is K/32 blocks of 34 bytes (``BLOCK_BYTES``);
  a block covers 32 consecutive values of the row: bytes 0-1 are the scale ``d``, a
  little-endian IEEE float16, bytes 2..33 are 32 int8 ``q``; value i = d * q[i]. The
  tensor is uint8 [N, K/32*34].
* ``q4_0`` (GGML type Q4_0): blocks of 18 bytes: float16 ``d``, then 16 bytes where
  byte j holds value j in its low nibble and value j + 16 in its high nibble, each
  offset by 8: value j = d * ((b[j] & 15) - 8), value j + 16 = d * ((b[j] >> 4) - 8).
  The tensor is uint8 [N, K/32*18].
* ``bf16``: bfloat16 [N, K] (NumPy has no bfloat16: arrays hold the uint16 bit
  patterns), rounded to nearest even from float32 as ``torch.Tensor.to(torch.bfloat16)``.
* ``f16``: float16 [N, K], rounded to nearest even (NumPy's ``astype``).

Dequantizing multiplies the float16 scale, widened to float32, by the integer value
in float32: one rounding, the same on every backend (and as ggml's reference code).

Quantizing follows ggml's reference rounding (``quantize_row_q8_0_ref`` /
``quantize_row_q4_0_ref`` in ggml-quants.c; ``gguf.quants`` gives the same bytes),
all arithmetic in float32:

* q8_0: ``d = max|x| / 127``, ``id = 1/d`` (0 when d is 0), ``q = roundf(x * id)``
  (round half away from zero, C's ``roundf``), and d stored rounded to float16.
* q4_0: ``m`` = the value of largest magnitude (the first one on ties), ``d = m / -8``,
  ``id = 1/d`` (0 when d is 0), ``q = min(15, trunc(x * id + 8.5))`` (so the extreme
  value maps to 0, i.e. -8, and the opposite extreme clips at 15, i.e. +7), and d
  stored rounded to float16.

Where ``1/d`` overflows float32 (a block whose largest magnitude is below about
3.7e-37, whose float16 scale is 0 anyway), ``x * id`` is not finite and q is 0 (the
value NumPy's cast gives for gguf.quants there); such a block decodes to zeros. Blocks
must hold finite values: ``quantize_array`` refuses infinities and NaN for q8_0/q4_0.
A layer whose K is not a multiple of 32 cannot be block-quantized (llama.cpp keeps
it in a float type); ``kael.quantize`` leaves it float32.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .._device import as_device
from .._dtype import bfloat16, f32_to_bf16_bits, float16, uint8
from .._errors import DTypeError, FormatError, ShapeError
from .._tensor import Tensor, from_numpy_bits
from ..backends.host._quant import decode
from .formats import FORMATS

__all__ = [
    "SCHEMES",
    "BLOCK_SIZE",
    "BLOCK_BYTES",
    "BLOCK_VALUES",
    "quantizable",
    "quantize_array",
    "dequantize_array",
    "to_device_weight",
    "storage_shape",
]


SCHEMES: tuple[str, ...] = tuple(name for name in FORMATS if name != "f32")
"""Every weight format of the registry (``kael.quant.formats``) but f32, which is a float parameter."""
BLOCK_SIZE = 32
"""Values per block of the 32-value formats (q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl); see BLOCK_VALUES."""
BLOCK_BYTES: dict[str, int] = {f.name: f.block_bytes for f in FORMATS.values() if f.blocked}
"""Bytes per block of each block format."""
BLOCK_VALUES: dict[str, int] = {f.name: f.block_values for f in FORMATS.values() if f.blocked}
"""Values per block of each block format (32, or 256 for the K-quants and IQ4_XS)."""


def _scheme(op: str, scheme: Any) -> str:
    if not isinstance(scheme, str) or scheme not in SCHEMES:
        raise DTypeError(f"{op}: unknown weight scheme {scheme!r}; expected one of {', '.join(SCHEMES)}")
    return scheme


def storage_shape(scheme: str, n: int, k: int) -> tuple[int, int]:
    """The shape of the array (or tensor) holding an [n, k] matrix in `scheme`: [n, k/32*B] or [n, k]."""
    _scheme("storage_shape", scheme)
    if scheme not in BLOCK_BYTES:
        return n, k
    bv = BLOCK_VALUES[scheme]
    if k % bv:
        raise ShapeError(f"storage_shape: {scheme} needs K to be a multiple of {bv}, got K = {k}")
    return n, k // bv * BLOCK_BYTES[scheme]


def _roundf(v: np.ndarray) -> np.ndarray:
    """C's roundf (half away from zero), exact in float32: floor of |v|, plus one where the fraction is >= 1/2."""
    a = np.abs(v)
    whole = np.floor(a)
    up = (a - whole) >= np.float32(0.5)  # a - floor(a) is exact
    out: np.ndarray = np.copysign(whole + up.astype(np.float32), v)
    return out


def _blocks(a: np.ndarray) -> np.ndarray:
    return a.reshape(a.shape[0], a.shape[1] // BLOCK_SIZE, BLOCK_SIZE)  # [N, nb, 32]


def _scale_bytes(d: np.ndarray) -> np.ndarray:
    """[N, nb, 1] float32 scales -> [N, nb, 2] uint8: little-endian float16, rounded to nearest even."""
    return d.astype("<f2").view(np.uint8)


def _q8_0(a: np.ndarray) -> np.ndarray:
    x = _blocks(a)
    d = np.max(np.abs(x), axis=-1, keepdims=True) / np.float32(127)  # [N, nb, 1]
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
        v = x * inv
        q = _roundf(np.where(np.isfinite(v), v, np.float32(0))).astype(np.int8)
    out = np.concatenate([_scale_bytes(d), q.view(np.uint8)], axis=-1)  # [N, nb, 34]
    return out.reshape(storage_shape("q8_0", *a.shape))


def _q4_0(a: np.ndarray) -> np.ndarray:
    x = _blocks(a)
    pick = np.argmax(np.abs(x), axis=-1)[..., None]  # the first value of largest magnitude
    d = np.take_along_axis(x, pick, axis=-1) / np.float32(-8)  # [N, nb, 1]
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
        v = x * inv + np.float32(8.5)
        q = np.minimum(np.trunc(np.where(np.isfinite(v), v, np.float32(0))), 15).astype(np.uint8)  # [N, nb, 32], 0..15
    half = BLOCK_SIZE // 2
    packed = q[..., :half] | (q[..., half:] << np.uint8(4))  # byte j: value j low, value j + 16 high
    out = np.concatenate([_scale_bytes(d), packed], axis=-1)  # [N, nb, 18]
    return out.reshape(storage_shape("q4_0", *a.shape))


def quantize_array(a: np.ndarray, scheme: str) -> np.ndarray:
    """W [N, K] (float32, or a float array converted to float32) in `scheme` (NOTE [weight formats]).

    q8_0 / q4_0: uint8 [N, K/32*B] of GGML blocks, the bytes ``gguf.quants.quantize``
    gives (K must be a multiple of 32, values finite); f16: float16 [N, K]; bf16: uint16
    bfloat16 bit patterns [N, K] (round to nearest even, as torch).
    """
    _scheme("quantize_array", scheme)
    if not isinstance(a, np.ndarray):
        raise DTypeError(f"quantize_array: expected a numpy.ndarray, got {type(a).__name__}")
    if a.dtype.kind != "f":
        raise DTypeError(f"quantize_array: expected a floating-point array, got dtype {a.dtype}")
    if a.ndim != 2:
        raise ShapeError(f"quantize_array: expected a 2-D array [N, K], got shape {list(a.shape)}")
    x = np.ascontiguousarray(a, dtype=np.float32)
    if scheme == "f16":
        with np.errstate(over="ignore"):
            return x.astype(np.float16)
    if scheme == "bf16":
        return f32_to_bf16_bits(x)
    bv = BLOCK_VALUES[scheme]
    if x.shape[1] % bv:
        raise ShapeError(
            f"quantize_array: {scheme} quantizes rows in blocks of {bv}; K = {x.shape[1]} is not a multiple"
        )
    if not np.isfinite(x).all():
        raise FormatError(f"quantize_array: {scheme} needs finite values; the array holds infinities or NaN")
    rows_of: Callable[[np.ndarray], np.ndarray]
    if scheme == "q8_0":
        rows_of = _q8_0
    elif scheme == "q4_0":
        rows_of = _q4_0
    else:
        fmt = FORMATS[scheme]
        if fmt.quantize_blocks is None:  # never a fallback to another format
            raise DTypeError(
                f"quantize_array: kael has no reference quantizer for {scheme!r} yet (it loads and runs such "
                f"weights); quantizable: {', '.join(quantizable())}"
            )
        rows_of = fmt.quantize
    # Rows are quantized independently (every block lies within a row), so a big array goes a slab of rows at a
    # time: the quantizers' float temporaries, several times their input, then stay small (a 49152 x 576 token
    # table: about 8 MB of them, not 400).
    step = max(1, _CHUNK_BYTES // max(1, 4 * x.shape[1]))
    if x.shape[0] <= step:
        return rows_of(x)
    first = rows_of(x[:step])
    out = np.empty((x.shape[0], *first.shape[1:]), dtype=first.dtype)
    out[:step] = first
    for i in range(step, x.shape[0], step):
        out[i : i + step] = rows_of(x[i : i + step])
    return out


_CHUNK_BYTES = 8 << 20  # float32 input per slab of rows (quantize_array)


def quantizable() -> tuple[str, ...]:
    """The schemes ``quantize_array`` (and ``kael.quantize``) can write: float ones and those with a reference quantizer."""
    return tuple(n for n in SCHEMES if not FORMATS[n].blocked or FORMATS[n].quantize_blocks is not None)


def _check_data(op: str, data: Any, scheme: str, k: Any) -> None:
    if not isinstance(data, np.ndarray):
        raise DTypeError(f"{op}: expected a numpy.ndarray, got {type(data).__name__}")
    want = np.dtype(FORMATS[scheme].storage)
    if data.dtype != want:
        what = " (bfloat16 bit patterns)" if scheme == "bf16" else ""
        raise DTypeError(f"{op}: {scheme} data must be a {np.dtype(want).name}{what} array, got dtype {data.dtype}")
    if data.ndim != 2:
        raise ShapeError(f"{op}: {scheme} data must be 2-D, got shape {list(data.shape)}")
    if k is None:
        return
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0:
        raise ShapeError(f"{op}: k must be a non-negative int, got {k!r}")
    want_shape = storage_shape(scheme, data.shape[0], int(k))
    if data.shape != want_shape:
        raise ShapeError(
            f"{op}: {scheme} data of shape {list(data.shape)} does not hold an [N, {k}] matrix "
            f"(expected {list(want_shape)})"
        )


def dequantize_array(data: np.ndarray, scheme: str, k: int) -> np.ndarray:
    """The float32 [N, k] values of `data`, a matrix stored in `scheme` (as quantize_array returns it)."""
    _scheme("dequantize_array", scheme)
    _check_data("dequantize_array", data, scheme, k)
    return decode(data, scheme, int(k))


def to_device_weight(data: np.ndarray, scheme: str, device: Any = "cpu", *, copy: bool = True) -> Tensor:
    """The Tensor the weight-format ops take for `data` (uint8 blocks, bfloat16 or float16 [N, K]) on `device`.

    With ``copy=False`` a CPU tensor shares memory with `data` (e.g. a memory-mapped
    file, which must then stay open while the tensor is used); the default copies.
    """
    _scheme("to_device_weight", scheme)
    _check_data("to_device_weight", data, scheme, None)
    if scheme in BLOCK_BYTES and data.shape[1] % BLOCK_BYTES[scheme]:  # a whole number of blocks
        raise ShapeError(
            f"to_device_weight: a {scheme} row holds {data.shape[1]} bytes, not a whole number of "
            f"{BLOCK_BYTES[scheme]}-byte blocks"
        )
    arr = np.array(data, copy=True) if copy else data
    dtype = {"bf16": bfloat16, "f16": float16}.get(scheme, uint8)
    t = from_numpy_bits(arr, dtype)
    dev = as_device(device)
    return t if dev.type == "cpu" else t.to(dev)
