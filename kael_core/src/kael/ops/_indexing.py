"""Indexing: gather, index_select, cat/stack/split/chunk, advanced __getitem__, index_add, scatter_add."""

from __future__ import annotations

from typing import Any

from .. import _dispatch
from .. import _dtype as dt
from .._errors import DTypeError, IndexError_, ShapeError
from .._tensor import Tensor
from ..autograd._function import Function
from ._basic_index import basic_index
from ._core import cast, check_device, empty, numel
from ._views import _need_tensor, contiguous_nograd, reshape_nograd

__all__ = [
    "gather",
    "index_select",
    "cat",
    "stack",
    "split",
    "chunk",
    "getitem",
    "nonzero",
    "index_add_nograd",
    "scatter_add_nograd",
]


def _check_index(index: Any, op: str, bound: int, dim: int) -> Tensor:
    if not isinstance(index, Tensor) or index.dtype.category != 1:
        raise DTypeError(f"{op}: index must be an integer tensor, got {getattr(index, 'dtype', type(index))!r}")
    if index.dtype is not dt.int64:
        index = cast(index, dt.int64)
    if index.numel():
        from ._reduce import reduce_op

        lo = int(reduce_op("amin", index, tuple(range(index.ndim)), False, dt.int64).item())
        hi = int(reduce_op("amax", index, tuple(range(index.ndim)), False, dt.int64).item())
        if lo < 0 or hi >= bound:
            bad = lo if lo < 0 else hi
            raise IndexError_(f"{op}: index {bad} is out of bounds for dimension {dim} with size {bound}")
    return index  # type: ignore[no-any-return]


def _wrap_negative(index: Tensor, bound: int, dim: int) -> Tensor:
    """Index values in [-bound, bound) as int64 in [0, bound): negatives count from the end (getitem/setitem)."""
    index = cast(index, dt.int64)
    if index.numel():
        from ._pointwise import binary
        from ._reduce import reduce_op

        dims = tuple(range(index.ndim))
        lo = int(reduce_op("amin", index, dims, False, dt.int64).item())
        hi = int(reduce_op("amax", index, dims, False, dt.int64).item())
        if lo < -bound or hi >= bound:
            raise IndexError_(
                f"index {lo if lo < -bound else hi} is out of bounds for dimension {dim} with size {bound}"
            )
        if lo < 0:
            index = binary("add", index, binary("mul", binary("lt", index, 0), bound))
    return index


def _zeros(shape: tuple[int, ...], dtype: dt.DType, device: Any) -> Tensor:
    z = empty(shape, dtype, device)
    _dispatch.kernel(device.type, "fill")(z, 0)
    return z


def index_add_nograd(out: Tensor, dim: int, index: Tensor, src: Tensor) -> Tensor:
    _dispatch.kernel(out.device.type, "index_add")(out, index, src, dim)
    return out


def scatter_add_nograd(out: Tensor, dim: int, index: Tensor, src: Tensor) -> Tensor:
    _dispatch.kernel(out.device.type, "scatter_add")(out, index, src, dim)
    return out


class Gather(Function):
    @staticmethod
    def forward(ctx: Any, a: Tensor, dim: int, index: Tensor) -> Tensor:
        check_device("gather", a, index)
        d = a._wrap_dim(dim, "gather") if a.ndim else 0
        if index.ndim != a.ndim:
            raise ShapeError(f"gather: index has {index.ndim} dims, expected {a.ndim} like the input")
        for i, (n, m) in enumerate(zip(index.shape, a.shape)):
            if i != d and n > m:
                raise ShapeError(
                    f"gather: index shape {list(index.shape)} exceeds input shape {list(a.shape)} at dimension {i}"
                )
        index = _check_index(index, "gather", a.shape[d] if a.ndim else 1, d)
        ctx.save_for_backward(index)
        ctx.shape, ctx.dim = a.shape, d
        out = empty(index.shape, a.dtype, a.device)
        if out.numel():
            _dispatch.kernel(a.device.type, "gather")(out, a, index, d)
        return out

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> Any:
        (index,) = ctx.saved_tensors
        z = _zeros(ctx.shape, g.dtype, g.device)
        return scatter_add_nograd(z, ctx.dim, index, contiguous_nograd(g)), None, None


