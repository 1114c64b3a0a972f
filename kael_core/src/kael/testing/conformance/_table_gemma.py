"""Table rows for the Gemma family's fused ops: gelu_tanh_mul (GeGLU) and softcap.

gelu_tanh_mul's rows mirror silu_mul's (contiguous, transposed, broadcast up, a wide range
of gates where the tanh saturates, empty and 0-d); softcap's take caps of Gemma 2's sizes
(50 for attention scores, 30 for final logits) over scores of that size, a small cap
(values deep in the tanh's flat tails) and strided inputs and outputs.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kael.backends import dtypes as dt

from ._cases import FLOATS, Call, operand, vals
from ._layout import Operand, Out

__all__ = ["GEMMA_BUILDERS"]

Builder = Callable[[np.random.Generator], Call]
FULL = (dt.float32, dt.float64)


def _gelu_tanh_mul(d: dt.DType) -> dict[str, Builder]:
    def mk(
        shape: tuple[int, ...], lg: str, lu: str, small: tuple[int, ...] | None = None, scale: float = 1.0
    ) -> Builder:
        def build(rng: np.random.Generator) -> Call:
            g = Operand(vals(rng, shape, d) * scale, d, lg)
            u = operand(rng, shape, d, lu, small=small)
            return Call([Out(shape, d), g, u])

        return build

    s = {"2d": mk((4, 6), "contiguous", "contiguous"), "decode": mk((2, 1, 8), "contiguous", "strided")}
    if d in FULL:
        s["transposed"] = mk((3, 5), "transposed", "contiguous")
        s["broadcast_up"] = mk((3, 4), "strided", "broadcast", small=(1, 4))
        s["wide_range"] = mk((4, 5), "contiguous", "transposed", scale=20.0)
        s["empty"] = mk((0, 4), "contiguous", "contiguous")
        s["0d"] = mk((), "contiguous", "contiguous")
    if d is dt.float32:
        s["large"] = mk((64, 1031), "contiguous", "contiguous")
    return s


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
    "gelu_tanh_mul": (_gelu_tanh_mul, FLOATS),
    "softcap": (_softcap, FLOATS),
}
