"""Table rows for the Gemma family's fused ops: gelu_tanh_mul (GeGLU) and softcap.

gelu_tanh_mul's rows are silu_mul's (``_table_gated.gated_rows``); softcap's take caps of Gemma 2's sizes
(50 for attention scores, 30 for final logits) over scores of that size, a small cap
(values deep in the tanh's flat tails) and strided inputs and outputs.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kael.backends import dtypes as dt

from ._cases import FLOATS, Call, vals
from ._layout import Operand, Out
from ._table_gated import gated_rows

__all__ = ["GEMMA_BUILDERS"]

Builder = Callable[[np.random.Generator], Call]
FULL = (dt.float32, dt.float64)


def _softcap(d: dt.DType) -> dict[str, Builder]:
    def mk(shape: tuple[int, ...], lay: str, cap: float, scale: float, out: str = "contiguous") -> Builder:
        def build(rng: np.random.Generator) -> Call:
            return Call([Out(shape, d, out), Operand(vals(rng, shape, d) * scale, d, lay), cap])

        return build

    s = {
        "scores_cap50": mk((2, 3, 4, 4), "contiguous", 50.0, 40.0),
        "logits_cap30": mk((2, 17), "transposed", 30.0, 25.0),
    }
    if d in FULL:
        s["small_cap"] = mk((5, 6), "contiguous", 0.25, 3.0)
        s["strided_out"] = mk((3, 4), "strided", 2.0, 2.0, out="strided")
        s["empty"] = mk((0, 3), "contiguous", 1.0, 1.0)
        s["0d"] = mk((), "contiguous", 3.0, 2.0)
    if d is dt.float32:
        s["large"] = mk((64, 1031), "contiguous", 30.0, 30.0)
    return s


GEMMA_BUILDERS: dict[str, tuple[Callable[[dt.DType], dict[str, Builder]], tuple[dt.DType, ...]]] = {
    "gelu_tanh_mul": (gated_rows, FLOATS),
    "softcap": (_softcap, FLOATS),
}
