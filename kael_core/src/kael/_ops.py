"""The op catalogue: every op a backend may implement, named once (public face: ``kael.backends.catalogue``).

Kernel calling convention (NOTE [kernel contract]): a kernel is a plain callable
``kernel(*args)`` taking its arguments positionally, in the order of the op's
``OpDef.args``. The frontend has already checked devices, promoted dtypes, broadcast
shapes (stride-0 views) and allocated the outputs, so elementwise operands have the
output's shape and the computation dtype. Kernels honour arbitrary non-negative
strides and storage offsets, write only into the outputs, and return None.

*Primitives* must be implemented by every backend. *Fused* ops are optional: when a
backend does not list one in ``supported_ops()``, the frontend runs its
decomposition into primitives instead (``kael.backends.catalogue.decomposition``).

Each entry is written as a signature (``_op``): ``name`` a tensor input, ``name?`` an
optional tensor input (may be None), ``name*`` a list of tensor inputs, ``name!`` an
output the frontend allocates, ``name!?`` an optional output, ``name^`` a tensor read
and written in place, ``name: type`` an attribute (a plain Python value).

Elementwise ops carry a ``Pointwise`` record: everything the generated op surface
(function wrappers, Tensor methods), the reference kernel and the test tables need.
Entries are in a fixed order that the fuzz kernel encoding depends on: add new ops at
the end of their list, never in between.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._ops_nn import NN_OPS

__all__ = [
    "Arg",
    "Pointwise",
    "OpDef",
    "CATALOGUE",
    "PRIMITIVES",
    "FUSED",
    "UNARY_OPS",
    "BINARY_OPS",
    "COMPARE_OPS",
    "REDUCE_OPS",
    "POINTWISE_OPS",
    "POINTWISE_FUSED",
]

ROLES = ("out", "inout", "in", "attr")


@dataclass(frozen=True)
class Arg:
    """One positional argument of a kernel.

    role: ``out`` (allocated by the frontend, written), ``inout`` (read and written in
    place), ``in`` (read), ``attr`` (a plain Python value). ``type`` names an attribute's
    type (or ``list[Tensor]`` for a list of inputs); ``optional`` tensors may be None.
    """

    name: str
    role: str
    type: str = ""
    optional: bool = False

    @property
    def is_tensor(self) -> bool:
        """Whether the argument is a tensor (or a list of them): every role but ``attr``."""
        return self.role != "attr"

    def render(self) -> str:
        """The argument as the catalogue's signatures spell it: ``name: type`` for an attribute or a
        typed input, ``name|None`` for an optional tensor, else the bare name."""
        if self.role == "attr":
            return f"{self.name}: {self.type}"
        if self.type:
            return f"{self.name}: {self.type}"
        return f"{self.name}|None" if self.optional else self.name


@dataclass(frozen=True)
class Pointwise:
    """What an elementwise op's generated surface and test tables need.

    * ``ufunc``: a NumPy ufunc (CuPy has the same) computing the op; a backend may call
      it with ``out=``. ``expr(xp, *arrays)``, when given, is the reference definition
      instead, written with an array module ``xp`` (NumPy; CuPy shares the functions it
      uses unless the CUDA backend has a kernel source for the op).
    * ``dtypes``: ``float`` (integer and bool inputs are computed in the default float
      dtype), ``numeric`` (no bool), ``all``, or ``bool``. ``bool_out``: the result is bool.
    * ``method``: ``Tensor.<name>()`` exists; ``inplace``: ``Tensor.<name>_()`` too.
    * ``domain``: per input, the kind of sample values the op is defined for (the
      conformance kit's ``vals`` kinds: normal, positive, unit, halves, nonzero, small);
      ``int_domain`` the same for integer dtypes when they differ.
    * ``special``: samples with NaN, infinities and signed zeros are meaningful.
    * ``exact``: results are bit-exact on any input bits (``all``), on integer and bool
      dtypes only (``ints``), or not guaranteed (``""``): fuzzers compare raw bits then.
    * ``decompose(p, *inputs)``: for a fused op, its definition by primitives, written
      with ``p``, a namespace of the frontend's primitive functions (``p.mul``,
      ``p.sigmoid``: no autograd; the decomposition runs on the backend's kernels).
    """

    ufunc: str = ""
    expr: Callable[..., Any] | None = None
    dtypes: str = "numeric"
    bool_out: bool = False
    method: bool = True
    inplace: bool = False
    domain: tuple[str, ...] = ("normal", "normal")
    int_domain: tuple[str, ...] | None = None
    special: bool = False
    exact: str = ""
    decompose: Callable[..., Any] | None = None

    def compute(self, xp: Any, *arrays: Any) -> Any:
        """The op's values over arrays of array module xp (the reference definition)."""
        if self.expr is not None:
            return self.expr(xp, *arrays)
        return getattr(xp, self.ufunc)(*arrays)

    def kinds(self, integer: bool) -> tuple[str, ...]:
        """Sample value kinds of the inputs, for an integer dtype or a float one."""
        return self.int_domain if integer and self.int_domain is not None else self.domain


@dataclass(frozen=True)
class OpDef:
    """One op: its name, kind (``primitive`` or ``fused``), kernel arguments, and docs."""

    name: str
    kind: str
    args: tuple[Arg, ...]
    doc: str = ""
    pointwise: Pointwise | None = field(default=None, compare=False)

    @property
    def signature(self) -> str:
        """The exact kernel signature, e.g. ``layer_norm(out, mean, rstd, x, weight|None, bias|None, eps: float)``."""
        return f"{self.name}({', '.join(a.render() for a in self.args)})"

    @property
    def outputs(self) -> tuple[str, ...]:
        """Tensor arguments the kernel writes (``out`` and ``inout``), in order."""
        return tuple(a.name for a in self.args if a.role in ("out", "inout"))

    @property
    def inputs(self) -> tuple[str, ...]:
        """Tensor arguments the kernel only reads, in order."""
        return tuple(a.name for a in self.args if a.role == "in")

    @property
    def attributes(self) -> tuple[str, ...]:
        """Non-tensor arguments (dims, scalars, flags, a generator), in order."""
        return tuple(a.name for a in self.args if a.role == "attr")

    @property
    def arity(self) -> tuple[int, int]:
        """(number of outputs, number of inputs)."""
        return len(self.outputs), len(self.inputs)

    @property
    def allocated(self) -> tuple[int, ...]:
        """Positions of the outputs the frontend allocates (``out``; not the in-place ones)."""
        return tuple(i for i, a in enumerate(self.args) if a.role == "out")

    def __repr__(self) -> str:
        return f"<OpDef {self.kind} {self.signature}>"


def _arg(spec: str) -> Arg:
    spec = spec.strip()
    if ":" in spec:
        name, typ = (s.strip() for s in spec.split(":", 1))
        return Arg(name, "attr", typ)
    if spec.endswith("*"):
        return Arg(spec[:-1], "in", "list[Tensor]")
    if spec.endswith("!?"):
        return Arg(spec[:-2], "out", optional=True)
    if spec.endswith("!"):
        return Arg(spec[:-1], "out")
    if spec.endswith("^"):
        return Arg(spec[:-1], "inout")
    if spec.endswith("?"):
        return Arg(spec[:-1], "in", optional=True)
    return Arg(spec, "in")


def _split_args(args: str) -> list[str]:
    """The comma-separated specs of a signature, commas inside brackets (``tuple[int, ...]``) kept."""
    parts, depth, cur = [], 0, ""
    for ch in args:
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return [p for p in [*parts, cur] if p.strip()]


def _op(name: str, kind: str, args: str, doc: str = "", pointwise: Pointwise | None = None) -> OpDef:
    return OpDef(name, kind, tuple(_arg(s) for s in _split_args(args)), doc, pointwise)


# -- elementwise ops -------------------------------------------------------------------------------
_erf_f64 = np.vectorize(math.erf, otypes=[np.float64])


def _erf(xp: Any, x: Any) -> Any:
    return _erf_f64(x).astype(x.dtype)


def _float(ufunc: str = "", **kw: Any) -> Pointwise:
    """A float op (integer inputs computed in the default float dtype) with special-value samples."""
    return Pointwise(ufunc, dtypes="float", special=True, **kw)


def _cmp(ufunc: str) -> Pointwise:
    return Pointwise(ufunc, dtypes="all", bool_out=True, special=True, exact="all", domain=("halves", "halves"))


UNARY: dict[str, Pointwise] = {
    "neg": Pointwise("negative", inplace=True, special=True, exact="ints"),
    "exp": _float("exp", inplace=True),
    "log": _float("log", inplace=True, domain=("positive",)),
    "sqrt": _float("sqrt", inplace=True, domain=("positive",)),
    "rsqrt": _float(expr=lambda xp, x: 1 / xp.sqrt(x), domain=("positive",)),
    "tanh": _float("tanh", inplace=True),
    "abs": Pointwise("absolute", inplace=True, special=True, exact="ints"),
    "sin": _float("sin"),
    "cos": _float("cos"),
    "sigmoid": _float(expr=lambda xp, x: 1 / (1 + xp.exp(-x)), inplace=True),
    "erf": _float(expr=_erf),
    "log1p": _float("log1p", domain=("unit",)),
    "expm1": _float("expm1"),
    "floor": Pointwise("floor", inplace=True, domain=("halves",), special=True),
    "ceil": Pointwise("ceil", inplace=True, domain=("halves",), special=True),
    # half to even, like torch.round (np.round keeps integers exact; rint is the same for floats)
    "round": Pointwise("rint", expr=lambda xp, x: xp.round(x), inplace=True, domain=("halves",), special=True),
    "sign": Pointwise("sign", exact="ints"),
    "logical_not": Pointwise("logical_not", dtypes="all", bool_out=True, special=True, exact="ints"),
}
BINARY: dict[str, Pointwise] = {
    "add": Pointwise("add", dtypes="all", inplace=True, special=True),
    "sub": Pointwise("subtract", inplace=True, special=True),
    "mul": Pointwise("multiply", dtypes="all", inplace=True, special=True),
    "div": Pointwise("true_divide", dtypes="float", inplace=True, domain=("normal", "nonzero"), special=True),
    "pow": Pointwise("power", inplace=True, domain=("positive", "unit"), int_domain=("small", "small")),
    "maximum": Pointwise("maximum", dtypes="all", inplace=True, special=True, exact="ints"),
    "minimum": Pointwise("minimum", dtypes="all", inplace=True, special=True, exact="ints"),
    "remainder": Pointwise("remainder", domain=("normal", "nonzero")),
    "floor_divide": Pointwise("floor_divide", domain=("normal", "nonzero")),
}
COMPARE: dict[str, Pointwise] = {
    "eq": _cmp("equal"),
    "ne": _cmp("not_equal"),
    "lt": _cmp("less"),
    "le": _cmp("less_equal"),
    "gt": _cmp("greater"),
    "ge": _cmp("greater_equal"),
    "logical_and": Pointwise("logical_and", dtypes="bool", bool_out=True, exact="all"),
    "logical_or": Pointwise("logical_or", dtypes="bool", bool_out=True, exact="all"),
}
#: Elementwise fused ops: optional kernels, each with a decomposition (and a Function in kael.ops).
UNARY_FUSED: dict[str, Pointwise] = {
    "silu": _float(
        expr=lambda xp, x: x / (1 + xp.exp(-x)), decompose=lambda p, x: p.mul(x, p.sigmoid(x)), inplace=True
    ),
}

UNARY_OPS: tuple[str, ...] = tuple(UNARY)
BINARY_OPS: tuple[str, ...] = tuple(BINARY)
COMPARE_OPS: tuple[str, ...] = tuple(COMPARE)
REDUCE_OPS = ("sum", "prod", "amax", "amin", "argmax", "argmin", "any", "all")

_defs: list[OpDef] = [
    _op("copy", "primitive", "out!, a", "strided copy with cast to out.dtype"),
    _op("fill", "primitive", "out!, value: bool|int|float"),
    _op(
        "arange", "primitive", "out!, start: int|float, step: int|float", "out[i] = start + i*step, out 1-D contiguous"
    ),
    _op("uniform", "primitive", "out!, low: float, high: float, generator: kael.Generator", "draws on the host"),
    _op("normal", "primitive", "out!, mean: float, std: float, generator: kael.Generator"),
    _op("randint", "primitive", "out!, low: int, high: int, generator: kael.Generator"),
    _op("where", "primitive", "out!, cond, a, b", "cond bool; a, b of out.dtype"),
    _op(
        "matmul", "primitive", "out!, a, b", "out [*B, M, N], a [*B, M, K], b [*B, K, N]; batch dims already broadcast"
    ),
    _op("gather", "primitive", "out!, a, index, dim: int", "out[..i..] = a[..index[..i..]..] along dim; index int64"),
    _op("index_select", "primitive", "out!, a, index, dim: int", "index int64 1-D"),
    _op("index_add", "primitive", "out^, index, src, dim: int", "in place: out.index_add_(dim, index, src)"),
    _op("scatter_add", "primitive", "out^, index, src, dim: int", "in place: out.scatter_add_(dim, index, src)"),
    _op("cat", "primitive", "out!, tensors*, dim: int"),
    _op("nonzero", "primitive", "out!, mask", "out int64 [n, ndim] of true positions, row-major order"),
    _op("sort", "primitive", "values!, indices!, a, dim: int, descending: bool", "stable sort along dim"),
]
_defs += [
    _op(n, "primitive", "out!, a", "elementwise; out.dtype == a.dtype (bool when it says so)", p)
    for n, p in UNARY.items()
]
_defs += [_op(n, "primitive", "out!, a, b", "elementwise; a, b, out same dtype", p) for n, p in BINARY.items()]
_defs += [_op(n, "primitive", "out!, a, b", "elementwise; out bool; a, b same dtype", p) for n, p in COMPARE.items()]
_defs += [
    _op(
        n,
        "primitive",
        "out!, a, dims: tuple[int, ...]",
        "out has a's shape with dims set to 1"
        + ("; float32 and 16-bit products accumulate in float64" if n == "prod" else ""),
    )
    for n in REDUCE_OPS
]
_defs += [
    _op("linear", "fused", "out!, x, weight, bias?", "out [.., O] = x [.., I] @ weight[O, I].T + bias[O]"),
    _op("gelu", "fused", "out!, x, approximate: 'tanh'|'none'"),
    _op("gelu_backward", "fused", "grad_in!, grad_out, x, approximate: 'tanh'|'none'"),
    _op("softmax", "fused", "out!, x, dim: int"),
    _op("log_softmax", "fused", "out!, x, dim: int"),
    _op(
        "layer_norm",
        "fused",
        "out!, mean!, rstd!, x, weight?, bias?, eps: float",
        "normalises over the last dim; mean, rstd float32/64 of shape x.shape[:-1]",
    ),
    _op(
        "layer_norm_backward",
        "fused",
        "dx!, dweight!?, dbias!?, grad, x, mean, rstd, weight?",
        "dweight, dbias: None when not wanted (or no weight)",
    ),
    _op("embedding", "fused", "out!, weight, ids", "out [*ids.shape, D]"),
    _op(
        "cross_entropy",
        "fused",
        "losses!, logits, target, ignore_index: int, label_smoothing: float",
        "losses [N] per row (0 where target == ignore_index); logits [N, C]; target int64 [N]",
    ),
    _op(
        "attention",
        "fused",
        "out!, q, k, v, scale: float, causal: bool, lengths?, window: int",
        "q [B,H,Tq,D], k/v [B,Hkv,Tk,D] with H % Hkv == 0: query head h reads key/value head "
        "h // (H // Hkv) (grouped-query attention; multi-query when Hkv == 1; K/V never repeated); "
        "causal aligns the last query with key Tk-1 (KV cache); lengths int64 [B] limits the keys each row sees; "
        "window > 0 (1.4, causal only, passed only when set): the query at position p sees keys p-window+1..p",
    ),
    _op(
        "rms_norm",
        "fused",
        "out!, rstd!, x, weight?, eps: float",
        "normalises over the last dim in float32 (float64 for float64 x), as Hugging Face's RMSNorm: "
        "rstd = 1/sqrt(mean(x*x) + eps), out = (x * rstd rounded to x.dtype) * weight; rstd float32/64 "
        "of shape x.shape[:-1]",
    ),
    _op(
        "rope",
        "fused",
        "out!, x, cos, sin, positions",
        "rotary embedding, rotate-half convention (Hugging Face Llama): x/out [B,H,T,D] with D even, "
        "cos/sin [P, D/2] float32 or float64 tables, positions int64 [B,T] (each in [0, P)); with "
        "c, s = cos/sin[positions[b,t]], x1, x2 = x[..,:D/2], x[..,D/2:]: out[..,:D/2] = x1*c - x2*s, "
        "out[..,D/2:] = x2*c + x1*s, computed in float32 (float64 when x or the tables are float64)",
    ),
    _op("silu_mul", "fused", "out!, gate, up", "SwiGLU: out = silu(gate) * up; gate, up, out same shape and dtype"),
    _op(
        "dequantize",
        "fused",
        "out!, weight, scheme: 'q8_0'|'q4_0'|'bf16'|'f16'",
        "out float32 [N, K] = the values of weight, a matrix stored in a weight format (NOTE [weight formats] in "
        "kael/quant/_formats.py): q8_0/q4_0: weight uint8 [N, K/32*B], each row K/32 GGML blocks of B bytes "
        "used as they are in GGUF (q8_0, B = 34: float16 d, 32 int8 q; value i = d*q[i]. q4_0, B = 18: float16 d, "
        "16 bytes q; value i < 16 = d*((q[i] & 15) - 8), value i + 16 = d*((q[i] >> 4) - 8)); bf16/f16: weight "
        "[N, K] of that dtype",
    ),
    _op(
        "quantized_linear",
        "fused",
        "out!, x, weight, bias?, scheme: 'q8_0'|'q4_0'|'bf16'|'f16'",
        "out [.., N] = x [.., K] @ dequantize(weight, scheme).T + bias [N]; x, bias, out float32 (accumulated in "
        "float32); weight as for dequantize. A backend's result for a row never depends on how many rows x has. "
        "Numerics: for q8_0/q4_0 (and q4_1/q5_0/q5_1/iq4_nl) weights a backend may quantize x's rows to GGML Q8_0 blocks, "
        "and for the super-block formats (q2_k/q3_k/q4_k/q5_k/q6_k/iq4_xs) to GGML Q8_K blocks, as llama.cpp does, "
        "and take integer block dot products (error about |d_x|/2 per value; the CPU backend does by default for up to "
        "16 rows, at every row count with KAEL_QUANT_ACTIVATIONS=q8, never with =f32: NOTE [integer quantized linear] "
        "in its csrc/quant.cpp); for bf16 weights it may round x to bfloat16 as llama.cpp does (error up to 2^-9 "
        "|x| per value; the CPU backend does where it has AVX512_BF16, by the same rule: NOTE [bfloat16 activations]) "
        "and for f16 weights to float16 (error up to 2^-11 |x|, +-inf beyond 65504: NOTE [float16 activations])",
    ),
    _op("topk", "fused", "values!, indices!, x, k: int", "along the last dim, largest first"),
    _op(
        "adamw_step",
        "fused",
        "param^, grad, exp_avg^, exp_avg_sq^, lr: float, beta1: float, beta2: float, eps: float, "
        "weight_decay: float, step: int",
        "in place",
    ),
    _op(
        "paged_attention",
        "fused",
        "out!, q, cache, block_table, lengths, scale: float, window: int",
        "causal attention over a paged KV cache (inference only): q/out [B,H,T,D]; cache [NB,2,Hkv,S,D] of q's "
        "dtype, one layer's pool of NB blocks of S positions (cache[n, 0] block n's keys [Hkv,S,D], cache[n, 1] "
        "its values); block_table int64 [B,M]: row b's position p (0 <= p < lengths[b]) is in block "
        "block_table[b, p // S], slot p % S (entries from ceil(lengths[b]/S) on are ignored, may be anything); "
        "lengths int64 [B] with T <= lengths[b] <= M*S counts the positions row b attends to, this step's T "
        "included; query t of row b sits at position lengths[b]-T+t and attends keys 0..lengths[b]-T+t; H % Hkv "
        "== 0, query head h reads kv head h // (H // Hkv); accumulated in float32 (float64 for float64). A row's "
        "result depends neither on the other rows nor on which blocks hold its keys; window > 0 (1.4, passed only "
        "when set): query t sees only positions lengths[b]-T+t-window+1 .. lengths[b]-T+t",
    ),
    _op(
        "gelu_tanh_mul",
        "fused",
        "out!, gate, up",
        "GeGLU (Gemma's MLP): out = gelu_tanh(gate) * up with gelu_tanh(g) = 0.5*g*(1 + tanh(sqrt(2/pi)*(g + "
        "0.044715*g^3))); gate, up, out same shape and dtype; 16-bit floats round gelu_tanh(gate) to their dtype "
        "before the product, as gelu then mul do",
    ),
    _op(
        "softcap",
        "fused",
        "out!, x, cap: float",
        "soft-capping (Gemma 2's attention scores and final logits): out = cap * tanh(x / cap), cap > 0 finite; "
        "x, out same shape and dtype; 16-bit floats round x / cap, its tanh and the product to their dtype, as "
        "(x / cap).tanh() * cap does (each op computed in float32, cap as a float32)",
    ),
    _op(
        "moe_route",
        "fused",
        "weights!, experts!, logits, k: int, normalize: bool",
        "mixture-of-experts top-k routing: logits [T, E] of any float dtype; p = softmax(logits) over E in "
        "float32 (float64 for float64 logits); experts int64 [T, k] the k largest p of each row, largest first, "
        "equal values in index order; weights [T, k] (p's dtype) = p at experts, divided by their sum when "
        "normalize",
    ),
    _op(
        "expert_linear",
        "fused",
        "out!, x, weight, experts",
        "expert-grouped matmul: x [T, K, C] (may be a stride-0 broadcast over K), weight [E, N, C] (the experts' "
        "nn.Linear weights stacked), experts int64 [T, K] with values in [0, E) (checked by the frontend); "
        "out [T, K, N]: out[t, j] = weight[experts[t, j]] @ x[t, j]; x, weight, out one float dtype (16-bit "
        "floats accumulated in float32); a kernel should read each expert's matrix once for all rows that chose it",
    ),
]
_defs += [
    _op(n, "fused", "out!, x", "elementwise; out.dtype == x.dtype (a float dtype)", p) for n, p in UNARY_FUSED.items()
]
_defs += [_op(*entry) for entry in NN_OPS]  # convolution, pooling, batch norm (_ops_nn)

CATALOGUE: dict[str, OpDef] = {d.name: d for d in _defs}
PRIMITIVES: frozenset[str] = frozenset(d.name for d in _defs if d.kind == "primitive")
FUSED: frozenset[str] = frozenset(d.name for d in _defs if d.kind == "fused")
#: Every elementwise op (primitive and fused), in catalogue order.
POINTWISE_OPS: tuple[str, ...] = tuple(d.name for d in _defs if d.pointwise is not None)
#: The elementwise fused ops (each has a ``Pointwise.decompose``).
POINTWISE_FUSED: tuple[str, ...] = tuple(UNARY_FUSED)
