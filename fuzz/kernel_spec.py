"""How fuzz_kernels reads a kernel call out of fuzz bytes: op, dtypes, shape, layouts, values.

The bytes are consumed in order by a `Reader` (a missing byte reads as 0, so any input,
even an empty one, decodes to a valid call and all-zero bytes mean "defaults"):

    op, dtype, flags, ndim, dims..., [family attributes], then per tensor argument
    a layout (dim order, per-dim step or broadcast, storage offset), a 4-byte value seed,
    and, in raw mode, the values' bytes themselves.

flags: bit 0 raw values (the operands' storage bytes come from the input: NaN, inf,
INT_MIN, zero divisors, any bit pattern) instead of well-behaved values from the seed;
bit 1 in place (the output is the first input, for ops the frontend runs in place).

`decode` returns a `KernelCase`: the kernel's positional arguments as `Tensor` specs
(logical shape, dtype, layout, role) and plain Python values, in the order of the op's
catalogue signature (kael.backends.catalogue).

The elementwise ops, their dtypes, value domains, in-place use and bit-exactness come from
the catalogue's `Pointwise` entries: an elementwise op added to the catalogue is fuzzed
with no change here (fused ones, such as silu, at the end of OPS; they are skipped for a
backend that does not implement them).

The weight-format ops (``dequantize``, ``quantized_linear``; NOTE [weight formats] in
kael/quant/_formats.py) read, after the flags, the scheme (from ``QUANT_SCHEMES``: every
scheme of the format registry, in GGML type id order, so a format added to the registry is
fuzzed with no change here and the saved inputs keep their schemes), N (0..40: the CPU
backend's 16-row slabs and their tails), the number of blocks a row holds (K = 0..3 blocks
of the format's values; bf16 / f16: 0..3 times 32 values, less the weight byte's bits 1-5)
and a weight byte (bit 0: the tame weight's blocks are the reference quantizer's bytes of
normal values, else random blocks that decode to moderate finite values); quantized_linear then reads x's rows (0..20: the few-row path up to 16 and the
prompt path above), x's shape ([M, K], [K], or [2, M/2, K]) and options (bit 0 a bias,
bits 1-2 KAEL_REPACK for the two runs of the backend's default path). In raw mode the weight
holds any bytes (inf/NaN scales): dequantize is exact on any bits and is compared bit for bit;
quantized_linear's values are then not compared (fuzz_kernels still checks its default path's
determinism and batch invariance).

The committed seeds and regressions are in this encoding: append to OPS and to the dtype
lists, never reorder them, or the saved inputs decode to other calls (the catalogue keeps
its families in order and new ops go at their ends).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from kael.backends import catalogue
from kael.backends import dtypes as dt
from kael.backends.catalogue import BINARY_OPS, COMPARE_OPS, POINTWISE_FUSED, POINTWISE_OPS, UNARY_OPS
from kael.quant import SCHEMES, quantizable
from kael.quant.formats import FORMATS

__all__ = [
    "OPS",
    "QUANT",
    "QUANT_SCHEMES",
    "KernelCase",
    "Layout",
    "Reader",
    "TensorSpec",
    "decode",
    "encode_case",
    "encode_quant",
]

FLOATS = (dt.float32, dt.float64, dt.float16, dt.bfloat16)
INTS = (dt.int32, dt.int64, dt.uint8, dt.int8, dt.int16)
NUMERIC = FLOATS + INTS
ALL = (*NUMERIC, dt.bool_)
REDUCE = ("sum", "prod", "amax", "amin", "argmax", "argmin", "any", "all")
FUSED = ("softmax", "log_softmax", "layer_norm", "gelu")
STRUCTURED = ("copy", "fill", "arange", "where", "matmul", "cat", "index_select", "gather")
QUANT = ("dequantize", "quantized_linear")
# The encoding ended with silu (the catalogue's first fused elementwise op) when QUANT was appended:
# fused elementwise ops the catalogue gains later go after QUANT, so no saved input changes op.
OPS: tuple[str, ...] = (
    *(*BINARY_OPS, *UNARY_OPS, *COMPARE_OPS, *STRUCTURED, *REDUCE, *FUSED, *POINTWISE_FUSED[:1]),
    *(*QUANT, *POINTWISE_FUSED[1:]),
)
QUANT_SCHEMES: tuple[str, ...] = tuple(sorted(SCHEMES, key=lambda s: FORMATS[s].ggml_type))
"""The weight schemes of the format registry by GGML type id (new GGML types get new, larger ids)."""
MAX_QUANT_N = 40
"""quantized ops: weight rows 0..40 (the CPU backend's 16-row slabs, with tails)."""
MAX_QUANT_ROWS = 20
"""quantized_linear: rows of x 0..20 (the few-row path up to 16, the prompt path above)."""
_POINTWISE_DTYPES = {"float": FLOATS, "numeric": NUMERIC, "all": ALL, "bool": (dt.bool_,)}


def _pointwise(op: str) -> catalogue.Pointwise:
    p = catalogue.op(op).pointwise
    assert p is not None
    return p


#: ops the frontend runs in place as kernel(t, t, b) (Tensor.add_ and friends)
INPLACE = frozenset(op for op in BINARY_OPS if _pointwise(op).inplace)


class Reader:
    """Bytes consumed front to back; reading past the end gives zeros."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def byte(self) -> int:
        b = self.data[self.pos] if self.pos < len(self.data) else 0
        self.pos += 1
        return b

    def pick(self, options: Any) -> Any:
        return options[self.byte() % len(options)]

    def size(self) -> int:
        """A dimension: mostly 0..8; sometimes up to ~200, long enough for vectorised loops and tails."""
        b = self.byte()
        return b % 9 if b < 240 else 9 + (b - 240) * 13

    def rest(self) -> bytes:
        out = self.data[self.pos :] if self.pos < len(self.data) else b""
        self.pos = len(self.data)
        return out


@dataclass(frozen=True)
class Layout:
    """Where a tensor's elements sit in its buffer.

    `order` lists the dims from outermost to innermost in memory; `steps[d]` spaces
    consecutive elements of dim d (1 = dense, 2-3 = gaps; 0 = broadcast, stride 0);
    `offset` is the storage offset in elements.
    """

    order: tuple[int, ...]
    steps: tuple[int, ...]
    offset: int

    def strides(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        strides = [0] * len(shape)
        acc = 1
        for d in reversed(self.order):
            if self.steps[d] == 0:
                continue
            strides[d] = acc * self.steps[d]
            acc *= max(shape[d], 1) * self.steps[d]
        return tuple(strides)

    @staticmethod
    def dense(ndim: int) -> Layout:
        return Layout(tuple(range(ndim)), (1,) * ndim, 0)


@dataclass(frozen=True)
class TensorSpec:
    """A tensor argument: `role` is "in" (an operand), "out" (preallocated), or "index" (int64, in range)."""

    shape: tuple[int, ...]
    dtype: dt.DType
    layout: Layout
    role: str = "in"
    kind: str = "normal"  # value kind for well-behaved values (kael.testing.conformance.vals; weights: see _quant)
    bound: int = 0  # indices: values in 0..bound-1

    def describe(self) -> str:
        lay = self.layout
        blocks = {"blocks": " (random blocks)", "quantized": " (quantized blocks)"}.get(self.kind, "")
        return (
            f"{self.role} {self.dtype.name}{list(self.shape)}{blocks} strides {lay.strides(self.shape)} "
            f"offset {lay.offset}"
        )


@dataclass
class KernelCase:
    op: str
    dtype: dt.DType
    args: list[Any]  # TensorSpec, list[TensorSpec] (cat), or plain values
    raw: bool = False
    alias: bool = False  # args[0] (the output) is args[1] (the first input) itself
    seed: int = 0
    values: bytes = b""
    exact: bool = field(default=False)  # raw mode: whether values are compared (ops exact on any bits)
    repack: tuple[bool, bool] = (True, True)  # quantized_linear: KAEL_REPACK for the default path's two runs

    def describe(self) -> str:
        parts = []
        for a in self.args:
            if isinstance(a, TensorSpec):
                parts.append(a.describe())
            elif isinstance(a, list):
                parts.append("[" + ", ".join(t.describe() for t in a) + "]")
            else:
                parts.append(repr(a))
        mode = "raw" if self.raw else "tame"
        if self.op == "quantized_linear":
            mode += ", KAEL_REPACK " + "/".join(str(int(p)) for p in self.repack)
        return f"{self.op} ({self.dtype.name}, {mode}{', in place' if self.alias else ''}): " + "; ".join(parts)


def _layout(r: Reader, ndim: int, broadcast: bool) -> Layout:
    orders = list(itertools.permutations(range(ndim)))
    order = orders[r.byte() % len(orders)]
    code = r.byte()
    steps = []
    for d in range(ndim):
        c = (code >> (2 * (d % 4))) & 3
        steps.append(0 if c == 3 and broadcast else (1, 1, 2, 3)[c])
    return Layout(order, tuple(steps), r.byte() % 4)


def _dtypes(op: str) -> tuple[dt.DType, ...]:
    if op in POINTWISE_OPS:
        return _POINTWISE_DTYPES[_pointwise(op).dtypes]
    if op in FUSED:
        return FLOATS
    if op in QUANT:
        return (dt.float32,)  # x, bias and out; the weight's storage follows the scheme
    if op in ("copy", "fill", "where", "cat", "index_select", "gather", "sum", "prod", "amax", "amin", "any", "all"):
        return ALL
    return NUMERIC


def _kinds(op: str, d: dt.DType) -> tuple[str, str]:
    """Value kinds for (a, b) that keep well-behaved values in the op's domain (the catalogue's, as the conformance table)."""
    ka, kb = (_pointwise(op).kinds(d.category == dt.INTEGER) * 2)[:2]
    return ka, kb


def _reduce_out(op: str, d: dt.DType) -> dt.DType:
    if op in ("argmax", "argmin"):
        return dt.int64
    if op in ("any", "all"):
        return dt.bool_
    if op in ("sum", "prod") and d in (dt.bool_, dt.uint8, dt.int8, dt.int16, dt.int32):
        return dt.int64
    return d


class _Builder:
    """Makes the TensorSpecs of one case, each with a layout read from the input."""

    def __init__(self, r: Reader) -> None:
        self.r = r

    def tensor(
        self,
        shape: tuple[int, ...],
        d: dt.DType,
        role: str = "in",
        kind: str = "normal",
        bound: int = 0,
        broadcast: bool = True,
    ) -> TensorSpec:
        layout = _layout(self.r, len(shape), broadcast=broadcast and role == "in")
        strides = layout.strides(shape)
        if sum((n - 1) * s for n, s in zip(shape, strides) if n) > MAX_EXTENT:  # gaps multiply: keep buffers small
            layout = Layout(layout.order, tuple(min(s, 1) for s in layout.steps), layout.offset)
        return TensorSpec(shape, d, layout, role, kind, bound)


MAX_NUMEL = 1 << 14
"""Shapes are cut down to this many elements: big enough for vector loops and tails, fast to check."""
MAX_EXTENT = 1 << 17
"""Layouts whose gaps would spread a tensor over more elements than this become dense."""


def _shape(r: Reader, min_ndim: int = 0) -> tuple[int, ...]:
    ndim = min_ndim + r.byte() % (5 - min_ndim)
    shape = [r.size() for _ in range(ndim)]
    while _numel(shape) > MAX_NUMEL:
        big = shape.index(max(shape))
        shape[big] = shape[big] % 9
    return tuple(shape)


def _numel(shape: Any) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _elementwise(op: str, d: dt.DType, r: Reader, b: _Builder, case: KernelCase) -> None:
    shape = _shape(r)
    ka, kb = _kinds(op, d)
    spec = _pointwise(op)
    out_dtype = dt.bool_ if spec.bool_out else d
    if catalogue.op(op).arity[1] == 1:
        case.args = [b.tensor(shape, out_dtype, "out"), b.tensor(shape, d, kind=ka)]
    else:
        case.args = [b.tensor(shape, out_dtype, "out"), b.tensor(shape, d, kind=ka), b.tensor(shape, d, kind=kb)]
    case.exact = spec.exact == "all" or (spec.exact == "ints" and d.category != dt.FLOATING)
    if case.alias:
        a = case.args[1]
        case.args[1] = TensorSpec(
            a.shape,
            a.dtype,
            Layout(a.layout.order, tuple(max(s, 1) for s in a.layout.steps), a.layout.offset),
            "in",
            a.kind,
        )


def _structured(op: str, d: dt.DType, r: Reader, b: _Builder, case: KernelCase) -> None:
    if op == "copy":
        src = r.pick(ALL)
        shape = _shape(r)
        case.args = [b.tensor(shape, d, "out"), b.tensor(shape, src)]
        # float -> int of NaN or out-of-range values: defined (no UB) but not NumPy's value for
        # every width, so raw mode compares only casts that are exact on any bits
        case.exact = src == d or (src.category != 2 and d.category != 2)
    elif op == "fill":
        shape = _shape(r)
        value: bool | int | float
        if d is dt.bool_:
            value = bool(r.byte() & 1)
        elif d.category == 1:
            value = r.byte() - (128 if d.is_signed else 0)
        else:
            value = (r.byte() - 128) / 8.0
        case.args = [b.tensor(shape, d, "out"), value]
        case.exact = True
    elif op == "arange":
        n = r.size()
        start, step = r.byte() - 128, r.byte() % 7 - 3
        if d.category == 2:
            start, step = start / 4, step / 4  # type: ignore[assignment]
        case.args = [TensorSpec((n,), d, Layout.dense(1), "out"), start, step]
        case.exact = True
    elif op == "where":
        shape = _shape(r)
        case.args = [b.tensor(shape, d, "out"), b.tensor(shape, dt.bool_), b.tensor(shape, d), b.tensor(shape, d)]
        case.exact = True
    elif op == "matmul":
        dims = [r.size() for _ in range(r.byte() % 3)]
        dims += [r.size(), r.size(), r.size()]
        while _numel([max(d, 1) for d in dims]) > 4 * MAX_NUMEL:  # bounds every operand and the work
            big = dims.index(max(dims))
            dims[big] = dims[big] % 9
        *batch_dims, m, k, n = dims
        batch = tuple(batch_dims)
        case.args = [b.tensor((*batch, m, n), d, "out"), b.tensor((*batch, m, k), d), b.tensor((*batch, k, n), d)]
    elif op == "cat":
        base = list(_shape(r, min_ndim=1))
        dim = r.byte() % len(base)
        sizes = [r.size() for _ in range(1 + r.byte() % 3)]
        others = [i for i in range(len(base)) if i != dim]
        # a 0 along dim leaves _shape's bound on the rest void: bound the output here
        while max(sum(sizes), 1) * _numel([max(base[i], 1) for i in others]) > 4 * MAX_NUMEL:
            big = max(others, key=lambda i: base[i])
            base[big] //= 2
        parts = [tuple(base[:dim] + [n] + base[dim + 1 :]) for n in sizes]
        total = list(base)
        total[dim] = sum(sizes)
        case.args = [b.tensor(tuple(total), d, "out"), [b.tensor(p, d) for p in parts], dim]
        case.exact = True
    elif op == "index_select":
        shape = _shape(r, min_ndim=1)
        dim = r.byte() % len(shape)
        length = r.size() if shape[dim] else 0
        out_shape = shape[:dim] + (length,) + shape[dim + 1 :]
        index = b.tensor((length,), dt.int64, "index", bound=shape[dim])
        case.args = [b.tensor(out_shape, d, "out"), b.tensor(shape, d), index, dim]
        case.exact = True
    elif op == "gather":
        shape = _shape(r, min_ndim=1)
        dim = r.byte() % len(shape)
        index_shape = tuple(
            (r.size() if shape[dim] else 0) if i == dim else r.byte() % (s + 1) for i, s in enumerate(shape)
        )
        index = b.tensor(index_shape, dt.int64, "index", bound=shape[dim])
        case.args = [b.tensor(index_shape, d, "out"), b.tensor(shape, d), index, dim]
        case.exact = True


def _reduce(op: str, d: dt.DType, r: Reader, b: _Builder, case: KernelCase) -> None:
    shape = _shape(r, min_ndim=1 if op in ("argmax", "argmin") else 0)
    mask = r.byte()
    if op in ("argmax", "argmin"):
        dims: tuple[int, ...] = (mask % len(shape),)
    else:
        dims = tuple(i for i in range(len(shape)) if mask >> i & 1)
    if op in ("amax", "amin", "argmax", "argmin"):  # no identity: reduced dims must not be empty
        grown = [max(s, 1) if i in dims else s for i, s in enumerate(shape)]
        while _numel(grown) > MAX_NUMEL:  # a 0 made into 1 lifts _shape's bound on the other dims
            big = grown.index(max(grown))
            grown[big] = max(grown[big] % 9, 1 if big in dims else 0)
        shape = tuple(grown)
    out_shape = tuple(1 if i in dims else s for i, s in enumerate(shape))
    case.args = [b.tensor(out_shape, _reduce_out(op, d), "out"), b.tensor(shape, d), dims]
    case.exact = op in ("amax", "amin", "argmax", "argmin", "any", "all") and d.category != 2


def _fused(op: str, d: dt.DType, r: Reader, b: _Builder, case: KernelCase) -> None:
    shape = _shape(r, min_ndim=1)
    if op in ("softmax", "log_softmax"):
        case.args = [b.tensor(shape, d, "out"), b.tensor(shape, d), r.byte() % len(shape)]
    elif op == "gelu":
        case.args = [b.tensor(shape, d, "out"), b.tensor(shape, d), r.pick(("tanh", "none"))]
    elif op == "layer_norm":
        stat = dt.float64 if d is dt.float64 else dt.float32
        flags = r.byte()
        c = shape[-1:]
        weight = b.tensor(c, d) if flags & 1 else None
        bias = b.tensor(c, d) if flags & 2 else None
        case.args = [
            b.tensor(shape, d, "out"),
            b.tensor(shape[:-1], stat, "out"),
            b.tensor(shape[:-1], stat, "out"),
            b.tensor(shape, d),
            weight,
            bias,
            (1e-5, 1e-3, 0.5)[flags >> 2 & 3 if flags >> 2 & 3 < 3 else 0],
        ]


def _quant(op: str, r: Reader, b: _Builder, case: KernelCase) -> None:
    scheme = r.pick(QUANT_SCHEMES)
    fmt = FORMATS[scheme]
    n = r.byte() % (MAX_QUANT_N + 1)
    blocks = (1, 2, 3, 1, 2, 3, 0)[r.byte() % 7]
    wbyte = r.byte()
    if fmt.blocked:
        k = blocks * fmt.block_values
        # tame blocks: the reference quantizer's bytes of normal values, or random moderate blocks
        kind = "quantized" if wbyte & 1 and scheme in quantizable() else "blocks"
        wshape, wdtype = (n, fmt.row_bytes(k)), dt.uint8
    else:  # bf16 / f16 [N, K]: K up to 3 vectors of 32, less a tail of 0..31
        k = max(0, 32 * blocks - (wbyte >> 1) % 32)
        kind = "normal"
        wshape, wdtype = (n, k), dt.BY_NAME[{"bf16": "bfloat16", "f16": "float16"}[scheme]]
    if case.raw:
        kind = "normal"  # any bytes
    if op == "dequantize":
        out = b.tensor((n, k), dt.float32, "out")
        # a broadcast would let one byte stand for many, which tame blocks cannot keep valid
        case.args = [out, b.tensor(wshape, wdtype, kind=kind, broadcast=case.raw), scheme]
        case.exact = True  # every backend decodes with one rounding per value: bit for bit, on any bytes
        return
    m = r.byte() % (MAX_QUANT_ROWS + 1)
    form = r.byte() % 3
    lead: tuple[int, ...] = ((m,), (), (2, m // 2))[form]
    options = r.byte()
    case.repack = (bool(options & 2), bool(options & 4))
    out = b.tensor((*lead, n), dt.float32, "out")
    x = b.tensor((*lead, k), dt.float32, kind="unit")
    weight = b.tensor(wshape, wdtype, kind=kind, broadcast=case.raw)
    bias = b.tensor((n,), dt.float32) if options & 1 else None
    case.args = [out, x, weight, bias, scheme]
    case.exact = False  # float32 sums in a backend's order: compared within the conformance tolerance, tame only


def decode(data: bytes) -> KernelCase:
    """The kernel call that `data` stands for (every input decodes to one)."""
    r = Reader(data)
    op = r.pick(OPS)
    d = r.pick(_dtypes(op))
    flags = r.byte()
    case = KernelCase(op, d, [], raw=bool(flags & 1), alias=bool(flags & 2))
    b = _Builder(r)
    if op in POINTWISE_OPS:
        _elementwise(op, d, r, b, case)
    elif op in STRUCTURED:
        _structured(op, d, r, b, case)
    elif op in REDUCE:
        _reduce(op, d, r, b, case)
    elif op in QUANT:
        _quant(op, r, b, case)
    else:
        _fused(op, d, r, b, case)
    case.alias = case.alias and op in INPLACE
    case.seed = int.from_bytes(bytes(r.byte() for _ in range(4)), "little")
    case.values = r.rest()
    return case


_MIN_NDIM = {"cat": 1, "index_select": 1, "gather": 1, "argmax": 1, "argmin": 1, **dict.fromkeys(FUSED, 1)}


def encode_case(
    op: str,
    dtype: str,
    shape: tuple[int, ...] = (),
    *,
    raw: bool = False,
    inplace: bool = False,
    prefix: bytes = b"",
    extra: bytes = b"",
) -> bytes:
    """Bytes that decode to `op` on `dtype` with `shape` (dims below 9).

    `prefix` holds the bytes read before the shape (copy: the source dtype's index in ALL;
    matmul, arange and the weight-format ops read no shape: give their bytes here, or use
    `encode_quant`), `extra` those after it
    (attributes, then each tensor's three layout bytes; zeros mean dense layouts).
    """
    d = dt.BY_NAME[dtype]
    head = bytes([OPS.index(op), _dtypes(op).index(d), int(raw) | 2 * int(inplace)]) + prefix
    if op in ("matmul", "arange", *QUANT):
        return head + extra
    return head + bytes([len(shape) - _MIN_NDIM.get(op, 0), *shape]) + extra


def encode_quant(
    op: str,
    scheme: str,
    n: int,
    blocks: int,
    rows: int = 1,
    *,
    form: int = 0,
    bias: bool = False,
    quantized: bool = False,
    tail: int = 0,
    repack: tuple[bool, bool] = (True, True),
    raw: bool = False,
    extra: bytes = b"",
) -> bytes:
    """Bytes that decode to `op` (dequantize or quantized_linear) on an [n, blocks * block values] `scheme` weight.

    bf16 / f16: K = 32 * blocks - tail (tail 0..31).

    quantized_linear: x has `rows` rows, as [rows, K] (`form` 0), [K] (1) or [2, rows // 2, K] (2);
    `extra` holds the layouts (three bytes per tensor: out, [x,] weight[, bias]), the seed and the values.
    """
    head = bytes([QUANT_SCHEMES.index(scheme), n, blocks - 1 if blocks else 6, int(quantized) | 2 * tail])
    if op == "quantized_linear":
        head += bytes([rows, form, int(bias) | 2 * int(repack[0]) | 4 * int(repack[1])])
    return encode_case(op, "float32", raw=raw, prefix=head + extra)
