"""Random kernels drawing from a kael.Generator's host bit generator (reproducible per seed).

Every CPU-memory backend that uses these gives the same numbers for the same seed; a
device backend can draw here into a host array and copy it over (as the CUDA one does).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._io import wr

__all__ = ["KERNELS", "uniform", "normal", "randint"]


def uniform(out: Any, low: float, high: float, generator: Any) -> None:
    """out ~ U[low, high), drawn from generator.numpy_rng()."""
    wr(out, low + (high - low) * generator.numpy_rng().random(out.shape))


def normal(out: Any, mean: float, std: float, generator: Any) -> None:
    """out ~ N(mean, std^2), drawn from generator.numpy_rng()."""
    wr(out, mean + std * generator.numpy_rng().standard_normal(out.shape))


def randint(out: Any, low: int, high: int, generator: Any) -> None:
    """out ~ integers uniform in [low, high), drawn from generator.numpy_rng()."""
    wr(out, generator.numpy_rng().integers(low, high, size=out.shape))


KERNELS: dict[str, Callable[..., None]] = {"uniform": uniform, "normal": normal, "randint": randint}
