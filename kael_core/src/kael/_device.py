"""Devices: a type ("cpu", "cuda", or a third party's) and an optional index."""

from __future__ import annotations

import builtins
from typing import Union

from ._errors import DeviceError

__all__ = ["Device", "as_device", "DeviceLike"]


class Device:
    """A device such as ``cpu`` or ``cuda:1``. Instances are interned, so `is` compares them."""

    __slots__ = ("index", "type")
    _cache: dict[object, Device] = {}

    type: str
    index: int | None

    def __new__(cls, spec: DeviceLike, index: int | None = None) -> Device:
        key = (spec, index)
        try:
            found = cls._cache.get(key)
        except TypeError:  # unhashable: certainly not a device
            raise DeviceError(f"device: expected a string like 'cpu' or 'cuda:0', got {spec!r}") from None
        if found is not None:
            return found
        if isinstance(spec, Device):
            return spec
        if not isinstance(spec, str):
            raise DeviceError(f"device: expected a string like 'cpu' or 'cuda:0', got {spec!r}")
        dtype, sep, idx = spec.partition(":")
        if index is not None and sep:
            raise DeviceError(f"device: index given twice in {spec!r} and index={index!r}")
        if sep:
            if not idx.isdigit():
                raise DeviceError(f"device: bad index in {spec!r}; expected 'type:N' with N >= 0")
            index = int(idx)
        if not dtype or not dtype.replace("_", "").isalnum():
            raise DeviceError(f"device: bad device type in {spec!r}")
        if index is not None and (not isinstance(index, int) or index < 0):
            raise DeviceError(f"device: index must be a non-negative int, got {index!r}")
        # cpu has a single device: "cpu:0" and "cpu" are the same.
        if dtype == "cpu":
            index = None
        canon = (dtype, index)
        dev = cls._cache.get(canon)
        if dev is None:
            dev = object.__new__(cls)
            dev.type = dtype
            dev.index = index
            cls._cache[canon] = dev
        cls._cache[key] = dev
        return dev

    def __repr__(self) -> str:
        return f"device(type='{self.type}'" + (f", index={self.index})" if self.index is not None else ")")

    def __str__(self) -> str:
        return self.type if self.index is None else f"{self.type}:{self.index}"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            try:
                other = Device(other)
            except DeviceError:
                return False
        return self is other

    def __hash__(self) -> int:
        return hash((self.type, self.index))

    def __reduce__(self) -> tuple[builtins.type[Device], tuple[str]]:
        return (Device, (str(self),))


DeviceLike = Union[str, Device]


def as_device(d: DeviceLike | None) -> Device:
    """The concrete device a tensor lives on: "cuda" means the first device, "cuda:0"."""
    if d is None:
        return CPU
    dev = d if isinstance(d, Device) else Device(d)
    if dev.index is None and dev.type != "cpu":
        dev = Device(dev.type, 0)
    return dev


CPU = Device("cpu")
