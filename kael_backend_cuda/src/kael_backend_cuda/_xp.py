"""The array module behind the backend: CuPy on a GPU, NumPy standing in for it under emulation.

NOTE [host emulation]: with ``KAEL_CUDA_EMULATE=1`` the backend runs every kernel
through the same glue code with NumPy as ``xp`` and host memory as "device"
memory (``KAEL_CUDA_EMULATE_DEVICES=N`` pretends to have N devices, default 1).
Tensors still live on device ``cuda`` for the frontend. Everything that differs
between the two modes is in this file (allocation, strided views, host copies,
DLPack, synchronisation, memory statistics) and in ``_raw_kernels`` (a CUDA
kernel or its NumPy twin); the kernel families only ever call ``X.xp``.

CuPy is imported lazily, the first time the backend is asked whether it is
available, so that ``import kael`` and plugin discovery never fail or slow down
on machines without a GPU.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from kael.backends import memory

__all__ = [
    "X",
    "state",
    "reset",
    "EMULATE_ENV",
    "DEVICES_ENV",
    "view",
    "allocate",
    "to_host",
    "from_host",
    "synchronize",
    "errstate",
    "device_guard",
    "memory_stats",
    "export_dlpack",
    "import_dlpack",
    "argsort",
    "quiet",
    "asarray",
    "flat_bytes",
    "dense_view",
]

EMULATE_ENV = "KAEL_CUDA_EMULATE"
DEVICES_ENV = "KAEL_CUDA_EMULATE_DEVICES"


@dataclass
class _State:
    xp: Any  # the array module: cupy, or numpy under emulation (and as a placeholder when unavailable)
    emulated: bool
    available: bool
    reason: str
    device_count: int
    cupy: Any = None


class _Current:
    """``X.xp`` / ``X.emulated``: the probed state, read by every kernel (probing on first use)."""

    @property
    def xp(self) -> Any:
        return state().xp

    @property
    def emulated(self) -> bool:
        return state().emulated


X = _Current()
_state: _State | None = None
_lock = threading.Lock()


def _flag(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0", "false", "False", "no")


def _probe() -> _State:
    if _flag(EMULATE_ENV):
        raw = os.environ.get(DEVICES_ENV, "1")
        n = int(raw) if raw.isdigit() else 0
        if n < 1:
            return _State(np, True, False, f"{DEVICES_ENV}={raw!r}: expected a device count >= 1", 0)
        return _State(np, True, True, "", n)
    try:
        import cupy
    except Exception as exc:  # ImportError, or a CuPy that fails to find its CUDA libraries
        return _State(
            np,
            False,
            False,
            f"CuPy is not importable ({type(exc).__name__}: {exc}); install the CuPy wheel for your "
            f"CUDA version (pip install cupy-cuda12x), or set {EMULATE_ENV}=1 to emulate the device on "
            f"the host",
            0,
        )
    try:
        n = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:  # CUDARuntimeError: no driver, driver too old, no device
        return _State(cupy, False, False, f"no usable CUDA driver or GPU ({type(exc).__name__}: {exc})", 0, cupy)
    if n < 1:
        return _State(cupy, False, False, "the CUDA driver reports no GPU", 0, cupy)
    return _State(cupy, False, True, "", n, cupy)


def state() -> _State:
    global _state
    s = _state
    if s is None:
        with _lock:
            if _state is None:
                _state = _probe()
            s = _state
    return s


def reset() -> None:
    """Forget the probed state (tests switch emulation on and off)."""
    global _state
    with _lock:
        _state = None


# -- memory ---------------------------------------------------------------------------------------
_emu_live = 0
_emu_peak = 0
_emu_count = 0


def _emu_free(nbytes: int) -> None:
    global _emu_live
    _emu_live -= nbytes


def allocate(nbytes: int, index: int) -> Any:
    """A 1-D uint8 device buffer of nbytes bytes on device `index` (Storage.data)."""
    s = state()
    if s.emulated:
        global _emu_live, _emu_peak, _emu_count
        buf = np.empty(nbytes, np.uint8)
        _emu_live += nbytes
        _emu_count += 1
        _emu_peak = max(_emu_peak, _emu_live)
        weakref.finalize(buf, _emu_free, nbytes)
        return buf
    with s.cupy.cuda.Device(index):
        return s.cupy.empty(nbytes, s.cupy.uint8)


def _make_view(t: Any) -> Any:
    isz = t.dtype.itemsize
    strides = tuple(s * isz for s in t.stride())
    data = memory.buffer(t)
    offset = t.storage_offset() * isz
    if t.numel() == 0:
        return X.xp.empty(t.shape, t.dtype.np)
    if state().emulated:
        return np.ndarray(t.shape, t.dtype.np, buffer=data, offset=offset, strides=strides)
    return state().cupy.ndarray(t.shape, t.dtype.np, memptr=data.data + offset, strides=strides)


def view(t: Any) -> Any:
    """The strided xp array over t's elements (uint16 bits for bfloat16); cached on the tensor.

    NOTE [cuda views]: the cache is the tensor's backend-view slot (``kael.backends.memory.cached_view``);
    tensor metadata never changes after creation, so the cache never goes stale.
    """
    return memory.cached_view(t, _make_view)


def dense_view(t: Any, shape: tuple[int, ...]) -> Any:
    """A C-contiguous xp array of `shape` over contiguous tensor t's elements (always a view, never a copy).

    Built from the pointer rather than by reshaping ``view(t)``, so no library's idea of
    contiguity (strides of size-1 dims) can turn the reshape into a silent copy.
    """
    isz = t.dtype.itemsize
    if t.numel() == 0:
        return X.xp.empty(shape, t.dtype.np)
    if state().emulated:
        return np.ndarray(shape, t.dtype.np, buffer=memory.buffer(t), offset=t.storage_offset() * isz)
    return state().cupy.ndarray(shape, t.dtype.np, memptr=memory.buffer(t).data + t.storage_offset() * isz)


def to_host(arr: Any) -> np.ndarray:
    """A new host array with arr's values; a device-to-host copy, which synchronises the stream."""
    if state().emulated:
        return np.array(arr, order="C")
    return arr.get() if arr.flags.c_contiguous else state().cupy.ascontiguousarray(arr).get()


