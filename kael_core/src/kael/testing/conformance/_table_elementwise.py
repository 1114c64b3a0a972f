"""Table rows for the elementwise ops: copy, fill, arange, where, and every ``Pointwise`` op of the catalogue.

The unary, binary and comparison rows (and those of elementwise fused ops such as silu)
come from ``kael.backends.catalogue``: each op's dtypes, sample value domains,
special-value and in-place samples are read from its ``Pointwise`` entry. Every op runs
over its dtypes with a reduced set of samples, and over the full set (transposed,
strided with offsets, stride-0 broadcasts, strided outputs, in-place aliasing, 3-d
permutes, special values, one large input) for the primary dtypes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from kael.backends import catalogue
from kael.backends import dtypes as dt

from ._cases import DTYPES, FLOATS, NUMERIC, Call, Case, fixed, operand
from ._layout import Alias, Operand, Out

__all__ = ["elementwise_cases", "pointwise_dtypes", "pointwise_kinds"]

PRIMARY = (dt.float32, dt.int32)
LARGE = (257, 1031)
SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 2.5])
SPECIAL_B = np.array([1.0, np.inf, np.nan, -0.0, 0.0, -np.inf, np.inf, -2.0])

Builder = Callable[[np.random.Generator], Call]
_DTYPES: dict[str, tuple[dt.DType, ...]] = {"float": FLOATS, "numeric": NUMERIC, "all": DTYPES, "bool": (dt.bool_,)}


def _spec(op: str) -> catalogue.Pointwise:
    p = catalogue.op(op).pointwise
    assert p is not None, f"{op!r} is not an elementwise op"
    return p


def pointwise_dtypes(op: str) -> tuple[dt.DType, ...]:
    """The dtypes the frontend hands op's kernel."""
    return _DTYPES[_spec(op).dtypes]


def pointwise_kinds(op: str, d: dt.DType) -> tuple[str, ...]:
    """Value kinds for the inputs so every sample is in the op's domain and free of overflow."""
    return _spec(op).kinds(d.category == dt.INTEGER)


def _out_dtype(op: str, d: dt.DType) -> dt.DType:
    return dt.bool_ if _spec(op).bool_out else d


def _samples(op: str, d: dt.DType, nin: int) -> dict[str, Builder]:
    """name -> builder of the Call [out, a] or [out, a, b]."""
    kinds = (pointwise_kinds(op, d) * 2)[:nin]
    od = _out_dtype(op, d)

    def simple(
        shape: tuple[int, ...],
        layouts: tuple[str, ...],
        out_layout: str = "contiguous",
        smalls: tuple[Any, ...] = (None, None),
    ) -> Builder:
        def build(rng: np.random.Generator) -> Call:
            ins = [operand(rng, shape, d, lay, k, sm) for lay, k, sm in zip(layouts, kinds, smalls)]
            return Call([Out(shape, od, out_layout), *ins])

        return build

    full = d in PRIMARY
    s: dict[str, Builder] = {
        "1d": simple((5,), ("contiguous",) * nin),
        "0d": simple((), ("contiguous",) * nin),
        "empty": simple((0,), ("contiguous",) * nin),
        "transposed": simple((3, 4), ("transposed", "contiguous")[:nin]),
        "bcast_row": simple(
            (3, 4),
            ("contiguous", "broadcast")[:nin] if nin == 2 else ("broadcast",),
            smalls=((1, 4), (1, 4)) if nin == 1 else (None, (1, 4)),
        ),
    }
    if _spec(op).inplace and nin == 2:  # the frontend runs Tensor.add_ and friends as kernel(t, t, b)

        def inplace(rng: np.random.Generator) -> Call:
            ins = [operand(rng, (3, 4), d, lay, k) for lay, k in zip(("transposed", "strided"), kinds)]
            return Call([Alias(1), *ins])

        s["inplace"] = inplace
    if full:
        s["empty3d"] = simple((2, 0, 3), ("contiguous",) * nin)
        s["strided"] = simple((3, 4), ("strided", "transposed")[:nin])
        s["out_strided"] = simple((3, 4), ("contiguous",) * nin, out_layout="strided")
        s["permuted3d"] = simple((2, 3, 4), ("transposed", "strided")[:nin])
        s["large"] = simple(LARGE, ("contiguous",) * nin)
        if nin == 2:
            s["bcast_col_scalar"] = simple((3, 4), ("broadcast", "broadcast"), smalls=((3, 1), ()))
            s["bcast_0d_out_strided"] = simple((3, 4), ("contiguous", "broadcast"), "strided", smalls=(None, ()))
    if d in (dt.float32, dt.float64) and _spec(op).special:

        def special(rng: np.random.Generator) -> Call:
            ins = [Operand(SPECIAL, d), Operand(SPECIAL_B, d)][:nin]
            return Call([Out(SPECIAL.shape, od), *ins])

        s["special"] = special
    return s


