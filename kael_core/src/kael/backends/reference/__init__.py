"""The NumPy reference backend: every primitive and fused op, written for reading.

It serves ``cpu`` at the lowest priority so kael works anywhere NumPy does, and it is
the oracle of the conformance kit. Its kernels are the NumPy host-kernel library of
``kael.backends.host`` (the readable definition of each op; the elementwise ones come
from the catalogue's ``Pointwise`` entries), so a CPU backend that falls back to a
NumPy kernel uses the same code without importing this backend.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..._device import Device
from .._base import Backend
from ..host import FUSED_KERNELS, PRIMITIVE_KERNELS, view

__all__ = ["ReferenceBackend"]


class ReferenceBackend(Backend):
    """Backend ``reference`` for ``cpu`` (priority 0); ``fused=False`` leaves the fused ops to their decompositions."""

    name = "reference"
    device_type = "cpu"
    priority = 0

    def __init__(self, fused: bool = True) -> None:
        super().__init__()
        self.kernels.update(PRIMITIVE_KERNELS)
        if fused:
            self.kernels.update(FUSED_KERNELS)

    def allocate(self, nbytes: int, device: Device) -> Any:
        return np.empty(nbytes, np.uint8)

    def from_host(self, out: Any, array: np.ndarray) -> None:
        np.copyto(view(out), array)

    def to_host(self, t: Any) -> np.ndarray:
        return view(t)
