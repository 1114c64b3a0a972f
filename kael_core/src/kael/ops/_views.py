"""View ops: new Tensors over the same storage, never touching a backend.

view/reshape, permute/transpose/T, expand, squeeze/unsqueeze, flatten, slice,
narrow and select (the basic part of ``__getitem__`` is in ``_basic_index.py``). Each is a Function so
gradients flow back: injective views scatter the gradient into zeros of the
input's shape through the same view; expand sums it back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .. import _dispatch
from .. import _dtype as dt
from .._errors import DTypeError, IndexError_, ShapeError
from .._tensor import Tensor, contiguous_strides
from ..autograd._function import Function
from ._core import empty, numel, wrap_dims

__all__ = [
    "make_view",
    "reshape_nograd",
    "reshape",
    "view",
    "view_dtype",
    "permute",
    "transpose",
    "expand",
    "squeeze",
    "unsqueeze",
    "flatten",
    "slice_",
    "select",
    "narrow",
    "contiguous_nograd",
]


def _need_tensor(a: Any, op: str) -> None:
    if not isinstance(a, Tensor):
        raise DTypeError(f"{op}: expected a tensor, got {type(a).__name__}")


def make_view(t: Tensor, shape: tuple[int, ...], strides: tuple[int, ...], offset: int) -> Tensor:
    v = Tensor._make(t._storage, shape, strides, offset, t.dtype, t._base if t._base is not None else t)
    return v


def contiguous_nograd(t: Tensor) -> Tensor:
    if t.is_contiguous():
        return t
    out = empty(t.shape, t.dtype, t.device)
    _dispatch.kernel(t.device.type, "copy")(out, t)
    return out


def _infer_shape(shape: Any, n: int, op: str) -> tuple[int, ...]:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    shape = tuple(int(s) if not isinstance(s, bool) and isinstance(s, int) else _bad(shape, op) for s in shape)
    if shape.count(-1) > 1:
        raise ShapeError(f"{op}: only one dimension can be -1, got {list(shape)}")
    if any(s < -1 for s in shape):
        raise ShapeError(f"{op}: invalid shape {list(shape)}")
    if -1 in shape:
        known = numel(tuple(s for s in shape if s != -1))
        if known == 0 or n % known:
            raise ShapeError(f"{op}: shape {list(shape)} is invalid for input of size {n}")
        shape = tuple(n // known if s == -1 else s for s in shape)
    if numel(shape) != n:
        raise ShapeError(f"{op}: shape {list(shape)} is invalid for input of size {n}")
    return shape  # type: ignore[no-any-return]


def _bad(shape: Any, op: str) -> int:
    raise ShapeError(f"{op}: shape entries must be ints, got {shape!r}")


def _view_strides(old: tuple[int, ...], olds: tuple[int, ...], new: tuple[int, ...]) -> tuple[int, ...] | None:
    """Strides viewing (old, olds) as shape new without copying, or None (PyTorch's computeStride)."""
    if numel(old) == 0 or not old:
        return contiguous_strides(new)
    newstride = [0] * len(new)
    view_d = len(new) - 1
    chunk = olds[-1]
    tnumel = 1
    vnumel = 1
    for td in range(len(old) - 1, -1, -1):
        tnumel *= old[td]
        if td == 0 or (old[td - 1] != 1 and olds[td - 1] != tnumel * chunk):
            while view_d >= 0 and (vnumel < tnumel or new[view_d] == 1):
                newstride[view_d] = vnumel * chunk
                vnumel *= new[view_d]
                view_d -= 1
            if vnumel != tnumel:
                return None
            if td > 0:
                chunk = olds[td - 1]
                tnumel = 1
                vnumel = 1
    if view_d != -1:
        return None
    return tuple(newstride)


def reshape_nograd(t: Tensor, shape: tuple[int, ...]) -> Tensor:
    if t.shape == shape:
        return t
    st = _view_strides(t.shape, t._strides, shape)
    if st is None:
        t = contiguous_nograd(t)
        st = contiguous_strides(shape)
    return make_view(t, shape, st, t._offset)


class Reshape(Function):
    @staticmethod
    def forward(ctx: Any, a: Tensor, shape: tuple[int, ...]) -> Tensor:
        ctx.in_shape = a.shape
        return reshape_nograd(a, shape)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> Any:
        return reshape_nograd(g, ctx.in_shape)


class View(Reshape):
    pass


def reshape(a: Tensor, *shape: Any) -> Tensor:
    """``a`` in another shape of as many elements (one dim may be -1): a view when the strides allow, else a copy."""
    _need_tensor(a, "reshape")
    s = _infer_shape(shape, a.numel(), "reshape")
    return Reshape.apply(a, s)  # type: ignore[no-any-return]


def view_dtype(a: Tensor, dtype: dt.DType) -> Tensor:
    """a's bytes reinterpreted as elements of `dtype` (PyTorch's ``Tensor.view(dtype)``); no copy, no backend.

    Storage is bytes, so this is metadata only. With a different item size the last dim
    must have stride 1 (its size scales by the ratio of the item sizes), and for a larger
    item the last size, the other strides and the offset must divide by the ratio. The
    result carries no gradient (the values are reinterpreted, not computed).
    """
    _need_tensor(a, "view")
    if not isinstance(dtype, dt.DType):
        raise DTypeError(f"view: expected a kael dtype, got {dtype!r}")
    old, new = a.dtype.itemsize, dtype.itemsize
    if old == new:
        return Tensor._make(a._storage, a.shape, a._strides, a._offset, dtype, a._base if a._base is not None else a)
    what = f"view: cannot view a {a.dtype!r} tensor of shape {list(a.shape)}, strides {list(a._strides)} as {dtype!r}"
    if a.ndim == 0:
        raise ShapeError(f"{what}: a 0-d tensor can only be viewed as a dtype of the same item size ({old} bytes)")
    if a._strides[-1] != 1 and a.shape[-1] != 1:
        raise ShapeError(f"{what}: the last dim must have stride 1, got {a._strides[-1]}")
    if new < old:
        r = old // new
        shape = a.shape[:-1] + (a.shape[-1] * r,)
        strides = tuple(s * r for s in a._strides[:-1]) + (1,)
        offset = a._offset * r
    else:
        r = new // old
        if a.shape[-1] % r or any(s % r for s in a._strides[:-1]) or a._offset % r:
            raise ShapeError(
                f"{what}: the last size {a.shape[-1]}, the other strides and the offset {a._offset} must be "
                f"multiples of {r} (the ratio of the item sizes {new} / {old})"
            )
        shape = a.shape[:-1] + (a.shape[-1] // r,)
        strides = tuple(s // r for s in a._strides[:-1]) + (1,)
        offset = a._offset // r
    return Tensor._make(a._storage, shape, strides, offset, dtype, a._base if a._base is not None else a)


def view(a: Tensor, *shape: Any) -> Tensor:
    """a with a new shape over the same storage (``view(dtype)``: the bytes as another dtype, see view_dtype)."""
    _need_tensor(a, "view")
    if len(shape) == 1 and isinstance(shape[0], dt.DType):
        return view_dtype(a, shape[0])
    s = _infer_shape(shape, a.numel(), "view")
    if _view_strides(a.shape, a._strides, s) is None:
        raise ShapeError(
            f"view: shape {list(s)} is not compatible with input shape {list(a.shape)} and strides "
            f"{list(a._strides)} (at least one dimension spans two contiguous subspaces); "
            "use reshape() instead"
        )
    return View.apply(a, s)  # type: ignore[no-any-return]


class Permute(Function):
    @staticmethod
    def forward(ctx: Any, a: Tensor, dims: tuple[int, ...]) -> Tensor:
        ctx.dims = dims
        return make_view(a, tuple(a.shape[d] for d in dims), tuple(a._strides[d] for d in dims), a._offset)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> Any:
        inv = [0] * len(ctx.dims)
        for i, d in enumerate(ctx.dims):
            inv[d] = i
        return make_view(g, tuple(g.shape[d] for d in inv), tuple(g._strides[d] for d in inv), g._offset)


class Transpose(Permute):
    pass


def permute(a: Tensor, *dims: Any) -> Tensor:
    """A view of ``a`` with its dims reordered as ``dims``."""
    _need_tensor(a, "permute")
    if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
        dims = tuple(dims[0])
    if len(dims) != a.ndim:
        raise ShapeError(f"permute: got {len(dims)} dims {list(dims)} for a {a.ndim}-d tensor")
    d = wrap_dims(dims, a.ndim, "permute")
    return Permute.apply(a, d)  # type: ignore[no-any-return]


def transpose(a: Tensor, dim0: int, dim1: int) -> Tensor:
    """A view of ``a`` with dims dim0 and dim1 swapped."""
    _need_tensor(a, "transpose")
    if a.ndim == 0:
        wrap_dims((dim0, dim1), 0, "transpose")
        return a
    d0, d1 = (a._wrap_dim(dim0, "transpose"), a._wrap_dim(dim1, "transpose"))
    order = list(range(a.ndim))
    order[d0], order[d1] = order[d1], order[d0]
    return Transpose.apply(a, tuple(order))  # type: ignore[no-any-return]


class Expand(Function):
    @staticmethod
    def forward(ctx: Any, a: Tensor, shape: tuple[int, ...]) -> Tensor:
        ctx.in_shape = a.shape
        from ._core import expand_to

        return expand_to(a, shape)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> Any:
        from ._pointwise import sum_to

        return sum_to(g, ctx.in_shape)


def expand(a: Tensor, *shape: Any) -> Tensor:
    """A view of ``a`` broadcast to ``shape`` (size-1 dims repeat with stride 0; -1 keeps a dim)."""
    _need_tensor(a, "expand")
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    if len(shape) < a.ndim:
        raise ShapeError(f"expand: the number of sizes {len(shape)} must be >= the tensor's dims {a.ndim}")
    n = len(shape) - a.ndim
    out = []
    for i, s in enumerate(shape):
        if isinstance(s, bool) or not isinstance(s, int):
            raise ShapeError(f"expand: sizes must be ints, got {list(shape)}")
        if i < n:
            if s < 0:
                raise ShapeError(f"expand: size -1 is not allowed in a new leading dimension ({list(shape)})")
            out.append(s)
            continue
        cur = a.shape[i - n]
        if s == -1:
            s = cur
        if cur != s and cur != 1:
            raise ShapeError(
                f"expand: the size {cur} of dimension {i - n} of shape {list(a.shape)} must match {s} or be 1"
            )
        out.append(s)
    return Expand.apply(a, tuple(out))  # type: ignore[no-any-return]


class _Strided(Function):
    """An injective view given by fn(tensor) -> view; backward scatters into zeros."""

    @classmethod
    def forward(cls, ctx: Any, a: Tensor, fn: Callable[[Tensor], Tensor]) -> Tensor:
        ctx.fn, ctx.in_shape = fn, a.shape
        return fn(a)

    @classmethod
    def backward(cls, ctx: Any, g: Tensor) -> Any:
        z = empty(ctx.in_shape, g.dtype, g.device)
        _dispatch.kernel(g.device.type, "fill")(z, 0)
        _dispatch.kernel(g.device.type, "copy")(ctx.fn(z), g)
        return z


class Slice(_Strided):
    pass


class Select(_Strided):
    pass


class Squeeze(Reshape):
    pass


class Unsqueeze(Reshape):
    pass


class Index(_Strided):
    pass


def _slice_fn(dim: int, start: int, stop: int, step: int) -> Callable[[Tensor], Tensor]:
    def fn(t: Tensor) -> Tensor:
        n = max(0, (stop - start + step - 1) // step)
        shape = t.shape[:dim] + (n,) + t.shape[dim + 1 :]
        strides = t._strides[:dim] + (t._strides[dim] * step,) + t._strides[dim + 1 :]
        return make_view(t, shape, strides, t._offset + (start * t._strides[dim] if n else 0))

    return fn


def _norm_slice(s: slice, n: int, op: str) -> tuple[int, int, int]:
    for v in (s.start, s.stop, s.step):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            if isinstance(v, Tensor):
                continue
            raise IndexError_(f"{op}: slice indices must be ints or None, got {s!r}")
    step = 1 if s.step is None else int(s.step)
    if step <= 0:
        raise IndexError_(f"{op}: slice step must be positive, got {step}")
    start, stop, _ = slice(s.start, s.stop, step).indices(n)
    return start, max(stop, start), step


def slice_(a: Tensor, dim: int, start: int | None = None, stop: int | None = None, step: int = 1) -> Tensor:
    """A view of ``a[start:stop:step]`` along ``dim``."""
    _need_tensor(a, "slice")
    d = a._wrap_dim(dim, "slice")
    if a.ndim == 0:
        raise IndexError_("slice: cannot slice a 0-d tensor")
    st, sp, se = _norm_slice(slice(start, stop, step), a.shape[d], "slice")
    return Slice.apply(a, _slice_fn(d, st, sp, se))  # type: ignore[no-any-return]


def narrow(a: Tensor, dim: int, start: int, length: int) -> Tensor:
    """A view of ``length`` entries of ``a`` from ``start`` along ``dim``."""
    _need_tensor(a, "narrow")
    if a.ndim == 0:
        raise IndexError_("narrow: cannot narrow a 0-d tensor")
    for name, v in (("start", start), ("length", length)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise DTypeError(f"narrow: {name} must be an int, got {v!r}")
    d = a._wrap_dim(dim, "narrow")
    n = a.shape[d]
    if start < 0:
        start += n
    if start < 0 or length < 0 or start + length > n:
        raise IndexError_(f"narrow: start {start} + length {length} exceeds dimension {d} of size {n}")
    return Slice.apply(a, _slice_fn(d, start, start + length, 1))  # type: ignore[no-any-return]


def _select_fn(dim: int, index: int) -> Callable[[Tensor], Tensor]:
    def fn(t: Tensor) -> Tensor:
        return make_view(
            t,
            t.shape[:dim] + t.shape[dim + 1 :],
            t._strides[:dim] + t._strides[dim + 1 :],
            t._offset + index * t._strides[dim],
        )

    return fn


def select(a: Tensor, dim: int, index: int) -> Tensor:
    """A view of ``a`` at ``index`` along ``dim``, with that dim removed."""
    _need_tensor(a, "select")
    if a.ndim == 0:
        raise IndexError_("select: cannot select from a 0-d tensor")
    d = a._wrap_dim(dim, "select")
    if isinstance(index, bool) or not isinstance(index, int):
        raise DTypeError(f"select: index must be an int, got {index!r}")
    n = a.shape[d]
    if index < -n or index >= n:
        raise IndexError_(f"select: index {index} is out of bounds for dimension {d} with size {n}")
    return Select.apply(a, _select_fn(d, index % n if n else 0))  # type: ignore[no-any-return]


def squeeze(a: Tensor, dim: Any = None) -> Tensor:
    """A view of ``a`` without its size-1 dims (all of them, or ``dim``'s)."""
    _need_tensor(a, "squeeze")
    if dim is None:
        dims = tuple(i for i, n in enumerate(a.shape) if n == 1)
    else:
        dims = tuple(d for d in wrap_dims(dim, a.ndim, "squeeze") if a.shape[d] == 1)
    shape = tuple(n for i, n in enumerate(a.shape) if i not in dims)
    return Squeeze.apply(a, shape)  # type: ignore[no-any-return]


def unsqueeze(a: Tensor, dim: int) -> Tensor:
    """A view of ``a`` with a new size-1 dim at position ``dim``."""
    _need_tensor(a, "unsqueeze")
    n = a.ndim + 1
    if isinstance(dim, bool) or not isinstance(dim, int) or not -n <= dim < n:
        raise IndexError_(f"unsqueeze: dim {dim!r} is out of range for a result with {n} dims (expected {-n}..{n - 1})")
    d = dim + n if dim < 0 else dim
    shape = a.shape[:d] + (1,) + a.shape[d:]
    return Unsqueeze.apply(a, shape)  # type: ignore[no-any-return]


def flatten(a: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    """``a`` with dims start_dim..end_dim merged into one (a view when the strides allow)."""
    _need_tensor(a, "flatten")
    if a.ndim == 0:
        return reshape(a, 1)
    s = a._wrap_dim(start_dim, "flatten")
    e = a._wrap_dim(end_dim, "flatten")
    if s > e:
        raise ShapeError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim}")
    shape = a.shape[:s] + (numel(a.shape[s : e + 1]),) + a.shape[e + 1 :]
    return reshape(a, shape)
