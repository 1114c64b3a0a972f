"""Random kernels: drawn on the host from the kael.Generator's bit generator, then copied to the device.

Drawing on the host keeps a seed's stream identical on every backend (``kael.manual_seed(0)``
gives the same ``randn`` on cpu and cuda), at the price of a host-to-device copy; random
tensors are made at initialisation and for dropout masks, not in the decode loop.
"""

from __future__ import annotations

from typing import Any

from ._io import wr
from ._xp import asarray

__all__ = ["KERNELS"]


def uniform(out: Any, low: float, high: float, generator: Any) -> None:
    wr(out, asarray(low + (high - low) * generator.numpy_rng().random(out.shape)))


def normal(out: Any, mean: float, std: float, generator: Any) -> None:
    wr(out, asarray(mean + std * generator.numpy_rng().standard_normal(out.shape)))


def randint(out: Any, low: int, high: int, generator: Any) -> None:
    wr(out, asarray(generator.numpy_rng().integers(low, high, size=out.shape)))


KERNELS = {"uniform": uniform, "normal": normal, "randint": randint}
