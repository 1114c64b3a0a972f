"""Weights in any registry format for tests: quantized values where kael has a quantizer, else random blocks.

``weight_blocks(scheme, n, k, rng)`` returns the storage array of an [n, k] matrix in `scheme`
(``kael.quant.storage_shape``). Formats with a reference quantizer (``kael.quant.quantizable()``)
quantize random normal values; the others (the K-quants and IQ4_XS today) get random bytes,
block by block redrawn until the block decodes (by the registry's reference dequantizer) to
finite values of magnitude below ``limit``, so every bit field, scale and table index is
exercised while the float16 scales stay in a range where float32 sums are meaningful.
"""

from __future__ import annotations

import numpy as np

from ..quant import dequantize_array, quantizable, quantize_array, storage_shape
from ..quant.formats import get_format

__all__ = ["weight_blocks"]


def weight_blocks(scheme: str, n: int, k: int, rng: np.random.Generator, limit: float = 64.0) -> np.ndarray:
    """The storage array of a random [n, k] matrix in `scheme` (uint8 blocks, or the 16-bit array)."""
    if scheme in quantizable():
        return quantize_array((rng.standard_normal((n, k)) * 0.5).astype(np.float32), scheme)
    fmt = get_format(scheme)
    out = np.empty(storage_shape(scheme, n, k), np.uint8)
    blocks = out.reshape(-1, fmt.block_bytes)
    for i in range(blocks.shape[0]):
        for _ in range(1000):
            b = rng.integers(0, 256, (1, fmt.block_bytes), dtype=np.uint8)
            with np.errstate(all="ignore"):
                v = dequantize_array(b, scheme, fmt.block_values)
            if np.isfinite(v).all() and np.abs(v).max() < limit:
                blocks[i] = b[0]
                break
        else:  # pragma: no cover - a format whose random blocks are never moderate
            raise AssertionError(f"weight_blocks: no moderate random {scheme} block in 1000 draws")
    return out
