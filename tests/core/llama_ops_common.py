"""What the tests/core/test_llama_ops*.py files share: the backends each op runs on, and tensor conversions.

``backend_mode`` makes one of ``MODES`` the CPU backend for a test: the CPU backend as installed
("default"), the reference backend with its fused host kernels ("reference"), or the reference
backend without fused kernels, so ops run as the frontend's decompositions ("decomposition").
``tensor_of`` makes a kael tensor (optionally requiring gradients) from a NumPy array, and
``float64_of`` reads a tensor back as a float64 NumPy array.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import kael
import numpy as np
from kael.backends.reference import ReferenceBackend

__all__ = ["MODES", "backend_mode", "float64_of", "tensor_of"]

MODES = ["default", "reference", "decomposition"]


@contextmanager
def backend_mode(mode: str) -> Iterator[str]:
    """Runs the body with ``mode`` (one of ``MODES``) as the CPU backend, and restores the default after."""
    if mode == "default":
        yield mode
        return
    backend = ReferenceBackend(fused=mode == "reference")
    backend.name = f"llama_ops_{mode}"
    backend.priority = -1

    class Plugin:
        @kael.hookimpl
        def kael_backends(self) -> list[Any]:
            return [backend]

    kael.backends.register(Plugin(), f"test_llama_ops_{mode}")
    kael.backends.use("cpu", backend.name)
    try:
        yield mode
    finally:
        kael.backends.use("cpu", None)
        kael.backends.unregister(f"test_llama_ops_{mode}")


def tensor_of(a: np.ndarray, grad: bool = False, dtype: Any = None) -> kael.Tensor:
    """``a`` as a kael tensor (of ``dtype`` when given), requiring gradients when ``grad``."""
    t = kael.tensor(a, dtype=dtype)
    return t.requires_grad_(True) if grad else t


def float64_of(t: kael.Tensor) -> np.ndarray:
    """``t`` detached, as a float64 NumPy array (a 2-byte float through kael.float64 first)."""
    return np.asarray(t.detach().to(dtype=kael.float64) if t.dtype.itemsize == 2 else t.detach(), dtype=np.float64)
