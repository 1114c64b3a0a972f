"""The ``kael.backends`` entry point: registers CudaBackend with kael's plugin manager.

Loading this module is cheap and never fails on a machine without a GPU: CuPy is
imported only when the backend is first asked whether it is available.
"""

from __future__ import annotations

from typing import Any

import kael

from ._backend import CudaBackend

__all__ = ["kael_backends", "kael_plugin_info"]


@kael.hookimpl
def kael_backends() -> list[Any]:
    return [CudaBackend()]


@kael.hookimpl
def kael_plugin_info() -> dict[str, Any]:
    from . import __version__

    return {
        "name": "kael-backend-cuda",
        "version": __version__,
        "description": "CuPy backend for device 'cuda' (KAEL_CUDA_EMULATE=1 runs it on the host)",
    }
