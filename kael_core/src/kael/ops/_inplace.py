"""In-place ops, __setitem__, copies and conversions (clone, contiguous, to, detach).

In-place ops bump the storage version counter (NOTE [version counter]). With
autograd, an in-place op on a tensor computes the result out of place with its
graph, writes it back, and hands the tensor the result's grad_fn; on a view, the
base takes a ``CopySlices`` node so gradients flow through both.
"""

from __future__ import annotations

from typing import Any

from .. import _dispatch
from .. import _dtype as dt
from .._device import as_device
from .._errors import AutogradError, DTypeError, ShapeError
from .._tensor import Tensor
from ..autograd._function import Function
from ..autograd._grad_mode import STATE
from ._core import as_tensor_like, broadcast_shapes, cast, empty, expand_to, int_in_range
from ._views import _Strided, contiguous_nograd, make_view

__all__ = ["inplace", "copy_", "fill_", "setitem", "clone", "contiguous", "to", "detach"]


def _as_strided_fn(shape: tuple[int, ...], strides: tuple[int, ...], offset: int) -> Any:
    def fn(t: Tensor) -> Tensor:
        return make_view(t, shape, strides, t._offset + offset)

    return fn


class CopySlices(Function):
    @staticmethod
    def forward(ctx: Any, base: Tensor, value: Tensor, fn: Any) -> Tensor:
        ctx.fn = fn
        out = empty(base.shape, base.dtype, base.device)
        _dispatch.kernel(base.device.type, "copy")(out, base)
        _dispatch.kernel(base.device.type, "copy")(fn(out), value)
        return out

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> Any:
        gb = empty(g.shape, g.dtype, g.device)
        _dispatch.kernel(g.device.type, "copy")(gb, g)
        _dispatch.kernel(g.device.type, "fill")(ctx.fn(gb), 0)
        gv = contiguous_nograd(ctx.fn(g)) if ctx.needs_input_grad[1] else None
        return gb, gv, None


def _check_leaf(t: Tensor, op: str) -> None:
    if t.requires_grad and t.grad_fn is None and STATE.enabled:
        raise AutogradError(
            f"{op}: a leaf tensor that requires grad is being used in an in-place operation; "
            "wrap it in kael.no_grad() or operate on a clone"
        )


def _rebase(t: Tensor, r: Tensor, op: str) -> None:
    """Give t (already holding r's values) r's autograd history."""
    base = t._base
    if base is None or base is t:
        t.grad_fn = r.grad_fn
        t._output_nr = r._output_nr
        t.requires_grad = r.requires_grad
        return
    _check_leaf(base, op)
    if not base.is_contiguous():
        raise AutogradError(f"{op}: in-place update of a view whose base is not contiguous cannot be differentiated")
    fn = _as_strided_fn(t.shape, t._strides, t._offset - base._offset)
    new_base = CopySlices.apply(base, r, fn)
    base.grad_fn = new_base.grad_fn
    base._output_nr = 0
    base.requires_grad = True
    nv = _Strided.apply(base, fn)
    t.grad_fn = nv.grad_fn
    t._output_nr = 0
    t.requires_grad = True


def inplace(t: Tensor, op: str, compute: Any) -> Tensor:
    """Run compute() -> result and store it into t in place, keeping autograd correct."""
    if not isinstance(t, Tensor):
        raise DTypeError(f"{op}: expected a tensor, got {type(t).__name__}")
    if not t._np_writable():
        raise DTypeError(f"{op}: tensor memory is read-only (e.g. a memory-mapped file); clone() it first")
    r = compute()
    if r.shape != t.shape:
        if broadcast_shapes(t.shape, r.shape, op) != t.shape:
            raise ShapeError(f"{op}: result of shape {list(r.shape)} cannot be written into shape {list(t.shape)}")
    track = STATE.enabled and (r.requires_grad or t.requires_grad)
    if track:  # refuse before anything is written
        _check_leaf(t, op)
        base = t._base
        if base is not None and base is not t:
            _check_leaf(base, op)
            if not base.is_contiguous():
                raise AutogradError(
                    f"{op}: in-place update of a view whose base is not contiguous cannot be differentiated"
                )
    prev = STATE.enabled
    STATE.enabled = False
    try:
        src = _unaliased(t, expand_to(r, t.shape))
        _dispatch.kernel(t.device.type, "copy")(t, src)
    finally:
        STATE.enabled = prev
    t._bump_version()
    if track:
        if r.shape != t.shape:
            from ._views import expand

            r = expand(r, t.shape)
        if r.dtype is not t.dtype:
            from . import _convert

            r = _convert.Cast.apply(r, t.dtype)
        _rebase(t, r, op)
    return t


