"""``kael.set_num_threads`` / ``kael.get_num_threads``: the CPU backend's thread count.

Both delegate to the backend serving device ``cpu`` when it has such methods (the
native ``kael-backend-cpu`` does: its thread pool); the NumPy reference backend has no
thread pool of its own, so there they accept the call and report 1.
"""

from __future__ import annotations

from ._errors import KaelError

__all__ = ["set_num_threads", "get_num_threads"]


def _cpu_backend() -> object:
    from ._plugins import manager

    return manager.select("cpu")


def set_num_threads(n: int) -> None:
    """Use n >= 1 threads for CPU kernels (where the CPU backend supports it)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise KaelError(f"set_num_threads: expected an int >= 1, got {n!r}")
    fn = getattr(_cpu_backend(), "set_num_threads", None)
    if fn is not None:
        fn(n)


def get_num_threads() -> int:
    """Threads the CPU backend's kernels use (1 when it has no thread pool)."""
    fn = getattr(_cpu_backend(), "get_num_threads", None)
    return int(fn()) if fn is not None else 1
