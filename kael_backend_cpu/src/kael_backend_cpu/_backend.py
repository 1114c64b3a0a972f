"""CpuBackend: kael's native backend for device ``cpu`` (priority 10, above the reference).

Storage is a 1-D NumPy uint8 array over a block of the caching allocator (the block
returns to the cache when the array is freed), so every CPU code path that builds
NumPy views over ``Storage.data`` keeps working.

The thread and memory controls are written once, here, as functions of the extension's
process-wide thread pool and allocator; the backend's methods of the same names call
them, ``kael.cpu`` (their one public home) reaches them through those methods when this
backend serves ``cpu``, and ``kael_backend_cpu`` re-exports them.
"""

from __future__ import annotations

import os
from typing import Any

import kael
import numpy as np
from kael import DTypeError, KaelError, ShapeError
from kael.backends import host
from kael.cpu import check_num_threads

from ._kernels import kernel_table
from ._native import C

__all__ = [
    "CpuBackend",
    "MAX_THREADS",
    "set_num_threads",
    "get_num_threads",
    "memory_stats",
    "reset_peak_memory_stats",
    "empty_cache",
    "isa",
    "isa_info",
    "quant_schemes",
    "check_threads",
]

#: The most threads the pool takes (csrc/thread_pool.cpp checks it too).
MAX_THREADS = 1024


def set_num_threads(n: int) -> None:
    """Threads the kernels use (1 <= n <= 1024); the default is KAEL_NUM_THREADS or the CPUs available."""
    C.set_num_threads(check_num_threads(n, MAX_THREADS))


def get_num_threads() -> int:
    """Threads the kernels use now."""
    return int(C.get_num_threads())


def memory_stats() -> dict[str, int]:
    """The caching allocator's counters: allocated/requested/peak/cached bytes, allocations, frees, cache hits."""
    return dict(C.memory_stats())


def reset_peak_memory_stats() -> None:
    """Set peak_allocated_bytes to the bytes allocated now."""
    C.reset_peak_memory_stats()


def empty_cache() -> None:
    """Give every cached (free) block back to the system, then (glibc) the C heap's free pages."""
    C.empty_cache()


def isa() -> str:
    """The vector table the kernels run with: "avx512", "avx2" or "baseline".

    Chosen once, at the first vector kernel: the widest table this CPU (and its OS) runs, or
    the one ``KAEL_CPU_ISA`` names; a name it does not know, or a table this CPU cannot run,
    is a ``kael.BackendError`` here and from every vector kernel.
    """
    return str(C.isa())


def isa_info() -> dict[str, Any]:
    """What the vector-table selection sees, without raising.

    ``isa``: the table in use (None when ``KAEL_CPU_ISA`` or ``KAEL_CPU_DISABLE`` is refused,
    ``error`` then says why); ``requested``: ``KAEL_CPU_ISA`` or None; ``disabled``:
    ``KAEL_CPU_DISABLE`` or None; ``tables``: the tables compiled in and
    ``runnable``: those this CPU runs, widest first; ``requires``: the CPU features each
    table needs; ``features``: what CPUID reports (``avx``, ``avx2``, ``fma``, ``f16c``,
    ``avx512f``, ``avx512bw``, ``avx512vl``, ``avx512dq``, ``avx512_vnni``, ``avx512_bf16``,
    ``amx_bf16``: AMX-BF16 with AMX-TILE) and whether the OS saves the YMM (``os_avx``) and
    ZMM/opmask (``os_avx512``) registers and grants this process the AMX tile state (``os_amx``),
    less those ``KAEL_CPU_DISABLE`` names.
    """
    info: dict[str, Any] = dict(C.isa_info())
    info["requested"] = os.environ.get("KAEL_CPU_ISA") or None
    info["disabled"] = os.environ.get("KAEL_CPU_DISABLE") or None
    try:
        info["isa"], info["error"] = isa(), None
    except KaelError as exc:
        info["isa"], info["error"] = None, str(exc)
    return info


def quant_schemes() -> tuple[str, ...]:
    """The weight formats the C++ ``dequantize`` / ``quantized_linear`` kernels take, by name.

    One entry per row of the extension's format list (``csrc/quant_formats.h``), in its order:
    ``"q8_0"``, ``"q4_0"``, ``"bf16"``, ``"f16"``, ``"q4_1"``, ... A scheme not named here is refused
    by those kernels with a ``kael.KaelError`` listing these names.
    """
    return tuple(str(s) for s in C.quant_schemes())


def check_threads(n: Any) -> None:
    """Kept for old callers: ``kael.cpu.check_num_threads`` with this backend's limit."""
    check_num_threads(n, MAX_THREADS)


class CpuBackend(kael.Backend):
    """kael's C++ CPU backend (``cpu`` at priority 10, above the NumPy reference): kernels from the
    native module, picked by instruction set at run time (``isa()``), a caching allocator, a thread
    pool (``set_num_threads``)."""

    name = "cpu"
    device_type = "cpu"
    priority = 10

    def __init__(self) -> None:
        super().__init__()
        self.kernels.update(kernel_table())

    # -- memory --------------------------------------------------------------------
    def allocate(self, nbytes: int, device: Any) -> Any:
        return C.allocate(nbytes)

    def from_host(self, out: Any, array: np.ndarray) -> None:
        if array.shape != out.shape:
            if array.size != out.numel():
                raise ShapeError(
                    f"from_host: array of shape {list(array.shape)} for a tensor of shape {list(out.shape)}"
                )
            array = array.reshape(out.shape)  # e.g. a 0-d tensor's value arriving as shape (1,)
        if array.dtype.itemsize != out.dtype.itemsize:
            raise DTypeError(f"from_host: array dtype {array.dtype} does not fit a tensor of {out.dtype!r}")
        C.copy_from_array(out, array)

    def to_host(self, t: Any) -> np.ndarray:
        return host.view(t)

    # -- thread and memory controls: kael.cpu calls these; the module's functions above ---
    def memory_stats(self) -> dict[str, int]:
        return memory_stats()

    def reset_peak_memory_stats(self) -> None:
        """Set peak_allocated_bytes to the bytes allocated now (the module's ``reset_peak_memory_stats``)."""
        reset_peak_memory_stats()

    def empty_cache(self) -> None:
        """Give every cached (free) block back to the system (the module's ``empty_cache``)."""
        empty_cache()

    def set_num_threads(self, n: int) -> None:
        """Threads the kernels use (1 <= n <= 1024; the module's ``set_num_threads``)."""
        set_num_threads(n)

    def get_num_threads(self) -> int:
        """Threads the kernels use now."""
        return get_num_threads()

    def isa(self) -> str:
        """The vector table the kernels run with: "avx512", "avx2" or "baseline" (``isa()``)."""
        return isa()

    def isa_info(self) -> dict[str, Any]:
        """The table in use, the tables compiled in and runnable, and the CPU features (``isa_info()``)."""
        return isa_info()
