"""Repacked weights for decode: ``quantized_linear`` with a repacked copy of Q8_0 / Q4_0 / Q5_0 / IQ4_NL / Q4_K / Q6_K weights.

NOTE [repacked weights]
=======================
GGML's layout keeps each row's blocks together, which makes a one-row integer kernel spend most
of its instructions gathering blocks and reducing each block's products across vector lanes.
On a CPU whose kernel table has a kernel for repacked rows (``_C.packable(scheme)``: q8_0,
q4_0, q5_0, iq4_nl, q4_k and q6_k with AVX512_VNNI), the first call of up to 16 rows on a weight makes a repacked copy of it
(16 rows interleaved block by block: NOTE [repacked rows] in csrc/vec_quant_packed.h), and later
calls of up to 16 rows on the integer path read that copy instead: the same bits as GGML's rows,
about half the instructions per weight byte (decode, batched decode and speculative
verification; prompts keep GGML's rows). The weight itself is untouched (files, ``state_dict``,
prompts and other backends see GGML's layout; with ``KAEL_QUANT_ACTIVATIONS=f32``, whose float path reads
none, no copy is made), so the copy costs memory: as much again as the
repacked weights. ``KAEL_REPACK=0`` turns it off: no copy is made, and the kernel reads none it
is given (it reads the variable at every call).

The copies are made in the order decode first calls the weights, and are laid out back to back in that
order in 32 MiB chunks aligned to 2 MiB (NumPy backs them with huge pages where the kernel allows), so a
decode step streams through them as through one buffer (NOTE [weight arena] in kael/models/_weight_arena.py:
scattered small allocations on 4 KiB pages read well below that rate). A chunk's pages that no copy was
written to take no memory; a chunk is freed with the last copy in it.

A storage that is rows of one width and at most 8 times the weight (a fused q/k/v or gate/up buffer: a prompt's
projections read its parts, a decode step the whole) is copied whole once, and each part whose first row starts a
16-row slab of the whole is served by its rows of that copy: the bytes its own copy would hold (slabs are packed
independently; the rows after the last whole slab keep GGML's layout in both), so the parts cost no second copy
(SmolLM2-135M's Q8_0 file had 217 MB of copies for 143 MB of weights before). A storage far larger than the weight
(a file's mapping, read-only) is left alone and the weight copied by itself.

A copy belongs to the weight's view of its storage (offset and shape: a loader may keep many
weights in one storage) and is made again when the storage's ``version`` moved (an in-place
write through kael); it goes when the storage does. Each call looks its weight up by identity first
(a weak reference and the version: well under a microsecond), then by storage view.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any

import kael
import numpy as np

from ._native import C

__all__ = ["quantized_linear", "packed_copy", "repacking"]

_ROWS = 16  # calls of up to this many rows read the copy (the kernel's few-row limit)
# storage -> {(storage offset, shape): (the storage's version when copied, the copy)}: weights may share a storage
_copies: weakref.WeakKeyDictionary[Any, dict[tuple[int, tuple[int, ...]], tuple[int, Any]]] = (
    weakref.WeakKeyDictionary()
)
# id(weight) -> (a weak reference to it, its storage's version, its copy): the per-call lookup (a weight's entry
# goes when it does)
_by_weight: dict[int, tuple[weakref.ref[Any], int, Any]] = {}
_packable: dict[str, bool] = {}
_lock = threading.Lock()

_CHUNK = 32 << 20
_WHOLE_AT_MOST = 8  # a storage up to this many times a weight's bytes is copied whole (_whole_storage)
_ALIGN = 64


class _Chunks:
    """Back-to-back room for the copies, in chunks of at least ``_CHUNK`` bytes (each the memory of many copies)."""

    def __init__(self) -> None:
        self._buf: np.ndarray | None = None
        self._used = 0

    def take(self, shape: tuple[int, ...]) -> np.ndarray:
        """An uninitialised uint8 array of ``shape`` at the next 64-byte boundary."""
        n = int(np.prod(shape))
        if self._buf is None or self._used + n > self._buf.nbytes:
            self._buf, self._used = kael.cpu.huge_page_buffer(max(_CHUNK, n)), 0
        out = self._buf[self._used : self._used + n].reshape(shape)
        self._used += (n + _ALIGN - 1) // _ALIGN * _ALIGN
        return out


_chunks = _Chunks()


def repacking() -> bool:
    """Whether calls may use repacked copies (``KAEL_REPACK`` unset or anything but ``0``)."""
    return os.environ.get("KAEL_REPACK", "1") != "0"


def _can_pack(scheme: str) -> bool:
    can = _packable.get(scheme)
    if can is None:
        can = _packable[scheme] = bool(C.packable(scheme))
    return can


def packed_copy(weight: Any, scheme: str, x: Any) -> Any:
    """The repacked copy of ``weight`` to pass with this call, or None (made on the first call that can use it)."""
    storage = weight.untyped_storage()
    views = _copies.get(storage)
    key = (weight.storage_offset(), tuple(weight.shape))
    if views is not None:
        entry = views.get(key)
        if entry is not None and entry[0] == storage.version:
            return entry[1]
    if os.environ.get("KAEL_QUANT_ACTIVATIONS") == "f32":
        return None  # the float path never reads a copy
    if not repacking() or not _can_pack(scheme) or x.ndim < 1 or x.shape[-1] == 0 or x.numel() // x.shape[-1] > _ROWS:
        return None
    if weight.ndim != 2 or weight.shape[0] < _ROWS or not weight.is_contiguous():
        return None
    with _lock:
        if views is None or any(v != storage.version for v, _ in views.values()):
            views = _copies[storage] = {}  # (copies of an older version are stale)
        packed = _slice_of_copy(views, key)
        if packed is None:
            whole = _whole_storage(storage, weight)
            if whole is not None and (0, tuple(whole.shape)) not in views:
                views[(0, tuple(whole.shape))] = (storage.version, _pack(whole, scheme))
                packed = _slice_of_copy(views, key)
            if packed is None:  # (a part the whole's copy cannot serve: not starting a slab of it)
                packed = _pack(weight, scheme)
        views[key] = (storage.version, packed)
    return packed


def _pack(weight: Any, scheme: str) -> Any:
    packed = kael.from_numpy(_chunks.take(tuple(weight.shape)))  # block formats: uint8 on the CPU
    C.pack_quantized(packed, weight, scheme)
    return packed


def _slice_of_copy(views: dict[tuple[int, tuple[int, ...]], tuple[int, Any]], key: tuple[int, tuple[int, ...]]) -> Any:
    """The rows of a copy in ``views`` that are the weight ``key``'s repacked rows, or None.

    A copy of rows [0, N) serves the rows [o, o + n) of the same row bytes when o starts a slab and the view's
    rows are whole slabs or end where the copy's do (its rows after the last whole slab keep GGML's layout, as
    the view's then do)."""
    offset, (n, row) = key
    for (o0, shape), (_, copy) in views.items():
        if len(shape) != 2 or shape[1] != row or offset < o0 or (offset - o0) % row:
            continue
        first, rows = (offset - o0) // row, shape[0]
        if first % _ROWS == 0 and first + n <= rows and (n % _ROWS == 0 or first + n == rows):
            return copy[first : first + n]
    return None


