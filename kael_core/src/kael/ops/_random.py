"""Random number generation: a Generator with a seed, and the global default one."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._device import CPU, Device, as_device

__all__ = ["Generator", "manual_seed", "default_generator", "seed"]


class Generator:
    """A seeded source of random numbers (PCG64 on the host), like torch.Generator.

    Backends draw from ``numpy_rng()``; the same seed gives the same numbers on
    every backend that draws on the host.
    """

    def __init__(self, device: Any = "cpu") -> None:
        self.device: Device = as_device(device) if device is not None else CPU
        self._seed = 67280421310721
        self._rng = np.random.Generator(np.random.PCG64(self._seed))

    def manual_seed(self, seed: int) -> Generator:
        """Reseed this generator with ``seed`` (an int); returns the generator."""
        if isinstance(seed, bool) or not isinstance(seed, int):
            from .._errors import DTypeError

            raise DTypeError(f"manual_seed: expected an int seed, got {seed!r}")
        self._seed = seed & ((1 << 64) - 1)
        self._rng = np.random.Generator(np.random.PCG64(self._seed))
        return self

    def initial_seed(self) -> int:
        """The seed this generator was last seeded with."""
        return self._seed

    def seed(self) -> int:
        """Reseed this generator from fresh OS entropy and return the seed chosen."""
        s = int(np.random.SeedSequence().entropy) & ((1 << 63) - 1)  # type: ignore[arg-type]
        self.manual_seed(s)
        return s

    def get_state(self) -> dict[str, Any]:
        """The generator's state (its seed and bit generator state), for set_state."""
        return {"seed": self._seed, "state": self._rng.bit_generator.state}

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore a state that get_state returned."""
        self._seed = state["seed"]
        self._rng.bit_generator.state = state["state"]

    def numpy_rng(self) -> np.random.Generator:
        """The NumPy Generator the host random kernels draw from."""
        return self._rng


default_generator = Generator()


def manual_seed(seed: int) -> Generator:
    """Seed kael's default generator (rand, randn, randint, dropout, init, ...); returns it."""
    return default_generator.manual_seed(seed)


def seed() -> int:
    """Seed kael's default generator from fresh OS entropy and return the seed chosen."""
    return default_generator.seed()