def _unaliased(out: Tensor, src: Tensor) -> Tensor:
    """src, or a copy of it when it shares memory with out in another layout.

    NOTE [partial overlap]: kernels may read and write element by element in any order,
    so an operand that overlaps the output only partly (``t[1:].add_(t[:-1])``) is copied
    first; the result is then what NumPy gives, on every backend. The same view of the same
    memory (``t.add_(t)``) is safe and is not copied.
    """
    if src._storage is not out._storage or (src._offset == out._offset and src._strides == out._strides):
        return src
    copy = empty(src.shape, src.dtype, src.device)
    _dispatch.kernel(src.device.type, "copy")(copy, src)
    return copy


def fast_binary_(t: Tensor, op: str, other: Any) -> Tensor | None:
    """The no-autograd in-place path: kernel(out=t, t, other) with no temporary."""
    if STATE.enabled and (t.requires_grad or (isinstance(other, Tensor) and other.requires_grad)):
        return None
    if not t._np_writable():
        return None
    if op == "div" and not t.dtype.is_floating_point:
        return None
    ctype = dt.result_type(t, other)
    if ctype is not t.dtype and not (ctype.category <= t.dtype.category):
        raise DTypeError(f"{op}_: result type {ctype!r} can't be cast to the desired output type {t.dtype!r}")
    if isinstance(other, Tensor):
        broadcast_shapes(t.shape, other.shape, op)
        if broadcast_shapes(t.shape, other.shape, op) != t.shape:
            raise ShapeError(f"{op}_: operand of shape {list(other.shape)} doesn't broadcast to {list(t.shape)}")
    b = _unaliased(t, expand_to(as_tensor_like(other, t.dtype, t.device, op), t.shape))
    _dispatch.kernel(t.device.type, op)(t, t, b)
    t._bump_version()
    return t


def copy_(t: Tensor, src: Any) -> Tensor:
    """Copy ``src`` (a tensor, broadcast and cast to t, or a number) into t's elements in place; returns t."""
    if isinstance(src, Tensor) and src.device is not t.device:
        src = to(src, device=t.device)
    if isinstance(src, Tensor):
        if broadcast_shapes(t.shape, src.shape, "copy_") != t.shape:
            raise ShapeError(f"copy_: source of shape {list(src.shape)} doesn't broadcast to {list(t.shape)}")
        return inplace(t, "copy_", lambda: src)
    return fill_(t, src)


def fill_(t: Tensor, value: Any) -> Tensor:
    """Set every element of t to ``value`` (a number, or a one-element tensor) in place; returns t."""
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise ShapeError(f"fill_: value tensor must have one element, got shape {list(value.shape)}")
        from ._views import reshape

        value = reshape(value, ())  # a one-element tensor of any shape fills like its item
        return inplace(
            t, "fill_", lambda: expand_to(cast(value, t.dtype), t.shape) if not value.requires_grad else value
        )
    if not isinstance(value, (bool, int, float)):
        raise DTypeError(f"fill_: value must be a number, got {type(value).__name__}")
    if not (STATE.enabled and t.requires_grad):
        _dispatch.kernel(t.device.type, "fill")(t, int_in_range(value, t.dtype, "fill_", wrap=False))
        t._bump_version()
        return t
    from ._creation import full

    return inplace(t, "fill_", lambda: full(t.shape, value, dtype=t.dtype, device=t.device))


def setitem(t: Tensor, key: Any, value: Any) -> None:
    from ._indexing import _is_advanced, getitem

    keys = key if isinstance(key, tuple) else (key,)
    if any(_is_advanced(k) for k in keys):
        _setitem_advanced(t, keys, value)
        return
    target = getitem(t, key)
    if isinstance(value, Tensor):
        copy_(target, value)
    else:
        fill_(target, value)


