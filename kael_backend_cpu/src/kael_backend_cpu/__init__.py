"""kael_backend_cpu: kael's native CPU backend (C++17 kernels in one pybind11 extension).

Installing the package registers it for device ``cpu`` through the ``kael.backends``
entry point at priority 10, above the NumPy reference; ``KAEL_BACKEND_CPU=reference``
switches back. The functions here reach the allocator and the thread pool directly.
"""

from __future__ import annotations

from ._backend import CpuBackend, check_threads
from ._native import C as _C

__version__ = "0.1.0"

__all__ = [
    "CpuBackend",
    "memory_stats",
    "reset_peak_memory_stats",
    "empty_cache",
    "set_num_threads",
    "get_num_threads",
    "__version__",
]


def memory_stats() -> dict[str, int]:
    """The caching allocator's counters: allocated/peak/cached bytes, allocations, cache hits."""
    return dict(_C.memory_stats())


def reset_peak_memory_stats() -> None:
    """Set peak_allocated_bytes to the bytes allocated now."""
    _C.reset_peak_memory_stats()


def empty_cache() -> None:
    """Give every cached (free) block back to the system."""
    _C.empty_cache()


def set_num_threads(n: int) -> None:
    """Threads the kernels use (>= 1); the default is KAEL_NUM_THREADS or the CPUs available."""
    check_threads(n)
    _C.set_num_threads(n)


def get_num_threads() -> int:
    return int(_C.get_num_threads())
