"""The ``kael.backends`` entry point: registers CpuBackend through pluggy."""

from __future__ import annotations

from typing import Any

import kael

__all__ = ["kael_backends", "kael_plugin_info"]


@kael.hookimpl
def kael_backends() -> list[Any]:
    from ._backend import CpuBackend

    return [CpuBackend()]


@kael.hookimpl
def kael_plugin_info() -> dict[str, Any]:
    from . import __version__

    return {
        "name": "kael-backend-cpu",
        "version": __version__,
        "description": "C++17 kernels, thread pool and caching allocator for device cpu",
    }
