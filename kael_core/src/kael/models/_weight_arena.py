"""``gather_weights``: a loaded model's stored weights moved into one host buffer, in the order decode reads them.

NOTE [weight arena]: a decode step reads every weight once, one projection after another, so its speed is
the memory system's streaming rate. Copied one by one (and fused per layer: q/k/v, gate/up), a GGUF file's
weights sat in as many allocations, those under 4 MiB on 4 KiB pages in scattered places: each projection
started a new stream and crossed a page (a TLB miss; the hardware prefetcher stops at page ends) every 4 KiB,
and was read well below the rate of one long stream (GPT-2 small's float16 projections, cold, at one
thread: 15-23 GB/s each; the same bytes in one buffer: 21-26 GB/s; the whole decode step 15% faster).

``gather_weights`` moves the storage of every CPU weight of a module with a weight format (``scheme``:
QuantizedLinear, QuantizedTable; the stored bytes, not float weights) into one buffer, in the order of
``model.modules()`` (the order a forward pass calls them), each storage at a 64-byte boundary, the buffer
aligned to 2 MiB so that NumPy's ``madvise(MADV_HUGEPAGE)`` backs it with huge pages where the kernel allows.
Each Storage object keeps its identity and version and only its memory changes, so every view of it (the
fused q/k/v buffer's three weights) moves with it. The old memory is freed as each storage moves (the
buffer's untouched pages take no memory until then), so loading peaks at the model plus one storage; the loader
then gives the freed memory back to the system (``kael.cpu.empty_cache``: NOTE [heap trim] in kael_backend_cpu's
allocator.cpp; without it the C heap kept the first copies, and a load held twice the file). The
buffer is freed with the last weight that views it. It runs once, as the GGUF loader's last step, before
any kernel has kept a pointer (NOTE [kernel contract]: kernels take their views at each call).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from .._errors import KaelError
from .._tensor import Tensor
from ..cpu import huge_page_buffer

__all__ = ["WeightArena", "gather_weights"]

_ALIGN = 64


class WeightArena:
    """Room for ``nbytes`` of arrays (each rounded up to 64 bytes): ``place`` copies one into it."""

    def __init__(self, nbytes: int) -> None:
        self._buf = huge_page_buffer(nbytes)
        self._used = 0

    @staticmethod
    def room(nbytes: int) -> int:
        """The bytes an array of ``nbytes`` takes in an arena."""
        return (int(nbytes) + _ALIGN - 1) // _ALIGN * _ALIGN

    def place(self, data: np.ndarray) -> np.ndarray:
        """A C-contiguous copy of ``data`` inside the arena (same dtype and shape)."""
        src = np.asarray(data)
        n = src.nbytes
        end = self._used + n
        if end > self._buf.nbytes:
            raise KaelError(f"WeightArena.place: {n} bytes do not fit ({self._buf.nbytes - self._used} left)")
        out = self._buf[self._used : end].view(src.dtype).reshape(src.shape)
        out[...] = src
        self._used += self.room(n)
        return out


def _bytes_of(storage: Any, mapped: bool) -> np.ndarray | None:
    """The storage's bytes as a uint8 array, or None (not contiguous; read-only memory, a file's mapping,
    unless ``mapped``)."""
    arr = np.asarray(storage.data)
    if (not mapped and not arr.flags.writeable) or not arr.flags.c_contiguous:
        return None
    flat = arr.reshape(-1).view(np.uint8)
    return flat[: storage.nbytes] if flat.nbytes >= storage.nbytes else None


def gather_weights(
    modules: Iterable[Any], *, mapped: bool = False, moved: Callable[[np.ndarray], None] | None = None
) -> int:
    """Move the storages of the CPU weights of ``modules`` that have a weight format into one WeightArena
    (NOTE [weight arena]); returns the bytes moved. Read-only storages (views of a file's mapping) stay where
    they are unless ``mapped``: then they move too, and become writable memory of the arena. ``moved`` is
    called with each storage's old bytes once they are copied (a loader drops the file's pages there)."""
    storages: dict[int, tuple[Any, np.ndarray]] = {}  # id -> (storage, its bytes), in first-use order
    weights: list[Tensor] = []
    for m in modules:
        w = getattr(m, "weight", None)
        if getattr(m, "scheme", None) is None or not isinstance(w, Tensor) or w.device.type != "cpu":
            continue
        s = w.untyped_storage()
        if id(s) not in storages:
            src = _bytes_of(s, mapped)
            if src is None:
                continue
            storages[id(s)] = (s, src)
        weights.append(w)
    total = sum(WeightArena.room(src.nbytes) for _, src in storages.values())
    if not total:
        return 0
    arena = WeightArena(total)
    for key in list(storages):
        s, src = storages.pop(key)  # (its old memory goes as it moves, not at the end)
        s.data = arena.place(src)
        if moved is not None:
            moved(src)
        del s, src
    for w in weights:
        w._npv = None  # a cached NumPy view of the old memory
    return total
