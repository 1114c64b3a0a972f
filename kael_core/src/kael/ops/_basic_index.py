"""The basic part of ``Tensor.__getitem__``: ints, slices, None and Ellipsis, as one view.

The key is resolved once against the tensor's shape into a list of steps (a new dim, an int
that drops a dim, a slice), applied to the strides and offset by one ``Index`` view Function,
so the gradient flows back through the same view.
"""

from __future__ import annotations

from typing import Any

from .._errors import IndexError_
from .._tensor import Tensor
from ._views import Index, _norm_slice, make_view

__all__ = ["basic_index"]


def basic_index(a: Tensor, key: tuple[Any, ...]) -> Tensor:
    """Indexing with ints, slices, None and Ellipsis only: one view."""
    n_real = sum(1 for k in key if k is not None and k is not Ellipsis)
    if sum(1 for k in key if k is Ellipsis) > 1:
        raise IndexError_("index: an index can only have a single ellipsis ('...')")
    if n_real > a.ndim:
        raise IndexError_(f"index: too many indices for a tensor of dimension {a.ndim} (got {n_real})")
    expanded: list[Any] = []
    for k in key:
        if k is Ellipsis:
            expanded.extend([slice(None)] * (a.ndim - n_real))
        else:
            expanded.append(k)
    ops: list[tuple[str, int, Any]] = []
    d = 0
    shape = list(a.shape)
    for k in expanded:
        if k is None:
            ops.append(("new", d, None))
            shape.insert(d, 1)
            d += 1
        elif isinstance(k, slice):
            ops.append(("slice", d, _norm_slice(k, shape[d], "index")))
            d += 1
        else:
            i = int(k)
            n = shape[d]
            if i < -n or i >= n:
                raise IndexError_(f"index {i} is out of bounds for dimension {d} with size {n}")
            ops.append(("int", d, i % n))
            shape.pop(d)
    # pad: remaining dims untouched

    def fn(t: Tensor) -> Tensor:
        shp, st, off = list(t.shape), list(t._strides), t._offset
        for kind, dim, arg in ops:
            if kind == "new":  # the stride PyTorch's unsqueeze gives a new dim
                st.insert(dim, shp[dim] * st[dim] if dim < len(shp) else 1)
                shp.insert(dim, 1)
            elif kind == "int":
                off += arg * st[dim]
                shp.pop(dim)
                st.pop(dim)
            else:
                start, stop, step = arg
                m = max(0, (stop - start + step - 1) // step)
                off += start * st[dim] if m else 0
                shp[dim] = m
                st[dim] *= step
        return make_view(t, tuple(shp), tuple(st), off)

    return Index.apply(a, fn)  # type: ignore[no-any-return]
