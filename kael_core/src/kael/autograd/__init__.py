"""Autograd: graph recording, the backward engine, grad modes and custom Functions."""

from ._engine import backward, grad
from ._function import AccumulateGrad, Context, Function, Node
from ._grad_mode import enable_grad, inference_mode, is_grad_enabled, no_grad, set_grad_enabled

__all__ = [
    "Function",
    "Node",
    "AccumulateGrad",
    "Context",
    "backward",
    "grad",
    "no_grad",
    "enable_grad",
    "set_grad_enabled",
    "inference_mode",
    "is_grad_enabled",
]
