"""``kael.cpu``: the one home of the CPU thread and memory controls.

Every function here acts on the backend that serves device ``cpu`` now
(``kael.backends.current("cpu")``): the native ``kael-backend-cpu`` when it is installed
(its thread pool, caching allocator and vector instruction set), otherwise the NumPy
reference backend, which has none of them (1 thread, no statistics, no instruction set).

=============================  ========================================================
``set_num_threads(n)``         threads the CPU kernels use (an int >= 1)
``get_num_threads()``          threads the CPU kernels use now (1 without a thread pool)
``memory_stats()``             the allocator's counters: ``allocated_bytes``,
                               ``peak_allocated_bytes``, ``cached_bytes``, ``num_allocs``,
                               ``cache_hits``, ... (``{}`` without an allocator)
``reset_peak_memory_stats()``  restart the ``peak_allocated_bytes`` high-water mark
``empty_cache()``              give cached free blocks (and, natively, the C heap's free
                               pages) back to the system
``isa()``                      the vector table of the kernels (``"avx512"``, ``"avx2"``,
                               ``"baseline"``), or None
``isa_info()``                 the table in use, the tables compiled in and those this
                               CPU runs, and the CPU features seen (a dict), or None
``backend()``                  the Backend serving ``cpu``
``huge_page_buffer(nbytes)``   an uninitialised uint8 NumPy array of ``nbytes`` that
                               starts on a 2 MiB boundary (huge pages where the kernel
                               allows: NOTE [weight arena])
=============================  ========================================================

The other spellings are the same controls: ``kael.set_num_threads`` and
``kael.get_num_threads`` are these very functions; ``kael_backend_cpu.set_num_threads``,
``get_num_threads``, ``memory_stats``, ``reset_peak_memory_stats``, ``empty_cache`` and
``isa`` (and the matching ``CpuBackend`` methods) reach the native backend whichever
backend is selected, and give the same results as these when it serves ``cpu`` (the
default once it is installed).

Environment variables, read by the native backend the first time it needs them (so set
them before the first CPU operation):

==================================  ===================================================
``KAEL_NUM_THREADS=n``              the default thread count, 1 <= n <= 1024 (unset or
                                    out of range: the CPUs this process may run on)
``KAEL_NO_CACHING_ALLOCATOR=1``     free blocks at once instead of caching them (any
                                    value but empty or ``0``)
``KAEL_CPU_CACHE_LIMIT_MB=n``       most bytes the allocator keeps cached (default 4096)
``KAEL_CPU_ISA=name``               the vector table: ``baseline`` (``base`` is the same),
                                    ``avx2`` or ``avx512``; unset or empty: the widest the
                                    CPU and OS run (CPUID and XGETBV). A test and debug
                                    control: an unknown name, or a table this CPU cannot
                                    run, makes ``isa()`` and every vector kernel raise a
                                    ``BackendError`` naming the value and what is possible
``KAEL_BACKEND_CPU=reference``      serve ``cpu`` with the NumPy reference backend
==================================  ===================================================

A backend author serving ``cpu`` gets these controls by giving the backend methods of
the same names (``set_num_threads``, ``get_num_threads``, ``memory_stats``,
``reset_peak_memory_stats``, ``empty_cache``, ``isa``, ``isa_info``); each is optional, and
``check_num_threads`` validates a thread count the same way for every backend.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._errors import KaelError

__all__ = [
    "set_num_threads",
    "get_num_threads",
    "memory_stats",
    "reset_peak_memory_stats",
    "empty_cache",
    "isa",
    "isa_info",
    "backend",
    "check_num_threads",
    "huge_page_buffer",
]

HUGE_PAGE = 2 << 20


def backend() -> Any:
    """The Backend serving device ``cpu``."""
    from ._plugins import manager

    return manager.select("cpu")


def check_num_threads(n: object, limit: int | None = None) -> int:
    """n as a thread count: an int >= 1 (and <= limit when given), else a KaelError saying so."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1 or (limit is not None and n > limit):
        want = "an int >= 1" if limit is None else f"an int >= 1 and <= {limit}"
        raise KaelError(f"set_num_threads: expected {want}, got {n!r}")
    return n


def set_num_threads(n: int) -> None:
    """Use n >= 1 threads for the CPU kernels (accepted and ignored by a backend without a pool)."""
    check_num_threads(n)
    fn = getattr(backend(), "set_num_threads", None)
    if fn is not None:
        fn(n)


def get_num_threads() -> int:
    """Threads the CPU kernels use (1 when the backend has no thread pool)."""
    fn = getattr(backend(), "get_num_threads", None)
    return int(fn()) if fn is not None else 1


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


def isa() -> str | None:
    """The vector table the CPU kernels run with ("avx512", "avx2", "baseline"), or None when the backend has none."""
    fn = getattr(backend(), "isa", None)
    return str(fn()) if fn is not None else None


def isa_info() -> dict[str, Any] | None:
    """What the backend's vector-table selection sees, or None when it has none.

    The native backend gives ``isa`` (the table in use, None when ``KAEL_CPU_ISA`` is
    refused), ``error`` (why, else None), ``requested`` (``KAEL_CPU_ISA`` or None),
    ``tables`` (compiled in, widest first), ``runnable`` (those this CPU runs),
    ``requires`` (table -> the features it needs) and ``features`` (feature -> bool, as
    CPUID and XGETBV report them). It never raises for a refused ``KAEL_CPU_ISA``.
    """
    fn = getattr(backend(), "isa_info", None)
    return dict(fn()) if fn is not None else None


def huge_page_buffer(nbytes: int) -> np.ndarray:
    """An uninitialised uint8 array of ``nbytes`` (at least 1) starting on a 2 MiB boundary.

    NumPy asks the kernel for transparent huge pages on its large allocations
    (``madvise(MADV_HUGEPAGE)``); aligned so, a buffer streamed through (a model's weights:
    NOTE [weight arena] in ``kael/models/_weight_arena.py``) takes a TLB entry per 2 MiB
    rather than per 4 KiB. Pages never written take no memory.
    """
    size = max(1, int(nbytes))
    raw = np.empty(size + HUGE_PAGE, np.uint8)
    start = (-raw.ctypes.data) % HUGE_PAGE
    return raw[start : start + size]
