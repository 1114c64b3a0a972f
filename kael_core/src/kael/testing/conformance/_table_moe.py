"""Table rows for the mixture-of-experts fused ops ``moe_route`` and ``expert_linear`` (see ``_table_fused``)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kael.backends import dtypes as dt

from ._cases import FLOATS, Call, operand, vals
from ._layout import Operand, Out

__all__ = ["MOE_BUILDERS"]

Builder = Callable[[np.random.Generator], Call]
FULL = (dt.float32, dt.float64)


def _stat(d: dt.DType) -> dt.DType:
    return dt.float64 if d is dt.float64 else dt.float32


def _moe_route(d: dt.DType) -> dict[str, Builder]:
    def mk(t: int, e: int, k: int, lay: str, normalize: bool) -> Builder:
        def build(rng: np.random.Generator) -> Call:
            logits = operand(rng, (t, e), d, lay)
            return Call([Out((t, k), _stat(d)), Out((t, k), dt.int64), logits, k, normalize])

        return build

    s = {"k2_norm": mk(5, 8, 2, "contiguous", True), "k1": mk(3, 4, 1, "transposed", False)}
    if d in FULL:
        s["k_all"] = mk(4, 6, 6, "strided", True)
        s["decode"] = mk(1, 16, 4, "contiguous", False)
    return s


def _expert_linear(d: dt.DType) -> dict[str, Builder]:
    kind = "halves" if d.itemsize == 2 else "normal"

    def mk(t: int, k: int, e: int, n: int, c: int, lx: str, lw: str = "contiguous") -> Builder:
        def build(rng: np.random.Generator) -> Call:
            small = (t, 1, c) if lx == "broadcast" else None
            x = operand(rng, (t, k, c), d, lx, kind, small=small)
            w = operand(rng, (e, n, c), d, lw, kind)
            experts = Operand(vals(rng, (t, k), dt.int64, f"index:{e}"), dt.int64, "contiguous")
            return Call([Out((t, k, n), d), x, w, experts])

        return build

    s = {"per_token": mk(5, 2, 4, 3, 6, "broadcast"), "per_slot": mk(4, 3, 5, 6, 3, "contiguous")}
    if d in FULL:
        s["x_transposed"] = mk(3, 2, 3, 4, 5, "transposed")
        s["w_strided"] = mk(4, 2, 6, 3, 4, "contiguous", "strided")
        s["one_expert"] = mk(6, 1, 1, 2, 3, "broadcast")
    return s


MOE_BUILDERS: dict[str, tuple[Callable[[dt.DType], dict[str, Builder]], tuple[dt.DType, ...]]] = {
    "moe_route": (_moe_route, FLOATS),
    "expert_linear": (_expert_linear, FLOATS),
}
