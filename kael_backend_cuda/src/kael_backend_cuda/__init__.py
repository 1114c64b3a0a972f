"""kael-backend-cuda: kael's backend for device "cuda", on CuPy (cuBLAS matmul, fused CUDA kernels).

Installed, it serves ``kael.tensor(..., device="cuda")`` through the ``kael.backends``
entry point (``kael_backend_cuda.plugin``). ``KAEL_CUDA_EMULATE=1`` runs the same glue
code with NumPy standing in for CuPy, so that machines without a GPU test it.
"""

from __future__ import annotations

from ._backend import CudaBackend
from ._xp import DEVICES_ENV, EMULATE_ENV

__version__ = "0.1.0"

__all__ = ["CudaBackend", "EMULATE_ENV", "DEVICES_ENV", "__version__"]
