"""The dispatcher: (device type, op name) -> a plain kernel callable, resolved once.

NOTE [dispatch cache]: the first call for a pair asks the plugin manager which
backend serves the device type and takes its kernel; later calls are one dict
lookup. Registering, unregistering or overriding a backend clears the cache. A
profiler (``kael_debug``) installs a wrapper factory with ``set_kernel_wrapper``;
that too clears the cache, so with no profiler active the hot path has no check.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._errors import BackendError
from ._ops import CATALOGUE, FUSED

__all__ = ["kernel", "fused_kernel", "backend_for", "clear_cache", "set_kernel_wrapper"]

Kernel = Callable[..., Any]
_cache: dict[tuple[str, str], Kernel | None] = {}
_backends: dict[str, Any] = {}  # device type -> selected backend (every allocation asks)
_derived: list[dict[Any, Any]] = []  # caches of tensors a backend made (ops' scalar operands), cleared with it
_wrapper: Callable[[str, str, Any, Kernel], Kernel] | None = None


def clear_cache() -> None:
    """Forget every resolved kernel and selected backend (NOTE [dispatch cache])."""
    _cache.clear()
    _backends.clear()
    for c in _derived:
        c.clear()


def set_kernel_wrapper(wrap: Callable[[str, str, Any, Kernel], Kernel] | None) -> None:
    """Install wrap(device_type, op, backend, kernel) -> kernel, applied to kernels as they resolve (None: remove)."""
    global _wrapper
    _wrapper = wrap
    _cache.clear()


def backend_for(device_type: str) -> Any:
    """The Backend serving device_type now (selected once, then cached)."""
    b = _backends.get(device_type)
    if b is None:
        from ._plugins import manager

        b = _backends[device_type] = manager.select(device_type)
    return b


def _resolve(device_type: str, op: str) -> Kernel | None:
    backend = backend_for(device_type)
    if op not in backend.supported_ops():
        if op in FUSED:
            _cache[(device_type, op)] = None
            return None
        if op not in CATALOGUE:
            raise BackendError(f"unknown op {op!r}")
        raise BackendError(f"backend {backend.name!r} for {device_type!r} lacks primitive op {op!r}")
    k: Kernel = backend.kernel(op)
    if _wrapper is not None:
        k = _wrapper(device_type, op, backend, k)
    _cache[(device_type, op)] = k
    return k


def kernel(device_type: str, op: str) -> Kernel:
    """The kernel of op on device_type (a primitive, or a fused op the backend implements)."""
    try:
        k = _cache[(device_type, op)]
    except KeyError:
        k = _resolve(device_type, op)
    if k is None:
        raise BackendError(f"op {op!r} has no kernel on {device_type!r}")
    return k


def fused_kernel(device_type: str, op: str) -> Kernel | None:
    """The backend's kernel for a fused op, or None to run the decomposition."""
    try:
        return _cache[(device_type, op)]
    except KeyError:
        return _resolve(device_type, op)
