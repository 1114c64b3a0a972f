"""``kael.cuda``: whether a CUDA device can be used, and its synchronisation and memory statistics.

The device itself comes from whichever installed backend serves device type ``cuda``
(normally the ``kael-backend-cuda`` package). Without one, or without a GPU and driver,
``is_available()`` is False and ``unavailable_reason()`` says why; nothing here raises
on such a machine except the calls that need a device (``synchronize``, ``memory_stats``).
"""

from __future__ import annotations

import inspect
from typing import Any

from ._device import Device, as_device
from ._errors import DeviceError, KaelError

__all__ = ["is_available", "unavailable_reason", "device_count", "synchronize", "memory_stats", "backend"]


def _lookup() -> tuple[Any, str]:
    """(the backend serving cuda, "") or (None, why there is none usable)."""
    from ._plugins import manager

    try:
        return manager.select("cuda"), ""
    except KaelError as exc:
        if not manager.candidates("cuda"):
            return None, f"{exc}: install kael-backend-cuda (pip install kael-backend-cuda)"
        return None, str(exc)


def is_available() -> bool:
    """True when a backend serves ``cuda`` and it has a usable device."""
    return _lookup()[0] is not None


def unavailable_reason() -> str:
    """Why ``cuda`` cannot be used ("" when it can), e.g. no backend installed, no driver, no GPU."""
    return _lookup()[1]


def backend() -> Any:
    """The Backend serving ``cuda``; DeviceError saying why when there is none usable."""
    found, reason = _lookup()
    if found is None:
        raise DeviceError(f"kael.cuda: CUDA is not available: {reason}")
    return found


def device_count() -> int:
    """The number of CUDA devices (0 when CUDA is not available)."""
    found, _ = _lookup()
    return 0 if found is None else int(found.device_count())


def _device(device: Any) -> Device | None:
    if device is None:
        return None
    d = as_device(device if not isinstance(device, int) else f"cuda:{device}")
    if d.type != "cuda":
        raise DeviceError(f"kael.cuda: expected a cuda device, got {d}")
    return d


def synchronize(device: Any = None) -> None:
    """Wait until all work queued on `device` (every CUDA device when None) has finished."""
    b = backend()
    d = _device(device)
    for target in [d] if d is not None else [Device("cuda", i) for i in range(b.device_count())]:
        b.synchronize(target)


def memory_stats(device: Any = None) -> dict[str, int]:
    """Memory statistics of `device` (device 0 when None) from the backend's allocator, in bytes."""
    b = backend()
    d = _device(device)
    takes_device = bool(inspect.signature(b.memory_stats).parameters)
    return dict(b.memory_stats(d) if takes_device else b.memory_stats())
