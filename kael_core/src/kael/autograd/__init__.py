"""Autograd: graph recording, the backward engine, grad modes, custom Functions and graph walking.

Graph walking: ``get_gradient_edge(t)`` is the ``GradientEdge(node, output_nr)`` where t's
gradient enters the graph (``t.grad_fn``, or a leaf's ``AccumulateGrad``). Each ``Node``
has ``name()``, ``next_functions`` (per tensor input, the ``(node, slot)`` its gradient
flows on to, or None) and ``input_shapes`` (per tensor input, the gradient's shape).

Hooks for data-parallel training: ``Tensor.register_post_accumulate_grad_hook(fn)`` runs
``fn(tensor)`` after a leaf's ``.grad`` has taken this backward's gradient, and
``queue_callback(fn)`` (from a hook) runs ``fn()`` when the running backward has finished.
"""

from ._engine import backward, grad, queue_callback
from ._function import AccumulateGrad, Context, Function, GradientEdge, Node, get_gradient_edge
from ._grad_mode import enable_grad, inference_mode, is_grad_enabled, no_grad, set_grad_enabled

__all__ = [
    "Function",
    "Node",
    "AccumulateGrad",
    "Context",
    "GradientEdge",
    "get_gradient_edge",
    "backward",
    "grad",
    "queue_callback",
    "no_grad",
    "enable_grad",
    "set_grad_enabled",
    "inference_mode",
    "is_grad_enabled",
]
