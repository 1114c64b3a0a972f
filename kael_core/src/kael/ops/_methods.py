"""Tensor methods and operators, attached here so _tensor.py stays about data layout.

The elementwise methods come from the op catalogue: ``Tensor.<op>`` for every
``POINTWISE_OPS`` entry whose ``Pointwise.method`` is set, and ``Tensor.<op>_`` (in place)
where ``Pointwise.inplace`` is; the rest are listed here.
"""

from __future__ import annotations

from typing import Any

from .. import _dtype as dt
from .._errors import AutogradError, DTypeError
from .._ops import CATALOGUE, POINTWISE_OPS
from .._tensor import Tensor
from ..autograd._grad_mode import STATE
from ._pointwise import FUNCTIONS


def _pointwise_methods(inplace: bool, inputs: int) -> list[str]:
    """The catalogue's elementwise ops with a method (or an in-place method), of `inputs` operands."""
    out = []
    for op in POINTWISE_OPS:
        d = CATALOGUE[op]
        p = d.pointwise
        assert p is not None
        if d.arity[1] == inputs and (p.inplace if inplace else p.method):
            out.append(op)
    return out


#: The docstring of each generated in-place method (``Tensor.add_``, ``Tensor.exp_``, ...).
_INPLACE_DOC = """In-place ``{call}``: the result is written into this tensor's memory, which is returned.

The tensor keeps its shape and dtype. While grad mode is on, autograd records the op (on a view, the base's
gradient sees the write too); a leaf tensor that requires grad raises ``AutogradError`` (use ``kael.no_grad()``
or a clone). Read-only memory (a memory-mapped file) raises ``DTypeError``.
"""

_INPLACE_BINARY_DOC = """
``other`` is a tensor broadcastable to this tensor's shape (else ``ShapeError``) or a Python number; with
``alpha`` it is multiplied by ``alpha`` first. A result type of a wider category than this tensor's dtype
(a float operand for an integer tensor) raises ``DTypeError``.
"""


