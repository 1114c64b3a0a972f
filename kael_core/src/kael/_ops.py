"""The op catalogue: every op a backend may implement, named once.

Kernel calling convention (NOTE [kernel contract]): a kernel is a plain callable
``kernel(*outputs, *inputs, **attrs)``. The frontend has already checked devices,
promoted dtypes, broadcast shapes (stride-0 views) and allocated the outputs, so
elementwise operands have the output's shape and the computation dtype. Kernels
honour arbitrary non-negative strides and storage offsets, write only into the
outputs, and return None. Each entry documents the exact signature.

*Primitives* must be implemented by every backend. *Fused* ops are optional: when a
backend does not list one in ``supported_ops()``, the frontend runs its
decomposition into primitives instead (see ``kael.ops._fused``).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["OpDef", "CATALOGUE", "PRIMITIVES", "FUSED", "UNARY_OPS", "BINARY_OPS", "COMPARE_OPS", "REDUCE_OPS"]


@dataclass(frozen=True)
class OpDef:
    name: str
    kind: str  # "primitive" | "fused"
    signature: str
    doc: str = ""


UNARY_OPS = (
    "neg",
    "exp",
    "log",
    "sqrt",
    "rsqrt",
    "tanh",
    "abs",
    "sin",
    "cos",
    "sigmoid",
    "erf",
    "log1p",
    "expm1",
    "floor",
    "ceil",
    "round",
    "sign",
    "logical_not",
)
BINARY_OPS = ("add", "sub", "mul", "div", "pow", "maximum", "minimum", "remainder", "floor_divide")
COMPARE_OPS = ("eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or")
REDUCE_OPS = ("sum", "prod", "amax", "amin", "argmax", "argmin", "any", "all")

_defs: list[OpDef] = [
    OpDef("copy", "primitive", "copy(out, a)", "strided copy with cast to out.dtype"),
    OpDef("fill", "primitive", "fill(out, value: bool|int|float)"),
    OpDef("arange", "primitive", "arange(out, start, step)", "out[i] = start + i*step, out 1-D contiguous"),
    OpDef("uniform", "primitive", "uniform(out, low, high, generator)", "generator: kael.Generator"),
    OpDef("normal", "primitive", "normal(out, mean, std, generator)"),
    OpDef("randint", "primitive", "randint(out, low, high, generator)"),
    OpDef("where", "primitive", "where(out, cond, a, b)", "cond bool; a, b of out.dtype"),
    OpDef(
        "matmul",
        "primitive",
        "matmul(out, a, b)",
        "out [*B, M, N], a [*B, M, K], b [*B, K, N]; batch dims already broadcast",
    ),
    OpDef(
        "gather", "primitive", "gather(out, a, index, dim)", "out[..i..] = a[..index[..i..]..] along dim; index int64"
    ),
    OpDef("index_select", "primitive", "index_select(out, a, index, dim)", "index int64 1-D"),
    OpDef("index_add", "primitive", "index_add(out, index, src, dim)", "in place: out.index_add_(dim, index, src)"),
    OpDef(
        "scatter_add", "primitive", "scatter_add(out, index, src, dim)", "in place: out.scatter_add_(dim, index, src)"
    ),
    OpDef("cat", "primitive", "cat(out, tensors: list, dim)"),
    OpDef("nonzero", "primitive", "nonzero(out, mask)", "out int64 [n, ndim] of true positions, row-major order"),
    OpDef("sort", "primitive", "sort(values, indices, a, dim, descending)", "stable sort along dim"),
]
_defs += [
    OpDef(n, "primitive", f"{n}(out, a)", "elementwise; out.dtype == a.dtype (logical_not: out bool)")
    for n in UNARY_OPS
]
_defs += [OpDef(n, "primitive", f"{n}(out, a, b)", "elementwise; a, b, out same dtype") for n in BINARY_OPS]
_defs += [OpDef(n, "primitive", f"{n}(out, a, b)", "elementwise; out bool; a, b same dtype") for n in COMPARE_OPS]
_defs += [
    OpDef(n, "primitive", f"{n}(out, a, dims: tuple[int, ...])", "out has a's shape with dims set to 1")
    for n in REDUCE_OPS
]
_defs += [
    OpDef("linear", "fused", "linear(out, x, weight, bias|None)", "out [.., O] = x [.., I] @ weight[O, I].T + bias[O]"),
    OpDef("gelu", "fused", "gelu(out, x, approximate: 'tanh'|'none')"),
    OpDef("gelu_backward", "fused", "gelu_backward(grad_in, grad_out, x, approximate)"),
    OpDef("softmax", "fused", "softmax(out, x, dim)"),
    OpDef("log_softmax", "fused", "log_softmax(out, x, dim)"),
    OpDef(
        "layer_norm",
        "fused",
        "layer_norm(out, mean, rstd, x, weight|None, bias|None, eps)",
        "normalises over the last dim; mean, rstd float32/64 of shape x.shape[:-1]",
    ),
    OpDef(
        "layer_norm_backward",
        "fused",
        "layer_norm_backward(dx, dweight|None, dbias|None, grad, x, mean, rstd, weight|None)",
    ),
    OpDef("embedding", "fused", "embedding(out, weight, ids)", "out [*ids.shape, D]"),
    OpDef(
        "cross_entropy",
        "fused",
        "cross_entropy(losses, logits, target, ignore_index, label_smoothing)",
        "losses [N] per row (0 where target == ignore_index); logits [N, C]; target int64 [N]",
    ),
    OpDef(
        "attention",
        "fused",
        "attention(out, q, k, v, scale, causal, lengths|None)",
        "q [B,H,Tq,D], k/v [B,H,Tk,D]; causal aligns the last query with key Tk-1 (KV cache); "
        "lengths int64 [B] limits the keys each row sees",
    ),
    OpDef("topk", "fused", "topk(values, indices, x, k)", "along the last dim, largest first"),
    OpDef(
        "adamw_step",
        "fused",
        "adamw_step(param, grad, exp_avg, exp_avg_sq, lr, beta1, beta2, eps, weight_decay, step)",
        "in place",
    ),
]

CATALOGUE: dict[str, OpDef] = {d.name: d for d in _defs}
PRIMITIVES: frozenset[str] = frozenset(d.name for d in _defs if d.kind == "primitive")
FUSED: frozenset[str] = frozenset(d.name for d in _defs if d.kind == "fused")