def gather(a: Tensor, dim: int, index: Tensor) -> Tensor:
    """``out[i][j][k] = a[index[i][j][k]][j][k]`` for dim 0 (likewise for other dims); index has a's ndim."""
    if not isinstance(a, Tensor) or not isinstance(index, Tensor):
        raise DTypeError(
            f"gather: expected a tensor and an integer index tensor, got {type(a).__name__} and {type(index).__name__}"
        )
    return Gather.apply(a, dim, index)  # type: ignore[no-any-return]


class IndexSelect(Function):
    @staticmethod
    def forward(ctx: Any, a: Tensor, dim: int, index: Tensor) -> Tensor:
        check_device("index_select", a, index)
        if not isinstance(index, Tensor) or index.ndim > 1:
            raise ShapeError(
                f"index_select: index must be a 0-d or 1-d integer tensor, got {getattr(index, 'shape', index)!r}"
            )
        d = a._wrap_dim(dim, "index_select")
        index = _check_index(reshape_nograd(index, (index.numel(),)), "index_select", a.shape[d], d)
        ctx.save_for_backward(index)
        ctx.shape, ctx.dim = a.shape, d
        out = empty(a.shape[:d] + (index.shape[0],) + a.shape[d + 1 :], a.dtype, a.device)
        if out.numel():
            _dispatch.kernel(a.device.type, "index_select")(out, a, index, d)
        return out

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> Any:
        (index,) = ctx.saved_tensors
        z = _zeros(ctx.shape, g.dtype, g.device)
        return index_add_nograd(z, ctx.dim, index, contiguous_nograd(g)), None, None


def index_select(a: Tensor, dim: int, index: Tensor) -> Tensor:
    """The entries of ``a`` at positions ``index`` (a 1-d integer tensor) along ``dim``, as a new tensor."""
    _need_tensor(a, "index_select")
    if a.ndim == 0:
        raise IndexError_("index_select: cannot index a 0-d tensor")
    return IndexSelect.apply(a, dim, index)  # type: ignore[no-any-return]


class Cat(Function):
    @staticmethod
    def forward(ctx: Any, dim: int, *ts: Tensor) -> Tensor:
        first = ts[0]
        d = first._wrap_dim(dim, "cat")
        dtype = first.dtype
        for t in ts[1:]:
            dtype = dt.promote_types(dtype, t.dtype)
        check_device("cat", *ts)
        for t in ts:
            if t.ndim != first.ndim or any(i != d and a != b for i, (a, b) in enumerate(zip(t.shape, first.shape))):
                raise ShapeError(
                    f"cat: tensors must have the same shape except in dimension {d}; got "
                    f"{list(first.shape)} and {list(t.shape)}"
                )
        sizes = tuple(t.shape[d] for t in ts)
        ctx.sizes, ctx.dim, ctx.dtypes = sizes, d, tuple(t.dtype for t in ts)
        out = empty(first.shape[:d] + (sum(sizes),) + first.shape[d + 1 :], dtype, first.device)
        if out.numel():
            _dispatch.kernel(first.device.type, "cat")(out, [cast(t, dtype) for t in ts], d)
        return out

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> Any:
        from ._views import _slice_fn

        grads: list[Any] = [None]
        start = 0
        for n, d in zip(ctx.sizes, ctx.dtypes):
            grads.append(cast(_slice_fn(ctx.dim, start, start + n, 1)(g), d))
            start += n
        return tuple(grads)


def cat(tensors: Any, dim: int = 0) -> Tensor:
    """The tensors joined along an existing ``dim`` (their other dims must agree)."""
    ts = list(tensors)
    if not ts or not all(isinstance(t, Tensor) for t in ts):
        raise DTypeError("cat: expected a non-empty sequence of tensors")
    ts = [t for t in ts if not (t.ndim == 1 and t.shape[0] == 0)] or ts[:1]
    if any(t.ndim == 0 for t in ts):
        raise ShapeError("cat: zero-dimensional tensors cannot be concatenated")
    return Cat.apply(dim, *ts)  # type: ignore[no-any-return]


def stack(tensors: Any, dim: int = 0) -> Tensor:
    """The tensors (all of one shape) stacked along a new ``dim``."""
    from ._views import unsqueeze

    ts = list(tensors)
    if not ts or not all(isinstance(t, Tensor) for t in ts):
        raise DTypeError("stack: expected a non-empty sequence of tensors")
    for t in ts:
        if t.shape != ts[0].shape:
            raise ShapeError(
                f"stack: expects each tensor to be equal size, got {list(ts[0].shape)} and {list(t.shape)}"
            )
    n = ts[0].ndim + 1
    if not -n <= dim < n:
        raise IndexError_(f"stack: dim {dim} is out of range for a result with {n} dims")
    return cat([unsqueeze(t, dim) for t in ts], dim)


