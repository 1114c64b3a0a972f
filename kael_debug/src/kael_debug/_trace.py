"""set_backward_trace: one line per autograd node as backward runs."""

from __future__ import annotations

from typing import TextIO

from . import _hooks

__all__ = ["set_backward_trace"]


def set_backward_trace(stream: TextIO | None) -> None:
    """Print `backward <Node> shape=[..] norm=<L2 in float64>` to stream for each node; None turns it off."""
    _hooks.trace_stream = stream
    _hooks.sync()