def _setitem_advanced(t: Tensor, keys: tuple[Any, ...], value: Any) -> None:
    """t[key] = value with integer/bool index tensors anywhere in key (PyTorch's index_put_; last write wins).

    A full-shape boolean mask with a scalar is one where(). Otherwise the key is applied to the element
    numbers of t (an arange in t's shape), which gives the positions it selects in the shape value must
    broadcast to; each position takes the element written last, gathered with index_select (so gradients
    reach value) and merged with where() (so they reach t), then written back in place.
    """
    import numpy as np

    from ._creation import arange, tensor
    from ._indexing import _to_index_tensor, getitem, index_select
    from ._pointwise import Where
    from ._views import expand, reshape, reshape_nograd

    if isinstance(value, Tensor) and value.device is not t.device:
        from .._errors import DeviceError

        raise DeviceError(f"setitem: value is on {value.device}, the tensor on {t.device}")
    if not isinstance(value, (Tensor, bool, int, float)):
        raise DTypeError(f"setitem: value must be a tensor or a Python number, got {type(value).__name__}")
    if len(keys) == 1 and not isinstance(value, Tensor):
        mask = _to_index_tensor(keys[0], t.device)
        if mask.dtype is dt.bool_ and mask.shape == t.shape:
            copy_(t, Where.apply(mask, value, t))
            return
    numbers = reshape_nograd(arange(t.numel(), device=t.device), t.shape)
    pos = getitem(numbers, keys if len(keys) > 1 else keys[0])
    flat_pos = np.asarray(pos.tolist(), dtype=np.int64).reshape(-1)
    if flat_pos.size == 0:
        return
    src = np.full(t.numel(), -1, dtype=np.int64)
    src[flat_pos] = np.arange(flat_pos.size)  # NumPy assigns repeated positions in order: the last one wins
    hit = reshape_nograd(tensor(src >= 0, device=t.device), t.shape)
    if isinstance(value, Tensor):
        if broadcast_shapes(value.shape, pos.shape, "setitem") != pos.shape:
            raise ShapeError(
                f"setitem: shape mismatch: value tensor of shape {list(value.shape)} cannot be "
                f"broadcast to indexing result of shape {list(pos.shape)}"
            )
        flat_v = reshape(expand(value, pos.shape) if value.shape != pos.shape else value, (-1,))
        which = tensor(np.maximum(src, 0), device=t.device)
        value = reshape(index_select(flat_v, 0, which), t.shape)
    copy_(t, Where.apply(hit, value, t))


class Clone(Function):
    @staticmethod
    def forward(ctx: Any, a: Tensor) -> Tensor:
        out = empty(a.shape, a.dtype, a.device)
        _dispatch.kernel(a.device.type, "copy")(out, a)
        return out

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> Any:
        return g


def clone(a: Tensor) -> Tensor:
    """A copy of ``a`` in new, contiguous memory (gradients flow back to ``a``)."""
    return Clone.apply(a)  # type: ignore[no-any-return]


def contiguous(a: Tensor) -> Tensor:
    """``a`` itself if contiguous, else a contiguous copy."""
    return a if a.is_contiguous() else clone(a)


class ToDevice(Function):
    @staticmethod
    def forward(ctx: Any, a: Tensor, device: Any) -> Tensor:
        ctx.src = a.device
        from .._tensor import numpy_bits
        from ._creation import to_device

        return to_device(numpy_bits(a), a.dtype, device)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> Any:
        return ToDevice.forward(ctx, g, ctx.src), None


def to(a: Tensor, *args: Any, device: Any = None, dtype: Any = None, copy: bool = False) -> Tensor:
    """``a`` on another device and/or in another dtype (positional: a device, a dtype, or a tensor to match).

    ``a`` itself when nothing changes, unless ``copy=True``.
    """
    for x in args:
        if isinstance(x, dt.DType):
            dtype = x
        elif isinstance(x, Tensor):
            dtype, device = x.dtype, x.device
        else:
            device = x
    r = a
    if device is not None and as_device(device) is not a.device:
        r = ToDevice.apply(r, as_device(device))
    if dtype is not None and dt.as_dtype(dtype) is not r.dtype:
        from . import _convert

        r = _convert.Cast.apply(r, dt.as_dtype(dtype))
    if copy and r is a:
        r = clone(a)
    return r


def detach(a: Tensor) -> Tensor:
    """A tensor over the same storage that autograd does not track (no grad_fn, requires_grad False)."""
    return a._alias()