def _whole_storage(storage: Any, weight: Any) -> Any:
    """The storage as rows of ``weight``'s bytes when it holds nothing else (a fused q/k/v or gate/up buffer whose
    parts a prompt's projections read one by one and a decode step reads as one), or None.

    One copy of the whole then serves the parts and the fused product alike (NOTE [repacked weights]); a storage
    much larger than the weight (a file's mapping, a loader's shared buffer) is left alone."""
    row, nbytes, data = weight.shape[1], storage.nbytes, storage.data
    if not isinstance(data, np.ndarray) or not data.flags.writeable or data.nbytes != nbytes:
        return None  # (a read-only storage is a file's mapping)
    if nbytes == weight.nbytes or weight.storage_offset() % row or nbytes % row:
        return None
    if nbytes > _WHOLE_AT_MOST * weight.nbytes:
        return None
    return kael.from_numpy(data.reshape(nbytes // row, row))


def _remember(weight: Any, packed: Any) -> None:
    key = id(weight)
    if key not in _by_weight:
        weakref.finalize(weight, _by_weight.pop, key, None)
    _by_weight[key] = (weakref.ref(weight), weight.untyped_storage().version, packed)


def quantized_linear(out: Any, x: Any, weight: Any, bias: Any, scheme: str) -> None:
    """The catalogue's ``quantized_linear``, with the weight's repacked copy where one applies."""
    hit = _by_weight.get(id(weight))
    if hit is not None and hit[1] == weight.untyped_storage().version and hit[0]() is weight:
        C.quantized_linear(out, x, weight, bias, scheme, hit[2])
        return
    packed = packed_copy(weight, scheme, x)
    if packed is None:
        C.quantized_linear(out, x, weight, bias, scheme)
    else:
        _remember(weight, packed)
        C.quantized_linear(out, x, weight, bias, scheme, packed)