def _install() -> None:
    from .. import ops as F
    from . import _inplace, _views
    from ._indexing import getitem
    from ._inplace import fast_binary_, inplace, setitem

    T: Any = Tensor
    T.__add__ = lambda a, b: F.add(a, b)
    T.__radd__ = lambda a, b: F.add(b, a)
    T.__sub__ = lambda a, b: F.sub(a, b)
    T.__rsub__ = lambda a, b: F.sub(b, a)
    T.__mul__ = lambda a, b: F.mul(a, b)
    T.__rmul__ = lambda a, b: F.mul(b, a)
    T.__truediv__ = lambda a, b: F.div(a, b)
    T.__rtruediv__ = lambda a, b: F.div(b, a)
    T.__pow__ = lambda a, b: F.pow(a, b)
    T.__rpow__ = lambda a, b: F.pow(b, a)
    T.__floordiv__ = lambda a, b: F.floor_divide(a, b)
    T.__mod__ = lambda a, b: F.remainder(a, b)
    T.__matmul__ = lambda a, b: F.matmul(a, b)
    T.__rmatmul__ = lambda a, b: F.matmul(b, a)
    T.__neg__ = lambda a: F.neg(a)
    T.__abs__ = lambda a: F.abs(a)
    T.__pos__ = lambda a: a
    T.__invert__ = lambda a: F.logical_not(a) if a.dtype is dt.bool_ else _bad_invert(a)
    T.__and__ = lambda a, b: F.logical_and(a, b)
    T.__or__ = lambda a, b: F.logical_or(a, b)
    T.__eq__ = lambda a, b: F.eq(a, b)
    T.__ne__ = lambda a, b: F.ne(a, b)
    T.__lt__ = lambda a, b: F.lt(a, b)
    T.__le__ = lambda a, b: F.le(a, b)
    T.__gt__ = lambda a, b: F.gt(a, b)
    T.__ge__ = lambda a, b: F.ge(a, b)
    T.__getitem__ = getitem
    T.__setitem__ = setitem

    methods = _pointwise_methods(False, 1) + _pointwise_methods(False, 2)
    for name in (
        *methods,
        "relu",
        "clamp",
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
        "clone",
        "contiguous",
        "detach",
        "to",
        "softmax",
        "log_softmax",
        "split",
        "chunk",
        "topk",
    ):
        setattr(T, name, getattr(F, name))
    T.slice = F.slice_

    def transposed(a: Tensor) -> Tensor:
        """This tensor with its dims in reverse order, as a view (no copy): the transpose of a matrix.

        A 0-d or 1-d tensor comes back as a view of itself; an n-d one is ``permute(n-1, ..., 0)``.
        """
        return _views.permute(a, tuple(reversed(range(a.ndim)))) if a.ndim != 2 else _views.transpose(a, 0, 1)

    def matrix_transposed(a: Tensor) -> Tensor:
        """The last two dims swapped, as a view: each matrix of a batch transposed (``transpose(-2, -1)``).

        A tensor with fewer than 2 dims raises ``kael.IndexError_``.
        """
        return _views.transpose(a, -2, -1)

    T.T = property(transposed)
    T.mT = property(matrix_transposed)

    def where(a: Tensor, cond: Tensor, other: Any) -> Tensor:
        """This tensor where the bool tensor ``cond`` is True, else ``other``: ``kael.where(cond, self, other)``."""
        return F.where(cond, a, other)

    def expand_as(a: Tensor, other: Tensor) -> Tensor:
        """``self.expand(other.shape)``: a broadcast view with ``other``'s shape (stride 0 along expanded dims)."""
        return _views.expand(a, other.shape)

    def view_as(a: Tensor, other: Tensor) -> Tensor:
        """``self.view(other.shape)``: a view with ``other``'s shape; ``ShapeError`` when the strides allow no view."""
        return _views.view(a, other.shape)

    def reshape_as(a: Tensor, other: Tensor) -> Tensor:
        """``self.reshape(other.shape)``: this tensor in ``other``'s shape, a view if the strides allow, else a copy."""
        return _views.reshape(a, other.shape)

    def type_as(a: Tensor, other: Tensor) -> Tensor:
        """This tensor cast to ``other``'s dtype (itself when it has that dtype already); the device stays."""
        return _inplace.to(a, dtype=other.dtype)

    def cpu(a: Tensor) -> Tensor:
        """This tensor on the CPU: itself when it is there already, else a copy (gradients flow back to it)."""
        return _inplace.to(a, device="cpu")

    def cuda(a: Tensor, index: int = 0) -> Tensor:
        """This tensor on device ``cuda:index``: itself when it is there already, else a copy.

        Raises ``DeviceError`` when no backend serves ``cuda`` (CuPy missing, no such device).
        """
        return _inplace.to(a, device=f"cuda:{index}")

    T.where = where
    T.expand_as = expand_as
    T.view_as = view_as
    T.reshape_as = reshape_as
    T.type_as = type_as
    T.cpu = cpu
    T.cuda = cuda

    def _cast(name: str, d: dt.DType) -> Any:
        def cast(a: Tensor) -> Tensor:
            return _inplace.to(a, dtype=d)

        cast.__name__ = cast.__qualname__ = name
        rule = "" if d.is_floating_point else " (nonzero becomes True)" if d is dt.bool_ else " (floats round toward 0)"
        cast.__doc__ = (
            f"This tensor cast to {d.name} (``self.to(kael.{d.name})``): itself when it has that dtype already, "
            f"else a new tensor{rule}."
        )
        return cast

    for nm, d in (
        ("float", dt.float32),
        ("double", dt.float64),
        ("half", dt.float16),
        ("bfloat16", dt.bfloat16),
        ("long", dt.int64),
        ("int", dt.int32),
        ("bool", dt.bool_),
        ("byte", dt.uint8),
    ):
        setattr(T, nm, _cast(nm, d))

    def _inplace_bin(name: str) -> Any:
        fn = getattr(F, name)

        def method(a: Tensor, other: Any, alpha: Any = None) -> Tensor:
            # alpha 1 with a float tensor is the tensor itself: no multiply (an op per call in optimizer loops)
            if alpha is not None and not (
                type(alpha) in (int, float)
                and alpha == 1
                and isinstance(other, Tensor)
                and other.dtype.is_floating_point
            ):
                other = F.mul(other, alpha)
            r = fast_binary_(a, name, other)
            if r is not None:
                return r
            return inplace(a, name + "_", lambda: fn(_original(name, a, other), other))

        method.__name__ = method.__qualname__ = name + "_"
        method.__doc__ = _INPLACE_DOC.format(call=f"kael.{name}(self, other)") + _INPLACE_BINARY_DOC
        return method

    for name in _pointwise_methods(True, 2):
        setattr(T, name + "_", _inplace_bin(name))
    T.__iadd__ = T.add_
    T.__isub__ = T.sub_
    T.__imul__ = T.mul_
    T.__itruediv__ = T.div_

    def _inplace_un(name: str) -> Any:
        fn = getattr(F, name)

        def method(a: Tensor, *args: Any, **kw: Any) -> Tensor:
            return inplace(a, name + "_", lambda: fn(_original(name, a), *args, **kw))

        call = {"clamp": "kael.clamp(self, min, max)"}.get(name, f"kael.{name}(self)")
        method.__name__ = method.__qualname__ = name + "_"
        method.__doc__ = _INPLACE_DOC.format(call=call)
        return method

    for name in (*_pointwise_methods(True, 1), "relu", "clamp"):
        setattr(T, name + "_", _inplace_un(name))
    T.copy_ = _inplace.copy_
    T.fill_ = _inplace.fill_

    def zero_(a: Tensor) -> Tensor:
        """Set every element of this tensor to 0 in place (``fill_(0)``); returns this tensor."""
        return _inplace.fill_(a, 0)

    T.zero_ = zero_

    def requires_grad_(a: Tensor, requires_grad: bool = True) -> Tensor:
        """Set whether autograd records operations on this (floating-point) tensor; returns the tensor."""
        if requires_grad and not a.dtype.is_floating_point:
            raise DTypeError(f"requires_grad_: only floating-point tensors can require gradients, got {a.dtype!r}")
        if a.grad_fn is not None and not requires_grad:
            raise AutogradError("requires_grad_: cannot turn off requires_grad on a non-leaf tensor; use detach()")
        if STATE.inference and requires_grad:
            raise AutogradError("requires_grad_: not allowed inside inference_mode")
        a.requires_grad = bool(requires_grad)
        return a

    T.requires_grad_ = requires_grad_

    def backward(a: Tensor, gradient: Any = None, retain_graph: bool = False) -> None:
        """Compute the gradients of this tensor with respect to the graph's leaves, accumulated into their ``.grad``.

        A non-scalar tensor needs ``gradient`` (of its shape); ``retain_graph`` keeps the graph for another backward.
        """
        from ..autograd._engine import run_backward

        run_backward((a,), (gradient,), retain_graph)

    T.backward = backward

    def register_hook(a: Tensor, fn: Any) -> Any:
        """Call ``fn(grad)`` with this tensor's gradient during backward (a returned tensor replaces it).

        Returns a handle whose ``remove()`` unregisters the hook.
        """
        if not a.requires_grad:
            raise AutogradError("register_hook: cannot register a hook on a tensor that doesn't require grad")
        if a.grad_fn is None:
            if a._hooks is None:
                a._hooks = []
            a._hooks.append(fn)
            hooks = a._hooks
        else:
            a.grad_fn.register_prehook(a._output_nr, fn)
            hooks = a.grad_fn._pre_hooks[a._output_nr]  # type: ignore[index]

        class _Handle:
            def remove(self) -> None:
                if fn in hooks:
                    hooks.remove(fn)

        return _Handle()

    T.register_hook = register_hook

    def retain_grad(a: Tensor) -> None:
        """Keep this non-leaf tensor's gradient in ``.grad`` after backward (leaves keep theirs anyway)."""
        if a.grad_fn is None:
            return
        node = a.grad_fn
        if node._retained is None:
            node._retained = {}
        node._retained[a._output_nr] = a
        a._retains_grad = True

    T.retain_grad = retain_grad


def _saves_input(name: str) -> bool:
    """Whether op name's backward reads its (first) input itself (clamp: through maximum/minimum)."""
    fn = FUNCTIONS.get(name)
    return name == "clamp" or bool(getattr(fn, "saves_input", False))


def _original(name: str, a: Tensor, other: Any = None) -> Tensor:
    """The operand an in-place op computes from: a copy when recording an op that saves it for
    backward, since the write would invalidate it (PyTorch saves ``original_self`` the same way)."""
    if _saves_input(name) and STATE.enabled and (a.requires_grad or getattr(other, "requires_grad", False)):
        from ._inplace import clone

        return clone(a)
    return a


def _bad_invert(a: Tensor) -> Tensor:
    raise DTypeError(f"~: bitwise not is only supported for bool tensors, got {a.dtype!r}")


_install()
