"""Table rows for reductions, matmul and the indexing primitives (gather ... sort)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kael.backends import dtypes as dt

from ._cases import DTYPES, FLOATS, NUMERIC, Call, Case, operand, vals
from ._layout import Operand, Out

__all__ = ["reduction_cases", "matmul_cases", "indexing_cases"]

LARGE = (257, 1031)
Builder = Callable[[np.random.Generator], Call]


def _reduce_out_dtype(op: str, d: dt.DType) -> dt.DType:
    if op in ("sum", "prod"):
        return d if d.is_floating_point else dt.int64
    if op in ("argmax", "argmin"):
        return dt.int64
    if op in ("any", "all"):
        return dt.bool_
    return d


def _kept(shape: tuple[int, ...], dims: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(1 if i in dims else n for i, n in enumerate(shape))


def reduction_cases() -> list[Case]:
    ops: dict[str, tuple[dt.DType, ...]] = {
        "sum": DTYPES,
        "prod": DTYPES,
        "amax": DTYPES,
        "amin": DTYPES,
        "argmax": NUMERIC,
        "argmin": NUMERIC,
        "any": (dt.bool_,),
        "all": (dt.bool_,),
    }
    # name: (shape, dims, layout, broadcast-from shape, full set only)
    samples: dict[str, tuple[tuple[int, ...], tuple[int, ...], str, tuple[int, ...] | None, bool]] = {
        "dim1": ((3, 4, 5), (1,), "contiguous", None, False),
        "dims02": ((3, 4, 5), (0, 2), "contiguous", None, True),
        "all": ((3, 4, 5), (0, 1, 2), "contiguous", None, False),
        "transposed": ((3, 4, 5), (0,), "transposed", None, False),
        "strided": ((3, 4, 5), (2,), "strided", None, True),
        "1d": ((5,), (0,), "contiguous", None, True),
        "size1_dim": ((3, 1, 4), (1,), "contiguous", None, True),
        "bcast": ((3, 4), (0,), "broadcast", (1, 4), True),
        "empty_reduce": ((0, 4), (0,), "contiguous", None, True),
        "empty_keep": ((0, 4), (1,), "contiguous", None, False),
        "large_rows": (LARGE, (1,), "contiguous", None, True),
        "large_cols": (LARGE, (0,), "transposed", None, True),
        "large_all": (LARGE, (0, 1), "contiguous", None, True),
    }
    cases = []
    for op, dtypes in ops.items():
        for d in dtypes:
            full = d in (dt.float32, dt.int32, dt.bool_)
            od = _reduce_out_dtype(op, d)
            for name, (shape, dims, layout, small, full_only) in samples.items():
                if full_only and not full:
                    continue
                if op in ("argmax", "argmin") and len(dims) != 1:
                    continue
                if op in ("amax", "amin", "argmax", "argmin") and name == "empty_reduce":
                    continue
                if op == "prod" and (name.startswith("large") or (name == "all" and not d.is_floating_point)):
                    continue
                large = name.startswith("large")
                if large:
                    kind = "positive"
                elif op == "prod":
                    kind = "unit" if d.is_floating_point else "small"
                else:
                    kind = "normal"
                rtol = (1e-3 if name == "large_all" else 1e-4) if large and op == "sum" else None
                cases.append(Case(op, d.name, name, _reduce_builder(shape, dims, layout, small, d, od, kind, rtol)))
    # a sum into a wider dtype (kael.sum(x, dtype=...)): the output dtype differs from the input's
    for src, dst in ((dt.float16, dt.float32), (dt.bfloat16, dt.float32), (dt.int32, dt.float64), (dt.bool_, dt.int32)):
        cases.append(
            Case(
                "sum",
                f"{src.name}->{dst.name}",
                "acc_dtype",
                _reduce_builder((4, 6), (1,), "contiguous", None, src, dst, "normal", None),
            )
        )
    return cases


def _reduce_builder(
    shape: tuple[int, ...],
    dims: tuple[int, ...],
    layout: str,
    small: tuple[int, ...] | None,
    d: dt.DType,
    od: dt.DType,
    kind: str,
    rtol: float | None,
) -> Builder:
    def build(rng: np.random.Generator) -> Call:
        a = operand(rng, shape, d, layout, kind, small)
        return Call([Out(_kept(shape, dims), od), a, dims], rtol=rtol, atol=None if rtol is None else 1e-2)

    return build


def matmul_cases() -> list[Case]:
    # name: (a shape, b shape, a layout, b layout, full set only); batch dims already broadcast
    samples: dict[str, tuple[tuple[int, ...], tuple[int, ...], str, str, bool]] = {
        "2d": ((3, 4), (4, 5), "contiguous", "contiguous", False),
        "a_transposed": ((3, 4), (4, 5), "transposed", "contiguous", False),
        "b_transposed": ((3, 4), (4, 5), "contiguous", "transposed", False),
        "strided": ((3, 4), (4, 2), "strided", "strided", True),
        "batched": ((2, 3, 4), (2, 4, 5), "contiguous", "contiguous", False),
        "batch_bcast": ((2, 3, 4), (2, 4, 5), "contiguous", "broadcast", False),
        "4d_transposed": ((2, 2, 3, 4), (2, 2, 4, 2), "strided", "transposed", True),
        "m0": ((0, 4), (4, 5), "contiguous", "contiguous", True),
        "n0": ((3, 4), (4, 0), "contiguous", "contiguous", True),
        "vecvec": ((1, 5), (5, 1), "contiguous", "contiguous", True),
    }
    cases = []
    for d in NUMERIC:
        full = d in (dt.float32, dt.int64)
        kind = "small" if d.category == 1 else "halves" if d.itemsize == 2 else "normal"
        for name, (sa, sb, la, lb, full_only) in samples.items():
            if full_only and not full:
                continue

            def build(
                rng: np.random.Generator,
                sa: tuple[int, ...] = sa,
                sb: tuple[int, ...] = sb,
                la: str = la,
                lb: str = lb,
                d: dt.DType = d,
                kind: str = kind,
            ) -> Call:
                a = operand(rng, sa, d, la, kind)
                b = operand(rng, sb, d, lb, kind, small=(1,) + sb[1:])
                return Call([Out(sa[:-1] + sb[-1:], d), a, b])

            cases.append(Case("matmul", d.name, name, build))

    def large(rng: np.random.Generator) -> Call:
        a = operand(rng, (128, 256), dt.float32)
        b = operand(rng, (256, 64), dt.float32, "transposed")
        return Call([Out((128, 64), dt.float32), a, b], rtol=1e-5, atol=1e-4)

    cases.append(Case("matmul", "float32", "large", large))
    return cases


def _gather_cases(d: dt.DType, full: bool) -> list[Case]:
    # name: (a shape, index shape, dim, a layout, index layout)
    samples = {
        "dim1": ((3, 5), (3, 2), 1, "contiguous", "contiguous"),
        "dim0": ((3, 5), (2, 5), 0, "contiguous", "contiguous"),
        "transposed": ((3, 5), (3, 4), 1, "transposed", "transposed"),
        "smaller_index": ((3, 5), (2, 2), 1, "strided", "contiguous"),
        "3d": ((2, 3, 4), (2, 3, 2), 2, "transposed", "strided"),
    }
    cases = []
    for name, (sa, si, dim, la, li) in samples.items():
        if not full and name not in ("dim1", "transposed"):
            continue

        def build(
            rng: np.random.Generator,
            sa: tuple[int, ...] = sa,
            si: tuple[int, ...] = si,
            dim: int = dim,
            la: str = la,
            li: str = li,
        ) -> Call:
            a = operand(rng, sa, d, la)
            idx = Operand(vals(rng, si, dt.int64, f"index:{sa[dim]}"), dt.int64, li)
            return Call([Out(si, d), a, idx, dim])

        cases.append(Case("gather", d.name, name, build))
    return cases


def _index_select_cases(d: dt.DType, full: bool) -> list[Case]:
    samples = {
        "dim0": ((5, 3), [4, 0, 0, 2], 0, "contiguous", "contiguous"),
        "dim1": ((5, 3), [2, 0], 1, "transposed", "contiguous"),
        "3d": ((2, 4, 3), [3, 3, 1], 1, "strided", "strided"),
    }
    cases = []
    for name, (sa, idx_values, dim, la, li) in samples.items():
        if not full and name == "3d":
            continue

        def build(
            rng: np.random.Generator,
            sa: tuple[int, ...] = sa,
            iv: list[int] = idx_values,
            dim: int = dim,
            la: str = la,
            li: str = li,
        ) -> Call:
            a = operand(rng, sa, d, la)
            out_shape = sa[:dim] + (len(iv),) + sa[dim + 1 :]
            return Call([Out(out_shape, d), a, Operand(np.array(iv, np.int64), dt.int64, li), dim])

        cases.append(Case("index_select", d.name, name, build))
    if d is dt.float32:

        def large(rng: np.random.Generator) -> Call:
            a = operand(rng, (1000, 64), d)
            idx = Operand(vals(rng, (500,), dt.int64, "index:1000"), dt.int64)
            return Call([Out((500, 64), d), a, idx, 0])

        cases.append(Case("index_select", d.name, "large", large))
    return cases


def _accumulate_cases(d: dt.DType, full: bool) -> list[Case]:
    """index_add and scatter_add: outputs start with values; duplicate indices must accumulate."""
    kind = "small" if d.category == 1 else "halves"
    cases = []
    ia = {
        "dim0": ((5, 3), [0, 2, 0, 4], 0, "contiguous"),
        "dim1": ((3, 5), [1, 1, 4], 1, "transposed"),
    }
    for name, (so, iv, dim, ls) in ia.items():

        def build(
            rng: np.random.Generator, so: tuple[int, ...] = so, iv: list[int] = iv, dim: int = dim, ls: str = ls
        ) -> Call:
            ss = so[:dim] + (len(iv),) + so[dim + 1 :]
            out = Out(so, d, init=vals(rng, so, d, kind))
            return Call([out, Operand(np.array(iv, np.int64), dt.int64), operand(rng, ss, d, ls, kind), dim])

        cases.append(Case("index_add", d.name, name, build))
    sa = {
        "dim1": ((3, 5), (3, 4), 1, "contiguous"),
        "dim0": ((4, 3), (2, 3), 0, "transposed"),
    }
    for name, (so, si, dim, ls) in sa.items():

        def build2(
            rng: np.random.Generator, so: tuple[int, ...] = so, si: tuple[int, ...] = si, dim: int = dim, ls: str = ls
        ) -> Call:
            out = Out(so, d, init=vals(rng, so, d, kind))
            idx = Operand(vals(rng, si, dt.int64, f"index:{so[dim]}"), dt.int64)
            return Call([out, idx, operand(rng, si, d, ls, kind), dim])

        cases.append(Case("scatter_add", d.name, name, build2))
    return cases


def _cat_cases(d: dt.DType, full: bool) -> list[Case]:
    def build0(rng: np.random.Generator) -> Call:
        parts = [
            operand(rng, (2, 3), d),
            operand(rng, (4, 3), d, "transposed"),
            operand(rng, (0, 3), d),
            operand(rng, (1, 3), d, "strided"),
        ]
        return Call([Out((7, 3), d), parts, 0])

    def build1(rng: np.random.Generator) -> Call:
        parts = [
            operand(rng, (2, 3, 1), d, "strided"),
            operand(rng, (2, 3, 2), d, "transposed"),
            operand(rng, (2, 3, 2), d, "broadcast", small=(1, 3, 2)),
        ]
        return Call([Out((2, 3, 5), d, "strided" if full else "contiguous"), parts, 2])

    def build_single(rng: np.random.Generator) -> Call:
        return Call([Out((4,), d), [operand(rng, (4,), d)], 0])

    return [
        Case("cat", d.name, "dim0", build0),
        Case("cat", d.name, "dim_last", build1),
        Case("cat", d.name, "single", build_single),
    ]


def _nonzero_cases() -> list[Case]:
    samples = {
        "1d": ((7,), "contiguous"),
        "2d": ((3, 4), "contiguous"),
        "transposed": ((3, 4), "transposed"),
        "3d_strided": ((2, 3, 4), "strided"),
        "all_true": ((2, 2), "contiguous"),
    }
    cases = []
    for name, (shape, layout) in samples.items():

        def build(
            rng: np.random.Generator, shape: tuple[int, ...] = shape, layout: str = layout, name: str = name
        ) -> Call:
            m = np.ones(shape, bool) if name == "all_true" else vals(rng, shape, dt.bool_)
            if not m.any():
                m.flat[0] = True
            return Call([Out((int(m.sum()), m.ndim), dt.int64), Operand(m, dt.bool_, layout)])

        cases.append(Case("nonzero", "bool", name, build))
    return cases


def _sort_cases(d: dt.DType, full: bool) -> list[Case]:
    kind = "halves" if d.is_floating_point else "normal"
    samples = {
        "dim1_asc": ((3, 6), 1, False, "contiguous"),
        "dim1_desc": ((3, 6), 1, True, "contiguous"),
        "dim0_desc": ((5, 3), 0, True, "transposed"),
        "1d_asc": ((9,), 0, False, "strided"),
    }
    cases = []
    for name, (shape, dim, desc, layout) in samples.items():
        if not full and name == "1d_asc":
            continue

        def build(
            rng: np.random.Generator,
            shape: tuple[int, ...] = shape,
            dim: int = dim,
            desc: bool = desc,
            layout: str = layout,
        ) -> Call:
            return Call([Out(shape, d), Out(shape, dt.int64), operand(rng, shape, d, layout, kind), dim, desc])

        cases.append(Case("sort", d.name, name, build))
    return cases


def indexing_cases() -> list[Case]:
    cases: list[Case] = []
    for d in DTYPES:
        full = d in (dt.float32, dt.int64)
        cases += _gather_cases(d, full)
        cases += _index_select_cases(d, full)
        cases += _cat_cases(d, full)
    for d in (dt.float32, dt.float64, dt.float16, dt.bfloat16, dt.int64, dt.int32):
        cases += _accumulate_cases(d, d in (dt.float32, dt.int64))
    for d in NUMERIC:
        cases += _sort_cases(d, d in (dt.float32, dt.int64))
    cases += _nonzero_cases()
    return cases


_ = FLOATS
