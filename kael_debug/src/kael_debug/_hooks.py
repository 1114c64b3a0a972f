"""The backward hooks, registered with kael's plugin manager only while needed.

Settings are module-level and read on every call, so switching them from one
thread while another runs backward is safe: at worst a node sees the old value.
"""

from __future__ import annotations

import math
import threading
from typing import Any, TextIO

import kael
import numpy as np

__all__ = ["sync", "trace_stream", "anomaly"]

_lock = threading.Lock()
trace_stream: TextIO | None = None
anomaly = False
_NAME = "kael_debug.hooks"


def _grad_norm(g: Any) -> float:
    a = np.asarray(g, dtype=np.float64)  # the gradient's values on the host, any device and dtype
    return float(math.sqrt(float(np.sum(a * a))))


class _Hooks:
    @kael.hookimpl
    def kael_backward_node_pre(self, node: Any, grad_outputs: Any) -> None:
        stream = trace_stream
        if stream is None:
            return
        g = next((x for x in grad_outputs if x is not None), None)
        shape = list(g.shape) if g is not None else []
        norm = _grad_norm(g) if g is not None else 0.0
        stream.write(f"backward {node.name()} shape={shape} norm={norm:.6g}\n")

    @kael.hookimpl
    def kael_backward_node_post(self, node: Any, grad_outputs: Any, grad_inputs: Any) -> None:
        if not anomaly:
            return
        for g in grad_inputs:
            if g is not None and g.dtype.is_floating_point and bool(np.isnan(np.asarray(g)).any()):
                raise kael.KaelError(f"Function {node.name()} returned NaN in its gradient")


_instance = _Hooks()


def sync() -> None:
    """Register the hooks while a trace or anomaly detection is on; unregister otherwise."""
    with _lock:
        want = trace_stream is not None or anomaly
        have = kael.backends.hooks_registered(_NAME)
        if want and not have:
            kael.backends.register_hooks(_instance, _NAME)
        elif have and not want:
            kael.backends.unregister_hooks(_NAME)
