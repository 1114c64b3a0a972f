"""Storage: a block of device memory shared by a tensor and all its views.

`data` is whatever the backend allocated: for every CPU backend a 1-D NumPy uint8
array (possibly over memory the backend owns), for CUDA a CuPy array. `version`
is the counter that in-place ops bump and autograd checks (NOTE [version counter]).
"""

from __future__ import annotations

from typing import Any

from ._device import Device

__all__ = ["Storage"]


class Storage:
    """The memory of one or more tensors: the backend's ``data``, its size in bytes, its device.

    ``version`` counts in-place writes (autograd checks a saved tensor was not modified since).
    """

    __slots__ = ("__weakref__", "data", "device", "nbytes", "version")

    def __init__(self, data: Any, nbytes: int, device: Device):
        self.data = data
        self.nbytes = nbytes
        self.device = device
        self.version = 0

    def data_ptr(self) -> int:
        """The memory's first byte's address (``__array_interface__`` or ``__cuda_array_interface__``)."""
        iface = getattr(self.data, "__array_interface__", None) or self.data.__cuda_array_interface__
        return int(iface["data"][0])

    def __repr__(self) -> str:
        return f"Storage(device={self.device}, nbytes={self.nbytes}, version={self.version})"