def from_host(dst: Any, host: np.ndarray) -> None:
    """Copy a host array into the device array dst (same shape and dtype)."""
    if state().emulated:
        np.copyto(dst, host)
    elif dst.flags.c_contiguous:
        dst.set(np.ascontiguousarray(host))
    else:
        dst[...] = state().cupy.asarray(host)


def asarray(host: Any) -> Any:
    """A host array or scalar as an xp array on the current device."""
    return X.xp.asarray(host)


def synchronize(index: int | None = None) -> None:
    """Wait for all work queued on device `index` (every device when None)."""
    s = state()
    if s.emulated or not s.available:
        return
    indices = range(s.device_count) if index is None else [index]
    for i in indices:
        s.cupy.cuda.Device(i).synchronize()


@contextlib.contextmanager
def errstate() -> Iterator[None]:
    """NumPy's floating-point warnings off (CuPy never warns)."""
    if state().emulated:
        with np.errstate(all="ignore"):
            yield
    else:
        yield


def quiet(k: Callable[..., None]) -> Callable[..., None]:
    """Kernel k with NumPy's floating-point warnings off under emulation (overflow is not an error)."""

    @functools.wraps(k)
    def run(*args: Any, **kwargs: Any) -> None:
        if state().emulated:
            with np.errstate(all="ignore"):
                return k(*args, **kwargs)
        return k(*args, **kwargs)

    return run


def device_guard(index: int) -> Any:
    """A context that makes device `index` current for CuPy (a no-op under emulation)."""
    s = state()
    if s.emulated:
        return contextlib.nullcontext()
    return s.cupy.cuda.Device(index)


def memory_stats(index: int | None = None) -> dict[str, int]:
    """Bytes in use and reserved, from CuPy's memory pool (or the emulation's own count)."""
    s = state()
    if not s.available:
        return {}
    if s.emulated:
        return {
            "allocated_bytes": _emu_live,
            "reserved_bytes": _emu_live,
            "peak_allocated_bytes": _emu_peak,
            "allocations": _emu_count,
            "device_free_bytes": 0,
            "device_total_bytes": 0,
        }
    cupy = s.cupy
    with cupy.cuda.Device(index or 0):
        pool = cupy.get_default_memory_pool()
        pinned = cupy.get_default_pinned_memory_pool()
        free, total = cupy.cuda.runtime.memGetInfo()
        return {
            "allocated_bytes": int(pool.used_bytes()),
            "reserved_bytes": int(pool.total_bytes()),
            "pool_free_bytes": int(pool.free_bytes()),
            "pool_free_blocks": int(pool.n_free_blocks()),
            "pinned_free_blocks": int(pinned.n_free_blocks()),
            "device_free_bytes": int(free),
            "device_total_bytes": int(total),
        }


def argsort(a: Any, axis: int) -> Any:
    """Stable argsort along axis (CuPy's sort is always stable; NumPy's default is not)."""
    if state().emulated:
        return np.argsort(a, axis=axis, kind="stable")
    return a.argsort(axis=axis)


# -- DLPack ---------------------------------------------------------------------------------------
class _HostAlias:
    """Presents an emulated-cuda DLPack producer as a host one, so NumPy will import it."""

    def __init__(self, x: Any) -> None:
        self.x = x

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        return self.x.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)


def export_dlpack(arr: Any, *args: Any, **kwargs: Any) -> Any:
    """arr's DLPack capsule (CuPy's, zero-copy; under emulation NumPy's over the host memory)."""
    return arr.__dlpack__(*args, **kwargs)


def import_dlpack(x: Any) -> tuple[Any, int]:
    """(an xp array sharing x's memory, its device index) for a DLPack producer on a CUDA device."""
    s = state()
    dev = x.__dlpack_device__()
    index = int(dev[1])
    if s.emulated:
        # An emulated kael tensor exports host memory; anything else claiming CUDA cannot be read here.
        return np.from_dlpack(_HostAlias(x)), index
    with s.cupy.cuda.Device(index):
        return s.cupy.from_dlpack(x), index


def flat_bytes(arr: Any) -> Any:
    """A 1-D uint8 xp array over the memory arr spans, to serve as Storage.data.

    arr's strides must be non-negative multiples of its itemsize (callers copy otherwise).
    """
    if arr.size == 0:
        return X.xp.empty(0, np.uint8)
    isz = arr.dtype.itemsize
    extent = 1 + sum((n - 1) * (st // isz) for n, st in zip(arr.shape, arr.strides))  # in elements
    if state().emulated:
        return np.lib.stride_tricks.as_strided(arr, shape=(extent,), strides=(isz,)).view(np.uint8)
    cupy = state().cupy
    return cupy.ndarray((extent * isz,), cupy.uint8, memptr=arr.data, strides=(1,))
