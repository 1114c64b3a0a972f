"""CpuBackend: kael's native backend for device ``cpu`` (priority 10, above the reference).

Storage is a 1-D NumPy uint8 array over a block of the caching allocator (the block
returns to the cache when the array is freed), so every CPU code path that builds
NumPy views over ``Storage.data`` keeps working.
"""

from __future__ import annotations

from typing import Any

import kael
import numpy as np
from kael import DTypeError, ShapeError
from kael.backends import host

from ._kernels import kernel_table
from ._native import C

__all__ = ["CpuBackend", "check_threads"]


def check_threads(n: Any) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise kael.KaelError(f"set_num_threads: expected an int >= 1, got {n!r}")


class CpuBackend(kael.Backend):
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

    def memory_stats(self) -> dict[str, int]:
        return dict(C.memory_stats())

    def reset_peak_memory_stats(self) -> None:
        C.reset_peak_memory_stats()

    def empty_cache(self) -> None:
        C.empty_cache()

    # -- threads -------------------------------------------------------------------
    def set_num_threads(self, n: int) -> None:
        check_threads(n)
        C.set_num_threads(n)

    def get_num_threads(self) -> int:
        return int(C.get_num_threads())

    def isa(self) -> str:
        """The vector instruction set the kernels run with ("avx2" or "base")."""
        return str(C.isa())
