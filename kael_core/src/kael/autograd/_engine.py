"""The backward engine: dependency counting, gradient summation, hooks.

For each node we count the edges that reach it from the roots. A node runs once
all of them have delivered, with the gradients arriving at each of its output
slots summed first (so ``sum(w * w)`` hands AccumulateGrad one gradient). Plugins
observe nodes through the ``kael_backward_node_pre/post`` hooks; whether any is
implemented is checked once per backward, not per node.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from .._errors import AutogradError, ShapeError
from ._function import AccumulateGrad, Node
from ._grad_mode import STATE

__all__ = ["run_backward", "backward", "grad"]


def _plugin_hooks() -> Any:
    from .._plugins import manager

    manager.ensure_loaded("kael.plugins")
    hook = manager.pm.hook
    if hook.kael_backward_node_pre.get_hookimpls() or hook.kael_backward_node_post.get_hookimpls():
        return hook
    return None


def _root_grad(t: Any, g: Any) -> Any:
    from .. import ops

    if g is None:
        if t.numel() != 1:
            raise AutogradError(f"backward: grad can be implicitly created only for scalar outputs; "
                                f"got shape {list(t.shape)}, pass gradient=")
        return ops.ones_like(t)
    if not hasattr(g, "shape"):
        g = ops.full_like(t, g)
    if tuple(g.shape) != tuple(t.shape):
        raise ShapeError(f"backward: gradient has shape {list(g.shape)}, expected {list(t.shape)}")
    return g


def run_backward(roots: tuple[Any, ...], grads: tuple[Any, ...], retain_graph: bool,
                 inputs: tuple[Any, ...] | None = None) -> tuple[Any, ...] | None:
    from .. import ops

    # NOTE: gradients at the same slot are summed before the node runs.
    buffers: dict[Node, list[Any]] = {}
    ready: deque[Node] = deque()
    deps: dict[Node, int] = {}
    starts: list[Node] = []
    for t, g in zip(roots, grads):
        if not t.requires_grad:
            raise AutogradError("backward: element 0 of tensors does not require grad and does not have a grad_fn")
        node = t.grad_fn if t.grad_fn is not None else _leaf_node(t)
        slot = t._output_nr if t.grad_fn is not None else 0
        buf = buffers.setdefault(node, [None] * node.num_outputs())
        g = _root_grad(t, g)
        buf[slot] = g if buf[slot] is None else ops.add(buf[slot], g)
        starts.append(node)
    # count dependencies
    seen: set[Node] = set()
    stack = list(dict.fromkeys(starts))
    for n in stack:
        seen.add(n)
    while stack:
        n = stack.pop()
        for e in n.next_functions:
            if e is None:
                continue
            nxt = e[0]
            deps[nxt] = deps.get(nxt, 0) + 1
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    for n in dict.fromkeys(starts):
        if deps.get(n, 0) == 0:
            ready.append(n)

    capture: dict[tuple[Node, int], int] = {}
    captured: list[Any] = []
    if inputs is not None:
        captured = [None] * len(inputs)
        for i, t in enumerate(inputs):
            if not t.requires_grad:
                raise AutogradError(f"grad: input {i} does not require grad")
            key = (t.grad_fn, t._output_nr) if t.grad_fn is not None else (_leaf_node(t), 0)
            capture[key] = i

    hook = _plugin_hooks()
    if hook is not None:
        hook.kael_backward_begin(roots=roots)
    prev = STATE.enabled
    STATE.enabled = False
    try:
        while ready:
            node = ready.popleft()
            buf = buffers.pop(node, None) or [None] * node.num_outputs()
            if node._pre_hooks:
                for slot, hooks in node._pre_hooks.items():
                    for h in hooks:
                        if buf[slot] is not None:
                            r = h(buf[slot])
                            if r is not None:
                                buf[slot] = r
            if node._retained:
                for slot, t in list(node._retained.items()):
                    if buf[slot] is not None:
                        t.grad = buf[slot] if t.grad is None else ops.add(t.grad, buf[slot])
            if capture:
                for slot in range(len(buf)):
                    idx = capture.get((node, slot))
                    if idx is not None:
                        captured[idx] = buf[slot]
                if isinstance(node, AccumulateGrad):
                    continue
            grads_in = tuple(
                g if g is not None else _zeros_for(node, i) for i, g in enumerate(buf)
            ) if isinstance(node, AccumulateGrad) or any(g is not None for g in buf) else None
            if grads_in is None:
                out: tuple[Any, ...] = (None,) * len(node.next_functions)
            else:
                grads_in = _fill_missing(node, grads_in)
                if hook is not None:
                    hook.kael_backward_node_pre(node=node, grad_outputs=grads_in)
                out = node.apply(grads_in, retain_graph)
                if hook is not None:
                    hook.kael_backward_node_post(node=node, grad_outputs=grads_in, grad_inputs=out)
            for e, g in zip(node.next_functions, out):
                if e is None:
                    continue
                nxt, slot = e
                if g is not None:
                    b = buffers.setdefault(nxt, [None] * nxt.num_outputs())
                    b[slot] = g if b[slot] is None else ops.add(b[slot], g)
                deps[nxt] -= 1
                if deps[nxt] == 0:
                    ready.append(nxt)
    finally:
        STATE.enabled = prev
    return tuple(captured) if inputs is not None else None


def _zeros_for(node: Node, slot: int) -> Any:
    return None


def _fill_missing(node: Node, grads: tuple[Any, ...]) -> tuple[Any, ...]:
    """Outputs of a multi-output node that got no gradient receive None; backward formulas handle it."""
    return grads


def _leaf_node(t: Any) -> Node:
    from ._function import _accumulator

    return _accumulator(t)


def backward(tensors: Any, grad_tensors: Any = None, retain_graph: bool = False) -> None:
    if not isinstance(tensors, (tuple, list)):
        tensors = (tensors,)
    if grad_tensors is None or not isinstance(grad_tensors, (tuple, list)):
        grad_tensors = (grad_tensors,) * len(tensors) if grad_tensors is None else (grad_tensors,)
    run_backward(tuple(tensors), tuple(grad_tensors), retain_graph)


def grad(outputs: Any, inputs: Any, grad_outputs: Any = None, retain_graph: bool | None = None,
         allow_unused: bool = False) -> tuple[Any, ...]:
    """Gradients of outputs with respect to inputs, without touching ``.grad``."""
    single = not isinstance(outputs, (tuple, list))
    outs = (outputs,) if single else tuple(outputs)
    ins = (inputs,) if not isinstance(inputs, (tuple, list)) else tuple(inputs)
    if grad_outputs is None:
        gouts: tuple[Any, ...] = (None,) * len(outs)
    else:
        gouts = (grad_outputs,) if not isinstance(grad_outputs, (tuple, list)) else tuple(grad_outputs)
    res = run_backward(outs, gouts, bool(retain_graph), inputs=ins)
    assert res is not None
    if not allow_unused:
        for i, g in enumerate(res):
            if g is None:
                raise AutogradError(f"grad: input {i} was not used in the graph; pass allow_unused=True")
    return res
