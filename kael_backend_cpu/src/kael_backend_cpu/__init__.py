"""kael_backend_cpu: kael's native CPU backend (C++17 kernels in one pybind11 extension).

Installing the package registers it for device ``cpu`` through the ``kael.backends``
entry point at priority 10, above the NumPy reference; ``KAEL_BACKEND_CPU=reference``
switches back.

The thread and memory controls have one home, ``kael.cpu`` (``kael.cpu.set_num_threads``,
``get_num_threads``, ``memory_stats``, ``reset_peak_memory_stats``, ``empty_cache``,
``isa``, ``isa_info``; ``kael.set_num_threads`` is the same function), which acts on whichever backend
serves ``cpu``. The functions of the same names here act on this package's thread pool
and allocator whichever backend is selected: they are what ``kael.cpu`` calls when this
backend serves ``cpu``.
"""

from __future__ import annotations

from ._backend import (
    CpuBackend,
    check_threads,
    empty_cache,
    get_num_threads,
    isa,
    isa_info,
    memory_stats,
    reset_peak_memory_stats,
    set_num_threads,
)

__version__ = "0.1.0"

__all__ = [
    "CpuBackend",
    "memory_stats",
    "reset_peak_memory_stats",
    "empty_cache",
    "set_num_threads",
    "get_num_threads",
    "isa",
    "isa_info",
    "check_threads",
    "__version__",
]
