"""What the cuda op tests (test_cuda_llama_ops.py, test_cuda_gemma_ops.py, test_cuda_moe_ops.py) share: their
float tolerances (``TOL``), tensors onto and off the emulated device (``to_cuda``, ``to_host``), and the kernels an
op ran (``ops_seen``: each kernel looked up through dispatch; ``ops_called``: each call of one).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import kael
import numpy as np

__all__ = ["TOL", "ops_called", "ops_seen", "to_cuda", "to_host"]

#: rtol by dtype for a kernel against its float64 NumPy formula.
TOL = {"float32": 2e-6, "float64": 1e-12, "float16": 2e-3, "bfloat16": 1.6e-2}


def _with_wrapper(fn: Callable[[], Any], wrapper: Any) -> Any:
    """fn() with dispatch's kernel wrapper set to ``wrapper`` (unset afterwards)."""
    kael.backends.dispatch.set_kernel_wrapper(wrapper)
    try:
        return fn()
    finally:
        kael.backends.dispatch.set_kernel_wrapper(None)


def ops_seen(fn: Callable[[], Any]) -> tuple[Any, list[str]]:
    """fn()'s result, and the kernels dispatch looked up for it (one entry per look-up)."""
    seen: list[str] = []

    def wrap(dev: Any, op: str, backend: Any, k: Any) -> Any:
        seen.append(op)
        return k

    return _with_wrapper(fn, wrap), seen


def ops_called(fn: Callable[[], Any]) -> tuple[Any, list[str]]:
    """fn()'s result, and the kernels it called (one entry per call)."""
    seen: list[str] = []

    def wrap(dev: Any, op: str, backend: Any, k: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            seen.append(op)
            return k(*args, **kwargs)

        return run

    return _with_wrapper(fn, wrap), seen


def to_host(t: kael.Tensor) -> np.ndarray:
    """A tensor's values (detached) as a float64 NumPy array."""
    return np.asarray(t.detach().to(dtype=kael.float64).cpu(), dtype=np.float64)


def to_cuda(a: np.ndarray, dtype: str = "float32", grad: bool = False) -> kael.Tensor:
    """``a`` as a cuda tensor of ``dtype`` (requiring grad when ``grad``)."""
    return kael.tensor(a, dtype=getattr(kael, dtype), device="cuda", requires_grad=grad)
