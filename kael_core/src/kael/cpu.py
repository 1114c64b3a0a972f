"""``kael.cpu``: the CPU backend's memory statistics and thread count.

Everything delegates to the backend serving device ``cpu``: the native
``kael-backend-cpu`` reports its caching allocator (allocated, peak and cached bytes,
cache hits); the NumPy reference backend has no allocator of its own and reports ``{}``.
"""

from __future__ import annotations

from typing import Any

from ._threads import get_num_threads, set_num_threads

__all__ = ["backend", "memory_stats", "reset_peak_memory_stats", "empty_cache", "set_num_threads", "get_num_threads"]


def backend() -> Any:
    """The Backend serving device ``cpu``."""
    from ._plugins import manager

    return manager.select("cpu")


def memory_stats() -> dict[str, int]:
    """The CPU allocator's counters (``{}`` when the backend keeps none)."""
    return dict(backend().memory_stats())


def reset_peak_memory_stats() -> None:
    """Start the peak_allocated_bytes high-water mark again from the current allocation."""
    fn = getattr(backend(), "reset_peak_memory_stats", None)
    if fn is not None:
        fn()


def empty_cache() -> None:
    """Return cached free blocks to the system (no-op without a caching allocator)."""
    fn = getattr(backend(), "empty_cache", None)
    if fn is not None:
        fn()
