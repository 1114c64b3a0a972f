"""GGML's non-linear 4-bit formats: iq4_nl (32-value blocks) and iq4_xs (256-value super-blocks).

Each 4-bit index selects a value of ``KVALUES`` (ggml's ``kvalues_iq4nl``). iq4_nl
(18 bytes) = f16 d, 16 bytes of nibbles (byte j: value j low, j + 16 high), value =
d * KVALUES[q]. iq4_xs (136 bytes) = f16 d, uint16 scales_h, scales_l[4], qs[128]: the
6-bit scale ls of sub-block ib (32 values) is the nibble ib%2 of scales_l[ib//2] plus
bits 2*ib..2*ib+1 of scales_h as its top two bits; value = d*(ls - 32) * KVALUES[q],
nibbles packed per sub-block as in iq4_nl.
"""

from __future__ import annotations

import numpy as np

from ._iq4_grid import KVALUES
from ._iq4_quantize import quantize_iq4_nl, quantize_iq4_xs
from ._registry import WeightFormat, check_blocks, half, u16

__all__ = ["IQ4_NL", "IQ4_XS", "KVALUES"]

"""The 16 values a 4-bit iq4 index selects (ggml's kvalues_iq4nl)."""


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """[..., 16] bytes -> [..., 32] indices (low nibbles first)."""
    return np.concatenate([qs & np.uint8(15), qs >> np.uint8(4)], axis=-1)


def _iq4_nl(blocks: np.ndarray) -> np.ndarray:
    check_blocks(blocks, 18)
    out: np.ndarray = half(blocks, 0) * KVALUES[_nibbles(blocks[:, 2:])].astype(np.float32)
    return out


def _iq4_xs(blocks: np.ndarray) -> np.ndarray:
    check_blocks(blocks, 136)
    ib = np.arange(8)
    sl = blocks[:, 4:8].astype(np.int64)
    ls = ((sl[:, ib // 2] >> (4 * (ib % 2))) & 15) | (((u16(blocks, 2) >> (2 * ib)) & 3) << 4)
    dl = half(blocks, 0) * (ls - 32).astype(np.float32)  # [nb, 8]
    q = _nibbles(blocks[:, 8:].reshape(-1, 8, 16))  # [nb, 8, 32]
    vals = dl[:, :, None] * KVALUES[q].astype(np.float32)
    out: np.ndarray = vals.reshape(-1, 256)
    return out


IQ4_NL = WeightFormat("iq4_nl", 20, "iq4", 32, 18, "uint8", _iq4_nl, "q6_k", quantize_iq4_nl)
"""Non-linear 4-bit, 32-value blocks."""
IQ4_XS = WeightFormat("iq4_xs", 23, "iq4", 256, 136, "uint8", _iq4_xs, "q6_k", quantize_iq4_xs)
"""Non-linear 4-bit, 256-value super-blocks with 6-bit sub-block scales."""
