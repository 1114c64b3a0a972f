"""Table rows for the weight-format ops: dequantize and quantized_linear (NOTE [weight formats]).

The weights are real blocks (``kael.testing.weight_blocks``: quantized random values, or for
the formats without a reference quantizer random blocks redrawn until they decode to moderate
finite values), passed as uint8 operands for the block formats and as bfloat16 / float16 operands
for bf16 / f16. The rows cover every scheme of the registry (the 256-value formats with K rounded up to whole
blocks) with 1 to 17 rows, K from 32 to 256, with and
without bias, 3-D, transposed and strided x, a strided output, a weight with strided rows
(and, for the block schemes, starting at an odd byte), and x with no rows. As for the other
fused ops, a backend's kernels and the frontend decompositions on its primitives are both
checked against the reference kernels.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kael.backends import dtypes as dt
from kael.quant import BLOCK_VALUES, SCHEMES
from kael.testing import weight_blocks

from ._cases import Call, Case, operand
from ._layout import Operand, Out

__all__ = ["quant_cases", "LINEAR_TOL"]

Builder = Callable[[np.random.Generator], Call]
#: quantized_linear accumulates K products in float32 in an order of the backend's choosing.
LINEAR_TOL = (1e-5, 1e-4)
_WEIGHT_DTYPE = {s: {"bf16": dt.bfloat16, "f16": dt.float16}.get(s, dt.uint8) for s in SCHEMES}


def _k(scheme: str, k: int) -> int:
    """K for a row of the table: as written for the 32-value formats, whole 256-value blocks for the others."""
    bv = BLOCK_VALUES.get(scheme, 1)
    return k if k % bv == 0 else -(-k // bv) * bv


def _weight(rng: np.random.Generator, n: int, k: int, scheme: str, layout: str) -> Operand:
    """A weight [n, k] in `scheme`: block bytes (as int64 values of uint8) or float values of the 16-bit dtype."""
    data = weight_blocks(scheme, n, k, rng)
    d = _WEIGHT_DTYPE[scheme]
    if scheme == "bf16":
        values = (data.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    elif scheme == "f16":
        values = data.astype(np.float64)
    else:
        values = data.astype(np.int64)
    return Operand(values, d, layout)


def _dequantize(scheme: str) -> dict[str, Builder]:
    def mk(n: int, k: int, lw: str, lo: str) -> Builder:
        kk = _k(scheme, k)
        return lambda rng: Call([Out((n, kk), dt.float32, lo), _weight(rng, n, kk, scheme, lw), scheme])

    s = {
        "1x32": mk(1, 32, "contiguous", "contiguous"),
        "9x256": mk(9, 256, "contiguous", "contiguous"),
        "out_strided": mk(4, 64, "contiguous", "strided"),
        "w_strided": mk(3, 96, "strided", "contiguous"),
        "no_rows": mk(0, 64, "contiguous", "contiguous"),
    }
    if scheme in ("bf16", "f16"):
        s["w_transposed"] = mk(5, 64, "transposed", "contiguous")
    return s


def _quantized_linear(scheme: str) -> dict[str, Builder]:
    def mk(xs: tuple[int, ...], n: int, lx: str, bias: bool, lo: str = "contiguous", lw: str = "contiguous") -> Builder:
        xs = (*xs[:-1], _k(scheme, xs[-1]))

        def build(rng: np.random.Generator) -> Call:
            x = operand(rng, xs, dt.float32, lx, "unit")
            w = _weight(rng, n, xs[-1], scheme, lw)
            b = operand(rng, (n,), dt.float32, "strided") if bias else None
            return Call([Out(xs[:-1] + (n,), dt.float32, lo), x, w, b, scheme], *LINEAR_TOL)

        return build

    return {
        "1row_k32": mk((1, 32), 5, "contiguous", True),
        "17rows_k256": mk((17, 256), 9, "contiguous", False),
        "3d": mk((2, 3, 64), 7, "contiguous", True),
        "x_transposed": mk((4, 96), 6, "transposed", True),
        "x_strided_out_strided": mk((5, 128), 3, "strided", False, lo="strided"),
        "w_strided": mk((3, 64), 4, "contiguous", True, lw="strided"),
        "no_rows": mk((0, 64), 5, "contiguous", True),
    }


def quant_cases() -> list[Case]:
    cases = []
    for scheme in SCHEMES:
        d = _WEIGHT_DTYPE[scheme].name
        for name, b in _dequantize(scheme).items():
            cases.append(Case("dequantize", d, f"{scheme}_{name}", b))
        for name, b in _quantized_linear(scheme).items():
            cases.append(Case("quantized_linear", d, f"{scheme}_{name}", b))
    return cases