def split(a: Tensor, split_size_or_sections: Any, dim: int = 0) -> tuple[Tensor, ...]:
    """Views of ``a`` along ``dim``: pieces of one size (an int; the last may be smaller) or of the listed sizes."""
    _need_tensor(a, "split")
    from ._views import narrow

    if a.ndim == 0:
        raise ShapeError("split: expected a tensor with at least one dimension, got a 0-d tensor")
    d = a._wrap_dim(dim, "split")
    n = a.shape[d]
    sec = split_size_or_sections
    if isinstance(sec, bool) or not (
        isinstance(sec, int)
        or (isinstance(sec, (list, tuple)) and all(isinstance(x, int) and not isinstance(x, bool) for x in sec))
    ):
        raise DTypeError(f"split: expected an int split size or a list of int sections, got {sec!r}")
    if isinstance(split_size_or_sections, int):
        s = split_size_or_sections
        if s <= 0 and n:
            raise ShapeError(f"split: split_size must be positive, got {s}")
        sizes = [min(s, n - i) for i in range(0, n, s)] if n else [0]
    else:
        sizes = [int(x) for x in split_size_or_sections]
        if sum(sizes) != n or any(x < 0 for x in sizes):
            raise ShapeError(f"split: sections {sizes} do not sum to dimension {d} of size {n}")
    out = []
    start = 0
    for s in sizes:
        out.append(narrow(a, d, start, s))
        start += s
    return tuple(out)


