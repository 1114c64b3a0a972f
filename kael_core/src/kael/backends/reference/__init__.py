"""The NumPy reference backend: every primitive and fused op, written for reading.

It serves ``cpu`` at the lowest priority so kael works anywhere NumPy does; it is
the oracle of the conformance kit and the template for third-party backends:
copy this package, replace the kernels, keep the signatures (``kael._ops``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..._device import Device
from .._base import Backend
from . import _elementwise, _fused, _indexing, _random, _reduce
from ._io import view, wr

__all__ = ["ReferenceBackend"]


class ReferenceBackend(Backend):
    name = "reference"
    device_type = "cpu"
    priority = 0

    def __init__(self, fused: bool = True) -> None:
        super().__init__()
        for table in (_elementwise.KERNELS, _reduce.KERNELS, _indexing.KERNELS, _random.KERNELS):
            self.kernels.update(table)
        if fused:
            self.kernels.update(_fused.KERNELS)

    def allocate(self, nbytes: int, device: Device) -> Any:
        return np.empty(nbytes, np.uint8)

    def from_host(self, out: Any, array: np.ndarray) -> None:
        np.copyto(view(out), array)

    def to_host(self, t: Any) -> np.ndarray:
        return view(t)

    _ = wr
