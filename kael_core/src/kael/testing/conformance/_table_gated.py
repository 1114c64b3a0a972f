"""Table rows of the gated products op(gate) * up (``silu_mul``, ``gelu_tanh_mul``): one set for both (see ``_table_fused``)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kael.backends import dtypes as dt

from ._cases import Call, operand, vals
from ._layout import Operand, Out

__all__ = ["gated_rows"]

Builder = Callable[[np.random.Generator], Call]
FULL = (dt.float32, dt.float64)


def gated_rows(d: dt.DType) -> dict[str, Builder]:
    """Rows of a gated product op(gate) * up (silu_mul, gelu_tanh_mul): contiguous, transposed, broadcast up,
    a wide range of gates where the activation saturates, empty and 0-d."""

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