def chunk(a: Tensor, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
    """``a`` split into ``chunks`` equal views along ``dim`` (the last may be smaller; fewer may come back)."""
    _need_tensor(a, "chunk")
    if isinstance(chunks, bool) or not isinstance(chunks, int):
        raise DTypeError(f"chunk: chunks must be an int, got {chunks!r}")
    if a.ndim == 0:
        raise ShapeError("chunk: expected a tensor with at least one dimension, got a 0-d tensor")
    if chunks <= 0:
        raise ShapeError(f"chunk: chunks must be positive, got {chunks}")
    n = a.shape[a._wrap_dim(dim, "chunk")]
    size = max(1, -(-n // chunks))
    return split(a, size, dim)


def nonzero(mask: Tensor) -> Tensor:
    """The indices of the non-zero (True) elements of ``mask``: an int64 tensor [count, mask.ndim]."""
    _need_tensor(mask, "nonzero")
    m = mask if mask.dtype is dt.bool_ else cast(mask, dt.bool_)
    from ._reduce import reduce_op

    count = int(reduce_op("sum", m, tuple(range(m.ndim)), False, dt.int64).item()) if m.ndim else int(m.item())
    out = empty((count, m.ndim), dt.int64, m.device)
    if count and m.ndim:
        _dispatch.kernel(m.device.type, "nonzero")(out, m)
    return out


def _is_advanced(k: Any) -> bool:
    return isinstance(k, (Tensor, list)) or (hasattr(k, "__array__") and not isinstance(k, (int, float)))


def _to_index_tensor(k: Any, device: Any) -> Tensor:
    if isinstance(k, Tensor):
        t = k
    else:
        from ._creation import tensor

        t = tensor(k, device=device)
    if t.dtype.is_floating_point:
        raise IndexError_(f"index: tensors used as indices must be integer or bool, got {t.dtype!r}")
    return t


def getitem(a: Tensor, key: Any) -> Tensor:
    if not isinstance(key, tuple):
        key = (key,)
    for k in key:
        if not (k is None or k is Ellipsis or isinstance(k, (int, slice)) or _is_advanced(k)):
            raise IndexError_(
                f"index: unsupported index {k!r}; expected ints, slices, None, Ellipsis, or integer/bool tensors"
            )
        if isinstance(k, float):
            raise IndexError_(f"index: float index {k!r}")
    if not any(_is_advanced(k) for k in key):
        return basic_index(a, key)
    adv = [i for i, k in enumerate(key) if _is_advanced(k)]
    if len(adv) == 1 and all(
        k is Ellipsis or (isinstance(k, slice) and k == slice(None)) for i, k in enumerate(key) if i != adv[0]
    ):
        # a single index tensor in one position: index_select (or a boolean mask).
        pos = adv[0]
        ell = [i for i, k in enumerate(key) if k is Ellipsis]
        idx = _to_index_tensor(key[pos], a.device)
        if ell and ell[0] < pos:
            dim = a.ndim - (len(key) - pos - 1) - (idx.ndim if idx.dtype is dt.bool_ else 1) + 1
            if idx.dtype is not dt.bool_:
                dim = a.ndim - (len(key) - pos)
        else:
            dim = pos
        if idx.dtype is dt.bool_:
            return _mask_index(a, idx, dim)
        if dim >= a.ndim:
            raise IndexError_(f"index: too many indices for a tensor of dimension {a.ndim}")
        flat = reshape_nograd(idx, (idx.numel(),))
        r = index_select(a, dim, _wrap_negative(flat, a.shape[dim], dim))
        from ._views import reshape

        return reshape(r, a.shape[:dim] + idx.shape + a.shape[dim + 1 :])
    return _general_advanced(a, key)


def _mask_index(a: Tensor, mask: Tensor, dim: int) -> Tensor:
    if a.shape[dim : dim + mask.ndim] != mask.shape:
        raise IndexError_(
            f"index: boolean mask of shape {list(mask.shape)} does not match the indexed shape "
            f"{list(a.shape[dim : dim + mask.ndim])} at dimension {dim}"
        )
    from ._views import reshape

    flat = reshape(a, a.shape[:dim] + (mask.numel(),) + a.shape[dim + mask.ndim :])
    pos = nonzero(reshape_nograd(mask, (mask.numel(),)))
    return index_select(flat, dim, reshape_nograd(pos, (pos.shape[0],)))


def _general_advanced(a: Tensor, key: tuple[Any, ...]) -> Tensor:
    """Several index tensors: broadcast them, linearise the indexed dims, index_select once."""
    from ._pointwise import binary
    from ._views import permute, reshape

    if any(k is Ellipsis or k is None for k in key):
        # expand Ellipsis into full slices, then handle like the plain case
        n_real = sum(1 for k in key if k is not None and k is not Ellipsis)
        out_key: list[Any] = []
        for k in key:
            if k is Ellipsis:
                out_key.extend([slice(None)] * (a.ndim - n_real))
            elif k is None:
                raise IndexError_("index: None mixed with several index tensors is not supported")
            else:
                out_key.append(k)
        key = tuple(out_key)
    if len(key) > a.ndim:
        raise IndexError_(f"index: too many indices for a tensor of dimension {a.ndim}")
    tensors = []
    for i, k in enumerate(key):
        if isinstance(k, slice) and k == slice(None):
            continue
        if isinstance(k, slice):
            raise IndexError_("index: slices other than ':' mixed with several index tensors are not supported")
        t = _to_index_tensor(k, a.device) if _is_advanced(k) else _to_index_tensor([k], a.device)
        if t.dtype is dt.bool_:
            raise IndexError_("index: boolean masks mixed with other index tensors are not supported")
        if _is_advanced(k) is False:
            t = reshape_nograd(t, ())
        tensors.append((i, t))
    dims = [i for i, _ in tensors]
    rest = [i for i in range(a.ndim) if i not in dims]
    moved = permute(a, dims + rest)
    shape = tensors[0][1].shape
    for _, t in tensors[1:]:
        from ._core import broadcast_shapes

        shape = broadcast_shapes(shape, t.shape, "index")
    lin: Any = None
    for i, t in tensors:
        n = a.shape[i]
        t = _wrap_negative(t, n, i)
        lin = t if lin is None else binary("add", binary("mul", lin, n), t)
    total = 1
    for i in dims:
        total *= a.shape[i]
    flat = reshape(moved, (total,) + tuple(a.shape[i] for i in rest))
    from ._core import expand_to

    lin_b = reshape_nograd(contiguous_nograd(expand_to(lin, shape)), (numel(shape),))
    r = index_select(flat, 0, lin_b)
    out = reshape(r, shape + tuple(a.shape[i] for i in rest))
    contiguous_adv = dims == list(range(dims[0], dims[0] + len(dims)))
    if contiguous_adv and dims[0] > 0:
        k = len(shape)
        order = list(range(k, k + dims[0])) + list(range(k)) + list(range(k + dims[0], out.ndim))
        out = permute(out, order)
    return out
