"""Shape arithmetic every Tensor needs: row-major strides (memoised) and element counts."""

from __future__ import annotations

__all__ = ["contiguous_strides", "numel_of"]


_STRIDES: dict[tuple[int, ...], tuple[int, ...]] = {}


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides in elements for shape (a size-0 dim counts as 1, as in PyTorch)."""
    found = _STRIDES.get(shape)  # every allocation asks: memoised (shapes repeat)
    if found is not None:
        return found
    strides = []
    acc = 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= n if n > 0 else 1
    st = tuple(reversed(strides))
    if len(_STRIDES) < 4096:
        _STRIDES[shape] = st
    return st


def numel_of(shape: tuple[int, ...]) -> int:
    """The number of elements of a tensor of this shape (1 for a 0-d shape)."""
    n = 1
    for s in shape:
        n *= s
    return n
