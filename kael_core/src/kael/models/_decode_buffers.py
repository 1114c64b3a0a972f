"""DecodeBuffers: the activations of a family's direct decode step, allocated once for a cache's rows.

NOTE [decode buffers]: a decode step runs the same kernels on the same shapes every token, so
nothing in it should allocate (the llm.c habit). A family's direct step (``GPT2DecodeStep``,
``LlamaDecodeStep``) declares its activations once: each buffer by its per-row shape, and the
views its kernels take of them by a per-row shape, per-row strides and an offset into a row
(q, k and v inside a fused qkv product, the attention output seen flat). This class allocates
every buffer for all of the cache's rows up front and makes the views of the first ``n`` rows,
and each of those rows alone, once per ``n``; the step keeps only its per-layer kernel list.
Row ``i`` of a view is row ``i`` of its buffer, so a kernel that works row by row (NOTE [batched
= alone] in ``_batched.py``) sees each sequence's row exactly as it would alone.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from .. import _dtype as dt
from .._device import CPU
from .._strides import numel_of
from .._tensor import Tensor
from ..ops._core import empty
from ..ops._views import make_view

__all__ = ["DecodeBuffers", "View"]


class View(NamedTuple):
    """A view of ``buffer`` in the shape a kernel takes: per row ``shape`` with ``strides``, from
    ``offset`` elements into the row (the row stride is the buffer's row size)."""

    buffer: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int = 0


class DecodeBuffers:
    """Named buffers ``[rows, *shape]`` (float32 statistics for ``stats``, else ``dtype``) and named views.

    >>> from kael import float32
    >>> buf = DecodeBuffers(4, float32, None, {"x": (1, 8)}, views={"x2": View("x", (8,), (1,))})
    >>> v = buf.views(2)
    >>> v["x"].shape, v["x2"].shape, buf.rows(2, "x")[1].shape
    ((2, 1, 8), (2, 8), (1, 1, 8))
    """

    def __init__(
        self,
        rows: int,
        dtype: dt.DType,
        device: Any,
        shapes: dict[str, tuple[int, ...]],
        *,
        stats: tuple[str, ...] = (),
        views: dict[str, View] | None = None,
    ) -> None:
        stat = dt.float64 if dtype is dt.float64 else dt.float32
        device = CPU if device is None else device
        self.size = rows
        self.data: dict[str, Tensor] = {
            name: empty((rows, *shape), stat if name in stats else dtype, device) for name, shape in shapes.items()
        }
        self._row_size = {name: numel_of(shape) for name, shape in shapes.items()}
        self._specs: dict[str, View] = {name: View(name, shape, _contiguous(shape)) for name, shape in shapes.items()}
        self._specs.update(views or {})
        self._views: dict[int, dict[str, Tensor]] = {}
        self._rows: dict[tuple[int, str], list[Tensor]] = {}

    def __getitem__(self, name: str) -> Tensor:
        """The whole buffer ``name`` ([rows, *shape])."""
        return self.data[name]

    def views(self, n: int) -> dict[str, Tensor]:
        """Every buffer and view over the first ``n`` rows (made once per n)."""
        got = self._views.get(n)
        if got is None:
            got = {name: self._make(spec, n, 0) for name, spec in self._specs.items()}
            self._views[n] = got
        return got

    def rows(self, n: int, name: str) -> list[Tensor]:
        """Each of the first ``n`` rows of buffer or view ``name`` alone, as ``[1, *shape]`` (made once per n)."""
        key = (n, name)
        got = self._rows.get(key)
        if got is None:
            spec = self._specs[name]
            got = [self._make(spec, 1, i) for i in range(n)]
            self._rows[key] = got
        return got

    def _make(self, spec: View, n: int, first: int) -> Tensor:
        t, row = self.data[spec.buffer], self._row_size[spec.buffer]
        return make_view(t, (n, *spec.shape), (row, *spec.strides), t._offset + first * row + spec.offset)


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, step = [], 1
    for n in reversed(shape):
        out.append(step)
        step *= n
    return tuple(reversed(out))
