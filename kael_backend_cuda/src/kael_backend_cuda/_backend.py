"""CudaBackend: the kael Backend for device type "cuda", on CuPy (or NumPy under emulation).

Storage.data of a cuda tensor is a 1-D uint8 CuPy array (a NumPy one under emulation,
NOTE [host emulation] in ``_xp``). Devices are ``cuda`` (= device 0) and ``cuda:N``.

NOTE [cuda synchronisation]: kernels are queued on CuPy's current stream and return
at once. Every path that hands values to the host (``item()``, ``tolist()``,
``numpy()``, ``cpu()``, printing) goes through ``to_host``, a device-to-host copy that
waits for the queued work, so results are always visible there. Timing code and code
sharing memory with other libraries call ``kael.cuda.synchronize()``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from functools import wraps
from typing import Any

import numpy as np
from kael import Device, DeviceError, DTypeError, Tensor
from kael.backends import Backend, memory
from kael.backends import dtypes as dt

from . import (
    _batch_norm,
    _conv,
    _elementwise,
    _fused,
    _fused_gemma,
    _indexing,
    _moe,
    _pool,
    _quant,
    _random,
    _reduce,
    _xp,
)
from ._xp import state, view

__all__ = ["CudaBackend"]


class CudaBackend(Backend):
    """kael's CUDA backend on CuPy (``cuda`` devices; under ``KAEL_CUDA_EMULATE=1`` NumPy stands in for
    CuPy, each raw kernel with a NumPy twin, so it runs and is tested without a GPU)."""

    name = "cuda"
    device_type = "cuda"
    priority = 100

    def __init__(self, fused: bool = True) -> None:
        super().__init__()
        for table in (_elementwise.KERNELS, _reduce.KERNELS, _indexing.KERNELS, _random.KERNELS):
            self.kernels.update(table)
        if fused:
            self.kernels.update(_fused.KERNELS)
            self.kernels.update(_fused_gemma.KERNELS)
            self.kernels.update(_moe.KERNELS)
            self.kernels.update(_conv.KERNELS)
            self.kernels.update(_batch_norm.KERNELS)
            self.kernels.update(_pool.KERNELS)
            self.kernels.update(_quant.KERNELS)

    # -- availability -------------------------------------------------------------------------------
    def is_available(self) -> tuple[bool, str]:
        s = state()
        return s.available, s.reason

    def device_count(self) -> int:
        return state().device_count

    @property
    def emulated(self) -> bool:
        """Whether this process runs the backend in host emulation (``KAEL_CUDA_EMULATE=1``)."""
        return state().emulated

    def index(self, device: Device | None) -> int:
        """The device number of `device` (``cuda`` is device 0), checked against the device count."""
        idx = 0 if device is None or device.index is None else device.index
        n = state().device_count
        if idx >= n:
            raise DeviceError(
                f"device {device}: no such CUDA device; {n} device{'s' if n != 1 else ''} "
                f"available (cuda:0..cuda:{n - 1})"
            )
        return idx

    def _guard(self, t: Tensor) -> Any:
        s = state()
        if s.emulated or s.device_count < 2:
            return contextlib.nullcontext()
        return _xp.device_guard(self.index(t.device))

    # -- memory -------------------------------------------------------------------------------------
    def allocate(self, nbytes: int, device: Device) -> Any:
        return _xp.allocate(nbytes, self.index(device))

    def from_host(self, out: Tensor, array: np.ndarray) -> None:
        if out.numel():
            with self._guard(out):
                _xp.from_host(view(out), array)

    def to_host(self, t: Tensor) -> np.ndarray:
        if t.numel() == 0:
            return np.empty(t.shape, t.dtype.np)
        with self._guard(t):
            return _xp.to_host(view(t))

    def synchronize(self, device: Device | None = None) -> None:
        _xp.synchronize(None if device is None else self.index(device))

    def memory_stats(self, device: Device | None = None) -> dict[str, int]:
        return _xp.memory_stats(None if device is None else self.index(device))

    # -- ops ----------------------------------------------------------------------------------------
    def kernel(self, op: str) -> Callable[..., Any]:
        k = super().kernel(op)
        s = state()
        if s.available and not s.emulated and s.device_count > 1:
            return _on_device_of_output(k)
        return k

    # -- DLPack -------------------------------------------------------------------------------------
    def dlpack(self, t: Tensor, *args: Any, **kwargs: Any) -> Any:
        """t's DLPack capsule (``Tensor.__dlpack__`` calls this for cuda tensors); zero-copy."""
        if t.dtype is dt.bfloat16:
            raise DTypeError("__dlpack__: bfloat16 export is not supported (CuPy has no bfloat16)")
        with self._guard(t):
            return _xp.export_dlpack(view(t), *args, **kwargs)

    def from_dlpack(self, x: Any) -> Tensor:
        """A cuda tensor sharing memory with a DLPack producer on a CUDA device (CuPy, PyTorch, kael)."""
        try:
            arr, index = _xp.import_dlpack(x)
        except (TypeError, BufferError, RuntimeError, ValueError) as exc:
            raise DTypeError(f"from_dlpack: cannot import {type(x).__name__} through DLPack: {exc}") from None
        dtype = dt.from_numpy_dtype(arr.dtype)
        isz = arr.dtype.itemsize
        if any(s < 0 or s % isz for s in arr.strides):
            arr = _xp.X.xp.ascontiguousarray(arr)
        shape = tuple(int(n) for n in arr.shape)
        strides = tuple(int(s) // isz for s in arr.strides) if arr.size else memory.contiguous_strides(shape)
        flat = _xp.flat_bytes(arr)
        device = Device("cuda", index)  # the producer's device, "cuda:N" (NOTE: "cuda" is a distinct Device)
        self.index(device)
        return memory.wrap_buffer(flat, int(flat.nbytes), device, shape, strides, dtype)


def _on_device_of_output(k: Callable[..., Any]) -> Callable[..., Any]:
    """Run kernel k with the device of its first argument (the output) current, for multi-GPU hosts."""
    cupy = state().cupy

    @wraps(k)
    def run(*args: Any, **kwargs: Any) -> Any:
        dev = args[0].device
        with cupy.cuda.Device(dev.index or 0):
            return k(*args, **kwargs)

    return run