def _where_samples(d: dt.DType) -> dict[str, Builder]:
    def mk(
        shape: tuple[int, ...],
        lay: tuple[str, str, str],
        smalls: tuple[Any, Any, Any] = (None, None, None),
        out_layout: str = "contiguous",
    ) -> Builder:
        def build(rng: np.random.Generator) -> Call:
            c = operand(rng, shape, dt.bool_, lay[0], small=smalls[0])
            a = operand(rng, shape, d, lay[1], small=smalls[1])
            b = operand(rng, shape, d, lay[2], small=smalls[2])
            return Call([Out(shape, d, out_layout), c, a, b])

        return build

    s = {
        "1d": mk((5,), ("contiguous",) * 3),
        "0d": mk((), ("contiguous",) * 3),
        "empty": mk((0, 3), ("contiguous",) * 3),
        "transposed": mk((3, 4), ("transposed", "contiguous", "strided")),
        "bcast": mk((3, 4), ("broadcast", "contiguous", "broadcast"), ((1, 4), None, ())),
    }
    if d in PRIMARY:
        s["out_strided"] = mk((2, 3, 4), ("strided", "transposed", "contiguous"), out_layout="strided")
        s["large"] = mk(LARGE, ("contiguous",) * 3)
    return s


_COPY_VALUES = {
    "float": [[0.0, 1.0, 2.5], [3.0, 0.25, 7.0]],
    "int": [[0, 1, 2], [3, 0, 7]],
    "bool": [[False, True, True], [True, False, True]],
}
_COPY_NEGATIVE = {"float": [[-3.0, -1.5, 2.0], [4.0, -0.5, 0.0]], "int": [[-3, -1, 2], [4, 0, 0]]}


def _kind(d: dt.DType) -> str:
    return "bool" if d is dt.bool_ else "int" if d.category == 1 else "float"


