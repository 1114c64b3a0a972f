"""``topk`` as a fused op: the backend's kernel when it has one, else a full sort cut to k."""

from __future__ import annotations

from .. import _dispatch
from .. import _dtype as dt
from .._errors import ShapeError
from .._tensor import Tensor
from ._core import empty
from ._fused import decompositions
from ._views import contiguous_nograd

__all__ = ["topk", "topk_decomp"]


def topk_decomp(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    values = empty(x.shape, x.dtype, x.device)
    indices = empty(x.shape, dt.int64, x.device)
    _dispatch.kernel(x.device.type, "sort")(values, indices, x, x.ndim - 1, True)
    from ._views import _slice_fn

    f = _slice_fn(x.ndim - 1, 0, k, 1)
    return contiguous_nograd(f(values)), contiguous_nograd(f(indices))


def topk(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The k largest values along the last dim, and their indices (no autograd through indices)."""
    if not isinstance(x, Tensor) or x.ndim == 0:
        raise ShapeError("topk: expected a tensor with at least one dimension")
    if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= x.shape[-1]:
        raise ShapeError(f"topk: k={k!r} is out of range for a last dimension of size {x.shape[-1]}")
    kern = _dispatch.fused_kernel(x.device.type, "topk")
    if kern is not None:
        values = empty(x.shape[:-1] + (k,), x.dtype, x.device)
        indices = empty(x.shape[:-1] + (k,), dt.int64, x.device)
        if values.numel():
            kern(values, indices, x, k)
    else:
        values, indices = topk_decomp(x, k)
    if x.requires_grad:
        from ._indexing import gather

        values = gather(x, -1, indices)
    return values, indices


decompositions["topk"] = topk_decomp
