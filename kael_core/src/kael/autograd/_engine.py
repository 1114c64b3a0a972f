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

from .._errors import AutogradError, KaelError, ShapeError
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
            raise AutogradError(
                f"backward: grad can be implicitly created only for scalar outputs; "
                f"got shape {list(t.shape)}, pass gradient="
            )
        return ops.ones_like(t)
    if not hasattr(g, "shape"):
        g = ops.full_like(t, g)
    if tuple(g.shape) != tuple(t.shape):
        raise ShapeError(f"backward: gradient has shape {list(g.shape)}, expected {list(t.shape)}")
    return g


def run_backward(
    roots: tuple[Any, ...], grads: tuple[Any, ...], retain_graph: bool, inputs: tuple[Any, ...] | None = None
) -> tuple[Any, ...] | None:
    from .. import ops

    add = ops.add
    # NOTE [stealing gradients]: AccumulateGrad makes a leaf's first gradient its .grad without a copy.
    # That is only safe for a tensor nothing else keeps: `shared` holds the id() of every gradient that a
    # leaf has already taken in this backward, or that someone outside the engine holds (the caller's root
    # gradient, a hook's result, a retained .grad). Those reach AccumulateGrad as a copy, so two leaves
    # never share a .grad (AddBackward hands the same tensor to both inputs, CloneBackward passes it on).
    # The dict keeps its tensors alive until the end, so no id() is recycled meanwhile.
    shared: dict[int, Any] = {}

    # gradients arriving at the same slot are summed before the node runs
    buffers: dict[Node, list[Any]] = {}
    ready: deque[Node] = deque()
    deps: dict[Node, int] = {}
    starts: list[Node] = []
    for i, (t, g) in enumerate(zip(roots, grads)):
        if not getattr(t, "requires_grad", False):
            raise AutogradError(f"backward: element {i} of tensors does not require grad and does not have a grad_fn")
        node = t.grad_fn if t.grad_fn is not None else _leaf_node(t)
        slot = t._output_nr if t.grad_fn is not None else 0
        buf = buffers.setdefault(node, [None] * node.num_outputs())
        user = g is not None and hasattr(g, "shape")
        g = _root_grad(t, g)
        if user:
            shared[id(g)] = g  # the caller keeps it
        buf[slot] = g if buf[slot] is None else add(buf[slot], g)
        starts.append(node)
    # count, for every node reachable from the roots, the edges that reach it
    seen: set[Node] = set(starts)
    stack = list(seen)
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
            if not getattr(t, "requires_grad", False):
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
            buf = buffers.pop(node) if node in buffers else [None] * node.num_outputs()
            if node._pre_hooks:
                for slot, hooks in node._pre_hooks.items():
                    for h in hooks:
                        if buf[slot] is not None:
                            r = h(buf[slot])
                            if r is not None and r is not buf[slot]:
                                buf[slot] = r
                                shared[id(r)] = r  # the hook's author may keep it
            if node._retained:
                for slot, t in list(node._retained.items()):
                    g = buf[slot]
                    if g is not None:
                        if t.grad is None:
                            t.grad = g if id(g) not in shared else ops.clone(g)
                            shared[id(t.grad)] = t.grad
                        else:
                            t.grad = add(t.grad, g)
            if capture:
                for slot in range(len(buf)):
                    idx = capture.get((node, slot))
                    if idx is not None:
                        captured[idx] = buf[slot]
                if type(node) is AccumulateGrad:
                    continue
            # a node that received no gradient at all passes none on (and a leaf's .grad is left alone)
            if buf[0] is not None if len(buf) == 1 else any(g is not None for g in buf):
                if type(node) is AccumulateGrad:
                    if id(buf[0]) in shared:
                        buf[0] = ops.clone(buf[0])
                    shared[id(buf[0])] = buf[0]
                grads_in = tuple(buf)
                if hook is not None:
                    hook.kael_backward_node_pre(node=node, grad_outputs=grads_in)
                out = node.apply(grads_in, retain_graph)
                if hook is not None:
                    hook.kael_backward_node_post(node=node, grad_outputs=grads_in, grad_inputs=out)
            else:
                out = ()
            for i, e in enumerate(node.next_functions):
                if e is None:
                    continue
                nxt, slot = e
                g = out[i] if i < len(out) else None
                if g is not None:
                    if g.shape != node.input_shapes[i] or g.dtype is not node.input_meta[i][0]:
                        g = _fit(node, i, g)
                    b = buffers.get(nxt)
                    if b is None:
                        b = buffers[nxt] = [None] * nxt.num_outputs()
                    b[slot] = g if b[slot] is None else add(b[slot], g)
                d = deps[nxt] - 1
                deps[nxt] = d
                if d == 0:
                    ready.append(nxt)
    finally:
        STATE.enabled = prev
    return tuple(captured) if inputs is not None else None


def _fit(node: Node, i: int, g: Any) -> Any:
    """A gradient for input i of another shape is summed down when it broadcasts to that shape (else an
    error), and one of another dtype is cast to the input's, as PyTorch's engine does."""
    from ..ops._core import broadcast_shapes, cast
    from ..ops._pointwise import sum_to

    want = tuple(node.input_shapes[i])
    if tuple(g.shape) != want:
        try:
            fits = broadcast_shapes(want, tuple(g.shape)) == tuple(g.shape)
        except KaelError:
            fits = False
        if not fits:
            raise AutogradError(
                f"{node.name()} returned a gradient of shape {list(g.shape)} for input {i}, expected {list(want)}"
            )
        g = sum_to(g, want)
    dtype = node.input_meta[i][0]
    return g if g.dtype is dtype else cast(g, dtype)


def _leaf_node(t: Any) -> Node:
    from ._function import _accumulator

    return _accumulator(t)


def backward(tensors: Any, grad_tensors: Any = None, retain_graph: bool = False) -> None:
    if not isinstance(tensors, (tuple, list)):
        tensors = (tensors,)
    if grad_tensors is None or not isinstance(grad_tensors, (tuple, list)):
        grad_tensors = (grad_tensors,) * len(tensors) if grad_tensors is None else (grad_tensors,)
    run_backward(tuple(tensors), tuple(grad_tensors), retain_graph)


def grad(
    outputs: Any, inputs: Any, grad_outputs: Any = None, retain_graph: bool | None = None, allow_unused: bool = False
) -> tuple[Any, ...]:
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
