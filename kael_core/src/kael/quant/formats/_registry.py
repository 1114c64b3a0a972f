"""The weight-format registry: every GGML weight type kael knows, declared once.

NOTE [format registry]
======================
A ``WeightFormat`` row says what GGML's ``type_traits[]`` says for one type: its
lower-case GGML name (the scheme string of ``kael.ops.dequantize`` and
``quantized_linear``), its GGML type id, how many values one block holds
(``block_values``: 32 for the legacy types and IQ4_NL, 256 for the K-quants and
IQ4_XS, 1 for the float types), how many bytes one block takes (``block_bytes``), the
NumPy dtype a kael tensor stores it in (``uint8`` blocks; float types their own
dtype, bf16 as uint16 bit patterns), the NumPy reference dequantizer of a run of
blocks, and the format llama.cpp gives the output head in files of this type
(``head``). The rows live in one file per family (``_float``, ``_legacy``,
``_kquants``, ``_iq4``); ``kael.quant.formats`` gathers them into ``FORMATS``.
An unknown name or type id is an error, never a fallback.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..._errors import DTypeError, FormatError, ShapeError

__all__ = ["WeightFormat", "Dequantizer", "Quantizer", "half", "u16", "check_blocks"]

Dequantizer = Callable[[np.ndarray], np.ndarray]
"""Decodes uint8 blocks [nb, block_bytes] into float32 values [nb, block_values]."""

Quantizer = Callable[[np.ndarray], np.ndarray]
"""Encodes finite float32 values [nb, block_values] into uint8 blocks [nb, block_bytes] (ggml's reference rounding)."""


@dataclass(frozen=True)
class WeightFormat:
    """One weight format (NOTE [format registry]).

    Attributes:
        name: GGML's type name in lower case (``"q4_k"``), the scheme string.
        ggml_type: GGML's type id (``GGMLQuantizationType`` value).
        family: ``"float"``, ``"legacy"``, ``"k-quant"`` or ``"iq4"``.
        block_values: values per block (1 for float types).
        block_bytes: bytes per block (the item size for float types).
        storage: NumPy dtype name of the kael storage array.
        dequantize_blocks: uint8 [nb, block_bytes] -> float32 [nb, block_values].
        head: the format llama.cpp stores the output head in for files of this type.
        quantize_blocks: the reference quantizer of a run of blocks, None where kael has none yet.
    """

    name: str
    ggml_type: int
    family: str
    block_values: int
    block_bytes: int
    storage: str
    dequantize_blocks: Dequantizer
    head: str
    quantize_blocks: Quantizer | None = None

    @property
    def blocked(self) -> bool:
        """Whether the format packs values into blocks (stored as uint8 rows)."""
        return self.family != "float"

    def row_bytes(self, k: int) -> int:
        """Bytes of one row of `k` values; a ShapeError when `k` is not a whole number of blocks."""
        if k % self.block_values:
            raise ShapeError(
                f"{self.name}: a row of {k} values is not a whole number of {self.block_values}-value blocks"
            )
        return k // self.block_values * self.block_bytes

    def dequantize(self, data: np.ndarray, k: int) -> np.ndarray:
        """Float32 [N, k] values of uint8 rows `data` [N, row_bytes(k)] (for float formats: their raw bytes)."""
        if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2:
            got = f"{data.dtype} {list(data.shape)}" if isinstance(data, np.ndarray) else type(data).__name__
            raise DTypeError(f"{self.name}: dequantize expects a 2-D uint8 array of blocks, got {got}")
        want = self.row_bytes(k)
        if data.shape[1] != want:
            raise FormatError(
                f"{self.name}: a row of {k} values takes {want} bytes "
                f"({k // self.block_values} blocks of {self.block_bytes}), got {data.shape[1]}"
            )
        n = data.shape[0]
        if n == 0 or k == 0:  # no blocks: some dequantizers reshape with -1, which an empty array cannot
            return np.zeros((n, k), np.float32)
        blocks = np.ascontiguousarray(data).reshape(n * (k // self.block_values), self.block_bytes)
        with np.errstate(invalid="ignore", over="ignore"):  # inf/NaN scales decode as GGML's do
            return self.dequantize_blocks(blocks).reshape(n, k)

    def quantize(self, x: np.ndarray) -> np.ndarray:
        """Uint8 rows [N, row_bytes(K)] of float32 values `x` [N, K] (finite), as ggml's reference quantizer."""
        if self.quantize_blocks is None or not self.blocked:
            raise DTypeError(f"{self.name}: kael has no reference block quantizer for this format")
        if not isinstance(x, np.ndarray) or x.ndim != 2 or x.dtype.kind != "f":
            got = f"{x.dtype} {list(x.shape)}" if isinstance(x, np.ndarray) else type(x).__name__
            raise DTypeError(f"{self.name}: quantize expects a 2-D float array [N, K], got {got}")
        n, k = x.shape
        width = self.row_bytes(k)
        v = np.ascontiguousarray(x, dtype=np.float32)
        if not np.isfinite(v).all():
            raise FormatError(f"{self.name}: quantize needs finite values; the array holds infinities or NaN")
        if n == 0 or k == 0:  # no blocks to quantize
            return np.zeros((n, width), np.uint8)
        return self.quantize_blocks(v.reshape(-1, self.block_values)).reshape(n, width)


def check_blocks(blocks: np.ndarray, block_bytes: int) -> None:
    """Raise FormatError unless `blocks` is uint8 [nb, block_bytes]."""
    if blocks.dtype != np.uint8 or blocks.ndim != 2 or blocks.shape[1] != block_bytes:
        raise FormatError(f"expected uint8 blocks [nb, {block_bytes}], got {blocks.dtype} {list(blocks.shape)}")


def half(blocks: np.ndarray, at: int) -> np.ndarray:
    """The little-endian float16 at byte `at` of every block, widened to float32, shape [nb, 1]."""
    return np.ascontiguousarray(blocks[:, at : at + 2]).view("<f2").astype(np.float32)


def u16(blocks: np.ndarray, at: int) -> np.ndarray:
    """The little-endian uint16 at byte `at` of every block, as int64 [nb, 1]."""
    return np.ascontiguousarray(blocks[:, at : at + 2]).view("<u2").astype(np.int64)
