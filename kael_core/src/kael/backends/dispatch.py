"""``kael.backends.dispatch``: the dispatcher as a plugin or a test may use it.

The frontend resolves ``(device type, op)`` to a plain kernel callable once and caches
it (NOTE [dispatch cache]); registering, unregistering or overriding a backend, and
installing a kernel wrapper, clear the cache.

* ``backend_for(device_type)``: the Backend serving a device type now.
* ``kernel(device_type, op)``: the kernel of a primitive (``BackendError`` if none).
* ``fused_kernel(device_type, op)``: the backend's kernel of a fused op, or None when the
  frontend runs the decomposition.
* ``set_kernel_wrapper(wrap)``: install ``wrap(device_type, op, backend, kernel) -> kernel``,
  applied to every kernel as it is resolved (the profiler of kael-debug observes every
  dispatched call this way); ``None`` removes it. One wrapper at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._dispatch import backend_for, fused_kernel, kernel, set_kernel_wrapper

__all__ = ["backend_for", "kernel", "fused_kernel", "set_kernel_wrapper", "Kernel", "KernelWrapper"]

Kernel = Callable[..., Any]
KernelWrapper = Callable[[str, str, Any, Kernel], Kernel]
