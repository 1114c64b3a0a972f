"""The Backend base class: what a compute backend provides to the frontend.

A backend allocates memory for its device type, copies between the host and that
memory, and supplies kernels (NOTE [kernel contract] in ``kael.backends.catalogue``).
The frontend owns all metadata; a backend creates a Tensor itself only to hand a
buffer it did not allocate back to the frontend (``kael.backends.memory.wrap_buffer``,
e.g. ``from_dlpack``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from .._errors import BackendError

if TYPE_CHECKING:
    from .._device import Device
    from .._tensor import Tensor

__all__ = ["Backend", "API_VERSION"]

#: The backend API version this kael speaks; a backend with another major is refused.
#: 1.1 added the public contract (kael.backends.catalogue, dtypes, host, memory, dispatch).
#: 1.2 added the fused ops rms_norm, rope, silu_mul and grouped-query attention (k/v with Hkv < H heads);
#: 1.3 the fused op paged_attention (attention over a paged KV cache's block table).
#: 1.4 the fused ops gelu_tanh_mul (GeGLU's gelu_tanh(gate) * up) and softcap (cap * tanh(x / cap)), and a trailing
#: ``window`` argument of attention and paged_attention (sliding-window attention, NOTE [sliding window] in
#: kael/ops/_attention_fused.py), passed only when set: a backend declaring 1.3 runs the decomposition for a
#: window and is called as before otherwise.
API_VERSION = "1.4"


class Backend:
    """Subclass this, set the class attributes and implement the methods.

    ``kernels`` maps op names to callables; ``supported_ops()`` is its key set by
    default. Every primitive of ``kael.backends.catalogue.PRIMITIVES`` must be present.
    """

    name: str = ""
    device_type: str = ""
    priority: int = 0
    api_version: str = API_VERSION

    def __init__(self) -> None:
        self.kernels: dict[str, Callable[..., Any]] = {}

    # -- availability -------------------------------------------------------
    def is_available(self) -> tuple[bool, str]:
        """(True, "") or (False, the reason), e.g. no driver found."""
        return True, ""

    def device_count(self) -> int:
        """How many devices of ``device_type`` this backend serves (``cuda:0`` ... ``cuda:N-1``); 1 by default."""
        return 1

    # -- memory ---------------------------------------------------------------
    def allocate(self, nbytes: int, device: Device) -> Any:
        """Uninitialised memory of nbytes bytes; the Storage.data of new tensors."""
        raise NotImplementedError

    def from_host(self, out: Tensor, array: np.ndarray) -> None:
        """Copy a host C-contiguous array (out's shape, out.dtype.np) into out."""
        raise NotImplementedError

    def to_host(self, t: Tensor) -> np.ndarray:
        """A host array holding t's values (dtype t.dtype.np, t's shape)."""
        raise NotImplementedError

    def synchronize(self, device: Device) -> None:
        """Wait for all work queued on the device. CPU backends run synchronously."""

    def memory_stats(self) -> dict[str, int]:
        """Counters of the backend's memory (allocated, cached, peak bytes, ...); ``{}`` when it keeps none."""
        return {}

    # -- ops --------------------------------------------------------------------
    def supported_ops(self) -> frozenset[str]:
        """The names of the ops this backend has kernels for: every primitive, and the fused ops it implements."""
        return frozenset(self.kernels)

    def kernel(self, op: str) -> Callable[..., Any]:
        """The kernel of ``op`` (a callable taking the catalogue signature's arguments); a BackendError if none."""
        try:
            return self.kernels[op]
        except KeyError:
            raise BackendError(f"backend {self.name!r} has no kernel for op {op!r}") from None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} for {self.device_type!r}, priority {self.priority}>"
