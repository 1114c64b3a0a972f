"""Random kernels drawing from a kael.Generator's host bit generator (reproducible per seed)."""

from __future__ import annotations

from typing import Any

from ._io import wr

__all__ = ["KERNELS"]


def uniform(out: Any, low: float, high: float, generator: Any) -> None:
    wr(out, low + (high - low) * generator.numpy_rng().random(out.shape))


def normal(out: Any, mean: float, std: float, generator: Any) -> None:
    wr(out, mean + std * generator.numpy_rng().standard_normal(out.shape))


def randint(out: Any, low: int, high: int, generator: Any) -> None:
    wr(out, generator.numpy_rng().integers(low, high, size=out.shape))


KERNELS = {"uniform": uniform, "normal": normal, "randint": randint}
