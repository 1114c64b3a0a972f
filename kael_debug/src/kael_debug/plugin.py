"""The kael.plugins entry point: reports itself, serves ``kael.debug``, and honours KAEL_TRACE_BACKWARD at load."""

from __future__ import annotations

import os
import sys
from typing import Any

import kael

__all__ = ["kael_plugin_info", "kael_namespace"]


@kael.hookimpl
def kael_plugin_info() -> dict[str, Any]:
    return {"name": "debug", "version": "0.1.0", "description": "explain, graphs, trace, anomaly, profiler"}


@kael.hookimpl
def kael_namespace(name: str) -> Any:
    """``kael.debug`` is this package."""
    if name != "debug":
        return None
    import kael_debug

    return kael_debug


if os.environ.get("KAEL_TRACE_BACKWARD"):
    from ._trace import set_backward_trace

    set_backward_trace(sys.stderr)
