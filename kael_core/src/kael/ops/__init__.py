"""The frontend ops: every public tensor function of kael, dispatched to backends.

The elementwise functions (``add`` ... ``logical_or``, ``neg`` ... ``logical_not``, and
elementwise fused ops such as ``silu``) are made here from the op catalogue: one
function per ``kael.backends.catalogue.POINTWISE_OPS`` entry, applying the op's
registered Function (``_pointwise.FUNCTIONS``, with autograd) or, for ops without one,
the plain kernel call. The other functions are written out below.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .. import _dtype as dt
from .._errors import DTypeError
from .._ops import CATALOGUE, POINTWISE_OPS
from .._tensor import Tensor
from . import _avg_pool_fused, _batch_norm_fused, _conv_fused, _pool_fused  # noqa: F401  (register their decompositions)
from ._attention_fused import attention, paged_attention
from ._creation import (
    arange,
    empty_,
    empty_like,
    eye,
    full,
    full_like,
    linspace,
    ones,
    ones_like,
    rand,
    rand_like,
    randint,
    randn,
    randn_like,
    randperm,
    tensor,
    zeros,
    zeros_like,
)
from ._cross_entropy_fused import cross_entropy
from ._fused import adamw_step, embedding, gelu, layer_norm, linear, log_softmax, softmax
from ._fused_gemma import gelu_tanh_mul, softcap
from ._fused_llama import rms_norm, rope, silu_mul
from ._indexing import cat, chunk, gather, index_select, nonzero, split, stack
from ._inplace import clone, contiguous, detach, to
from ._linalg import matmul
from ._moe_fused import expert_linear, moe_route
from ._pointwise import FUNCTIONS, Relu, Where, binary, unary
from ._pointwise_fused import pointwise_fused
from ._quant import dequantize, quantized_linear
from ._random import Generator, default_generator, manual_seed, seed
from ._reduce import Amax, Amin, Prod, Sum, argreduce, logical_reduce, max_with_indices, mean, std, var
from ._topk_fused import topk
from ._views import expand, flatten, narrow, permute, reshape, select, slice_, squeeze, transpose, unsqueeze, view

__all__ = [
    "tensor",
    "zeros",
    "ones",
    "full",
    "empty",
    "arange",
    "linspace",
    "eye",
    "zeros_like",
    "ones_like",
    "full_like",
    "empty_like",
    "rand",
    "randn",
    "randint",
    "randperm",
    "rand_like",
    "randn_like",
    "Generator",
    "manual_seed",
    "seed",
    "default_generator",
    "relu",
    "clamp",
    "where",
    "sum",
    "mean",
    "prod",
    "max",
    "min",
    "amax",
    "amin",
    "argmax",
    "argmin",
    "var",
    "std",
    "any",
    "all",
    "matmul",
    "cat",
    "stack",
    "split",
    "chunk",
    "gather",
    "index_select",
    "nonzero",
    "reshape",
    "view",
    "permute",
    "transpose",
    "expand",
    "squeeze",
    "unsqueeze",
    "flatten",
    "narrow",
    "select",
    "slice_",
    "clone",
    "contiguous",
    "detach",
    "to",
    "softmax",
    "log_softmax",
    "gelu",
    "layer_norm",
    "linear",
    "embedding",
    "cross_entropy",
    "attention",
    "paged_attention",
    "rms_norm",
    "rope",
    "silu_mul",
    "gelu_tanh_mul",
    "softcap",
    "topk",
    "moe_route",
    "expert_linear",
    "adamw_step",
    "dequantize",
    "quantized_linear",
]

empty = empty_


def _binary_function(name: str) -> Callable[[Any, Any], Tensor]:
    fn = FUNCTIONS.get(name)
    if fn is not None:
        apply = fn.apply

        def op(a: Any, b: Any) -> Tensor:
            return apply(a, b)  # type: ignore[no-any-return]
    else:

        def op(a: Any, b: Any) -> Tensor:
            return binary(name, a, b)

    return op


def _unary_function(name: str) -> Callable[[Tensor], Tensor]:
    fn = FUNCTIONS.get(name)
    if fn is None:
        if CATALOGUE[name].kind == "fused":
            return lambda a: pointwise_fused(name, a)
        return lambda a: unary(name, a)
    apply = fn.apply

    def op(a: Tensor) -> Tensor:
        if not isinstance(a, Tensor):
            raise DTypeError(f"{name}: expected a tensor, got {type(a).__name__}")
        return apply(a)  # type: ignore[no-any-return]

    return op


def _pointwise_function(name: str) -> Callable[..., Tensor]:
    d = CATALOGUE[name]
    op = _unary_function(name) if d.arity[1] == 1 else _binary_function(name)
    op.__name__ = op.__qualname__ = name
    op.__module__ = __name__
    op.__doc__ = f"Elementwise {name} (``{d.signature}`` on the backend), with PyTorch's promotion and broadcasting."
    return op


#: The elementwise functions, one per catalogue op (also module attributes: kael.ops.add, kael.silu, ...).
POINTWISE: dict[str, Callable[..., Tensor]] = {name: _pointwise_function(name) for name in POINTWISE_OPS}
globals().update(POINTWISE)
__all__ += list(POINTWISE)


def _missing(name: str) -> Any:
    raise AttributeError(f"module 'kael.ops' has no attribute {name!r}")


# A module __getattr__ makes type checkers accept the generated names (as Any). Assigned rather than
# written as a def: mypy leaves a def'd one unresolved inside kael's import cycle ("Any? not callable").
__getattr__ = _missing


def _maximum(a: Any, b: Any) -> Tensor:
    return POINTWISE["maximum"](a, b)


def _minimum(a: Any, b: Any) -> Tensor:
    return POINTWISE["minimum"](a, b)


def relu(a: Tensor) -> Tensor:
    """Elementwise ``max(a, 0)``, in ``a``'s dtype; the gradient is 0 where ``a <= 0`` (as PyTorch's).

    Raises ``DTypeError`` when ``a`` is not a tensor.
    """
    if not isinstance(a, Tensor):
        raise DTypeError(f"relu: expected a tensor, got {type(a).__name__}")
    return Relu.apply(a)  # type: ignore[no-any-return]


def clamp(a: Tensor, min: Any = None, max: Any = None) -> Tensor:
    """Elementwise ``minimum(maximum(a, min), max)``: ``a`` with its values limited to ``[min, max]``.

    ``min`` and ``max`` are numbers or tensors broadcastable against ``a``; either may be None (no bound
    on that side), not both (``DTypeError``). With ``min > max`` every element becomes ``max``, as in
    PyTorch. The gradient flows to ``a`` where it is inside the bounds (and to tensor bounds where they bind).
    """
    if min is None and max is None:
        raise DTypeError("clamp: at least one of min and max must be given")
    r = a
    if min is not None:
        r = _maximum(r, min)
    if max is not None:
        r = _minimum(r, max)
    return r


def where(cond: Tensor, a: Any, b: Any) -> Tensor:
    """Elementwise select: ``a`` where ``cond`` is True, else ``b``.

    ``cond`` must be a bool tensor (``DTypeError`` otherwise); ``a`` and ``b`` are tensors or Python numbers.
    The three broadcast together, the result's dtype is ``a`` and ``b``'s promoted type, and the gradient
    of each of ``a`` and ``b`` is the incoming gradient where it was selected, 0 elsewhere.
    """
    return Where.apply(cond, a, b)  # type: ignore[no-any-return]


def sum(a: Tensor, dim: Any = None, keepdim: bool = False, dtype: Any = None) -> Tensor:
    """The sum over ``dim`` (an int, a tuple of ints, or None for all elements).

    ``keepdim=True`` keeps the reduced dims with size 1. Bool and integer tensors sum to int64 unless
    ``dtype`` is given; floating-point tensors keep their dtype. The sum of no elements is 0.
    """
    return Sum.apply(a, dim, keepdim, dtype)  # type: ignore[no-any-return]


def prod(a: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:
    """The product over ``dim`` (an int, a tuple of ints, or None for all elements).

    ``keepdim=True`` keeps the reduced dims with size 1. Bool and integer tensors multiply in int64;
    the product of no elements is 1. The gradient is exact where ``a`` holds zeros (no division by them).
    """
    return Prod.apply(a, dim, keepdim)  # type: ignore[no-any-return]


def amax(a: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:
    """The largest value over ``dim`` (an int, a tuple of ints, or None for all elements), in ``a``'s dtype.

    Unlike ``max`` it returns no indices, and its gradient is shared evenly between tied maxima.
    Reducing over a dim of size 0 raises ``ShapeError``.
    """
    return Amax.apply(a, "amax", dim, keepdim)  # type: ignore[no-any-return]


def amin(a: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:
    """The smallest value over ``dim`` (an int, a tuple of ints, or None for all elements), in ``a``'s dtype.

    Unlike ``min`` it returns no indices, and its gradient is shared evenly between tied minima.
    Reducing over a dim of size 0 raises ``ShapeError``.
    """
    return Amin.apply(a, "amin", dim, keepdim)  # type: ignore[no-any-return]


def max(a: Tensor, dim: Any = None, keepdim: bool = False) -> Any:
    """max(a) -> the largest value; max(a, dim) -> (values, indices)."""
    if isinstance(dim, Tensor):
        return _maximum(a, dim)
    if dim is None:
        return amax(a)
    return max_with_indices(a, dim, keepdim, "max")


def min(a: Tensor, dim: Any = None, keepdim: bool = False) -> Any:
    """min(a) -> the smallest value; min(a, dim) -> (values, indices); min(a, other) -> elementwise minimum."""
    if isinstance(dim, Tensor):
        return _minimum(a, dim)
    if dim is None:
        return amin(a)
    return max_with_indices(a, dim, keepdim, "min")


def argmax(a: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
    """The int64 index of the largest value along ``dim`` (the first one on ties).

    With ``dim=None`` it is the index into the flattened tensor (of shape ``(1,) * a.ndim`` with
    ``keepdim=True``). Raises ``DTypeError`` for a ``dim`` that is not an int, ``ShapeError`` for an empty
    tensor or dim. Not differentiable.
    """
    return argreduce("argmax", a, dim, keepdim)


def argmin(a: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
    """The int64 index of the smallest value along ``dim`` (the first one on ties).

    With ``dim=None`` it is the index into the flattened tensor (of shape ``(1,) * a.ndim`` with
    ``keepdim=True``). Raises ``DTypeError`` for a ``dim`` that is not an int, ``ShapeError`` for an empty
    tensor or dim. Not differentiable.
    """
    return argreduce("argmin", a, dim, keepdim)


def any(a: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:
    """Whether any element over ``dim`` (an int, a tuple of ints, or None for all) is nonzero, as a bool tensor.

    ``any`` of no elements is False.
    """
    return logical_reduce("any", a, dim, keepdim)


def all(a: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:
    """Whether every element over ``dim`` (an int, a tuple of ints, or None for all) is nonzero, as a bool tensor.

    ``all`` of no elements is True.
    """
    return logical_reduce("all", a, dim, keepdim)


_ = (dt, mean, var, std)

from . import _methods  # noqa: E402,F401  (attaches Tensor methods; needs the names above)