def _copy_cases() -> list[Case]:
    cases = []
    for src in DTYPES:
        for dst in DTYPES:
            name = f"{src.name}->{dst.name}"

            def values(rng: np.random.Generator, src: dt.DType = src, dst: dt.DType = dst) -> Call:
                v = np.array(_COPY_VALUES[_kind(src)])
                return Call([Out(v.shape, dst), Operand(v, src)])

            cases.append(Case("copy", name, "values", values))
            if (src.is_signed or src.is_floating_point) and (dst.is_signed or dst.is_floating_point):

                def negative(rng: np.random.Generator, src: dt.DType = src, dst: dt.DType = dst) -> Call:
                    v = np.array(_COPY_NEGATIVE[_kind(src)])
                    return Call([Out(v.shape, dst), Operand(v, src)])

                cases.append(Case("copy", name, "negative", negative))
    layouts: dict[str, Callable[[np.random.Generator, dt.DType, dt.DType], Call]] = {
        "0d": lambda r, s, d: Call([Out((), d), operand(r, (), s)]),
        "empty": lambda r, s, d: Call([Out((0, 3), d), operand(r, (0, 3), s)]),
        "transposed": lambda r, s, d: Call([Out((3, 4), d), operand(r, (3, 4), s, "transposed")]),
        "strided_to_strided": lambda r, s, d: Call([Out((2, 3, 4), d, "strided"), operand(r, (2, 3, 4), s, "strided")]),
        "bcast": lambda r, s, d: Call([Out((3, 4), d), operand(r, (3, 4), s, "broadcast", small=(4,))]),
        "bcast_0d": lambda r, s, d: Call([Out((2, 3), d, "strided"), operand(r, (2, 3), s, "broadcast", small=())]),
        "large": lambda r, s, d: Call([Out(LARGE, d), operand(r, LARGE, s, "transposed")]),
    }
    pairs = [
        (dt.float32, dt.float32),
        (dt.float32, dt.float16),
        (dt.float32, dt.bfloat16),
        (dt.bfloat16, dt.float32),
        (dt.int64, dt.float32),
        (dt.float64, dt.int32),
        (dt.bool_, dt.bool_),
        (dt.int8, dt.int64),
    ]

    def bind(fn: Callable[[np.random.Generator, dt.DType, dt.DType], Call], s: dt.DType, d: dt.DType) -> Builder:
        return lambda r: fn(r, s, d)

    for s_, d_ in pairs:
        for sname, fn in layouts.items():
            cases.append(Case("copy", f"{s_.name}->{d_.name}", sname, bind(fn, s_, d_)))

    def bf16_rounding(rng: np.random.Generator) -> Call:
        # ties and near-ties around bfloat16's 8-bit mantissa: round to nearest, ties to even
        v = np.array(
            [1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, 1.0 + 2.0**-8 + 2.0**-20, -(1.0 + 2.0**-8), 65504.0, 3.0e38, -0.0]
        )
        return Call([Out(v.shape, dt.bfloat16), Operand(v, dt.float32)])

    cases.append(Case("copy", "float32->bfloat16", "rounding", bf16_rounding))
    return cases


def _fill_cases() -> list[Case]:
    cases = []
    for d in DTYPES:
        values: list[tuple[str, Any]] = [("int", 3), ("bool", True)]
        if d.category >= 1:
            values.append(("float", 2.5))
        for vname, v in values:
            cases.append(Case("fill", d.name, vname, fixed(Out((2, 3), d), v)))
        cases.append(Case("fill", d.name, "0d", fixed(Out((), d), 1)))
        cases.append(Case("fill", d.name, "empty", fixed(Out((0, 2), d), 1)))
        cases.append(Case("fill", d.name, "out_strided", fixed(Out((3, 4), d, "strided"), 0)))
    return cases


def _arange_cases() -> list[Case]:
    cases = []
    for d in NUMERIC:
        cases.append(Case("arange", d.name, "ints", fixed(Out((7,), d), 2, 3)))
        cases.append(Case("arange", d.name, "empty", fixed(Out((0,), d), 0, 1)))
        if d.is_signed:
            cases.append(Case("arange", d.name, "negative_step", fixed(Out((4,), d), 5, -2)))
        if d.is_floating_point:
            cases.append(Case("arange", d.name, "fractional", fixed(Out((9,), d), 0.5, 0.25)))
    cases.append(
        Case("arange", "float32", "large", fixed(Out((100_000,), dt.float32), -3.0, 0.1, rtol=1e-6, atol=1e-3))
    )
    cases.append(Case("arange", "int64", "large", fixed(Out((100_000,), dt.int64), -7, 3)))
    return cases


def elementwise_cases() -> list[Case]:
    cases: list[Case] = []
    cases += _copy_cases()
    cases += _fill_cases()
    cases += _arange_cases()
    for op in catalogue.POINTWISE_OPS:
        nin = catalogue.op(op).arity[1]
        for d in pointwise_dtypes(op):
            for name, b in _samples(op, d, nin).items():
                cases.append(Case(op, d.name, name, b))
    for d in DTYPES:
        for name, b in _where_samples(d).items():
            cases.append(Case("where", d.name, name, b))
    return cases
