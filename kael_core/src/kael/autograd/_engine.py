"""The backward engine: dependency counting, gradient summation, hooks.

For each node we count the edges that reach it from the roots. A node runs once
all of them have delivered, with the gradients arriving at each of its output
slots summed first (so ``sum(w * w)`` hands AccumulateGrad one gradient). Plugins
observe nodes through the ``kael_backward_node_pre/post`` hooks; whether any is
implemented is checked once per backward, not per node.

One backward is a ``_GraphTask`` run in steps: seed the roots' gradients, count
the dependencies, (for ``grad()``) mark the inputs to capture, then run the ready
nodes one by one: tensor pre-hooks, ``retain_grad``, capture, the node's backward
between the plugin hooks, and delivery of its input gradients along its edges.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from .._errors import AutogradError, KaelError, ShapeError
from ._function import AccumulateGrad, Node
from ._grad_mode import STATE

__all__ = ["run_backward", "backward", "grad", "queue_callback"]

# The backwards running now, innermost last (a hook may run a backward of its own).
_RUNNING: list[_GraphTask] = []


def queue_callback(fn: Callable[[], None]) -> None:
    """Run ``fn()`` once the backward that is running now has run its last node (from a hook; like
    PyTorch's ``Variable._execution_engine.queue_callback``). Callbacks run in the order queued, with
    grad mode off; one may queue another."""
    if not _RUNNING:
        raise AutogradError("queue_callback: no backward is running; call it from a hook during backward")
    _RUNNING[-1].callbacks.append(fn)


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


def _edge(t: Any) -> tuple[Node, int]:
    """The (node, output slot) that receives the gradient of tensor t."""
    if t.grad_fn is not None:
        return t.grad_fn, t._output_nr
    return _leaf_node(t), 0


def _has_grad(buf: list[Any]) -> bool:
    return buf[0] is not None if len(buf) == 1 else any(g is not None for g in buf)


def run_backward(
    roots: tuple[Any, ...], grads: tuple[Any, ...], retain_graph: bool, inputs: tuple[Any, ...] | None = None
) -> tuple[Any, ...] | None:
    """Backpropagate from roots, seeded with grads (None: ones for a scalar root), into the leaves'
    ``.grad``; with inputs (``grad()``), return the gradients of inputs instead and leave ``.grad`` alone."""
    task = _GraphTask(retain_graph)
    starts = task.seed_roots(roots, grads)
    task.count_dependencies(starts)
    if inputs is not None:
        task.capture_inputs(inputs)
    task.run(roots)
    return tuple(task.captured) if inputs is not None else None


class _GraphTask:
    """The state of one backward: gradient buffers per node, dependency counts, the ready queue."""

    __slots__ = (
        "add",
        "buffers",
        "callbacks",
        "capture",
        "captured",
        "clone",
        "deps",
        "hook",
        "ready",
        "retain_graph",
        "shared",
    )

    def __init__(self, retain_graph: bool) -> None:
        from .. import ops  # not at module level: ops imports autograd

        self.add = ops.add
        self.clone = ops.clone
        self.retain_graph = retain_graph
        # NOTE [stealing gradients]: AccumulateGrad makes a leaf's first gradient its .grad without a copy.
        # That is only safe for a tensor nothing else keeps: `shared` holds the id() of every gradient that a
        # leaf has already taken in this backward, or that someone outside the engine holds (the caller's root
        # gradient, a hook's result, a retained .grad). Those reach AccumulateGrad as a copy, so two leaves
        # never share a .grad (AddBackward hands the same tensor to both inputs, CloneBackward passes it on).
        # The dict keeps its tensors alive until the end, so no id() is recycled meanwhile.
        self.shared: dict[int, Any] = {}
        # gradients arriving at the same slot are summed before the node runs
        self.buffers: dict[Node, list[Any]] = {}
        self.deps: dict[Node, int] = {}
        self.ready: deque[Node] = deque()
        # grad(): the (node, slot) whose gradient is input i's, and the gradients captured there
        self.capture: dict[tuple[Node, int], int] = {}
        self.captured: list[Any] = []
        self.hook: Any = None
        self.callbacks: list[Callable[[], None]] = []  # queue_callback()'s, run after the last node

    def seed_roots(self, roots: tuple[Any, ...], grads: tuple[Any, ...]) -> list[Node]:
        """Put each root's gradient into its node's slot; return the roots' nodes."""
        starts: list[Node] = []
        for i, (t, g) in enumerate(zip(roots, grads)):
            if not getattr(t, "requires_grad", False):
                raise AutogradError(
                    f"backward: element {i} of tensors does not require grad and does not have a grad_fn"
                )
            node, slot = _edge(t)
            user = g is not None and hasattr(g, "shape")
            g = _root_grad(t, g)
            if user:
                self.shared[id(g)] = g  # the caller keeps it
            self._add_to_slot(node, slot, g)
            starts.append(node)
        return starts

    def count_dependencies(self, starts: list[Node]) -> None:
        """Count, for every node reachable from the roots, the edges that reach it; queue the roots
        that no edge reaches."""
        deps = self.deps
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
                self.ready.append(n)

    def capture_inputs(self, inputs: tuple[Any, ...]) -> None:
        """grad(): remember the (node, slot) where each input's gradient arrives."""
        self.captured = [None] * len(inputs)
        for i, t in enumerate(inputs):
            if not getattr(t, "requires_grad", False):
                raise AutogradError(f"grad: input {i} does not require grad")
            self.capture[_edge(t)] = i

    def run(self, roots: tuple[Any, ...]) -> None:
        """Run the ready nodes until none is left, with grad mode off (backward formulas record nothing)."""
        hook = self.hook = _plugin_hooks()
        if hook is not None:
            hook.kael_backward_begin(roots=roots)
        prev = STATE.enabled
        STATE.enabled = False
        _RUNNING.append(self)
        try:
            ready = self.ready
            while ready:
                self.run_node(ready.popleft())
            callbacks = self.callbacks
            while callbacks:
                callbacks.pop(0)()
        finally:
            _RUNNING.pop()
            STATE.enabled = prev

    def run_node(self, node: Node) -> None:
        """Run one node whose gradients have all arrived, and pass its input gradients on."""
        buf = self.buffers.pop(node, None)
        if buf is None:
            buf = [None] * node.num_outputs()
        if node._pre_hooks:
            self._run_pre_hooks(node._pre_hooks, buf)
        if node._retained:
            self._retain_grads(node._retained, buf)
        if self.capture:
            self._capture(node, buf)
            if type(node) is AccumulateGrad:
                return  # grad() leaves .grad alone
        # a node that received no gradient at all passes none on (and a leaf's .grad is left alone)
        out = self._apply(node, buf) if _has_grad(buf) else ()
        self._deliver(node, out)

    def _run_pre_hooks(self, pre_hooks: dict[int, list[Callable[[Any], Any]]], buf: list[Any]) -> None:
        """A tensor hook on a non-leaf output may replace the gradient arriving at its slot."""
        for slot, hooks in pre_hooks.items():
            for h in hooks:
                if buf[slot] is not None:
                    r = h(buf[slot])
                    if r is not None and r is not buf[slot]:
                        buf[slot] = r
                        self.shared[id(r)] = r  # the hook's author may keep it

    def _retain_grads(self, retained: dict[int, Any], buf: list[Any]) -> None:
        """retain_grad(): a non-leaf output's .grad takes (or adds) the gradient arriving at its slot."""
        shared = self.shared
        for slot, t in list(retained.items()):
            g = buf[slot]
            if g is None:
                continue
            if t.grad is None:
                t.grad = g if id(g) not in shared else self.clone(g)
                shared[id(t.grad)] = t.grad
            else:
                t.grad = self.add(t.grad, g)

    def _capture(self, node: Node, buf: list[Any]) -> None:
        for slot in range(len(buf)):
            idx = self.capture.get((node, slot))
            if idx is not None:
                self.captured[idx] = buf[slot]

    def _apply(self, node: Node, buf: list[Any]) -> tuple[Any, ...]:
        """The node's backward on its summed output gradients, between the plugin hooks."""
        if type(node) is AccumulateGrad:
            self._hand_to_leaf(buf)
        grads_in = tuple(buf)
        hook = self.hook
        if hook is not None:
            hook.kael_backward_node_pre(node=node, grad_outputs=grads_in)
        out = node.apply(grads_in, self.retain_graph)
        if hook is not None:
            hook.kael_backward_node_post(node=node, grad_outputs=grads_in, grad_inputs=out)
        return out

    def _hand_to_leaf(self, buf: list[Any]) -> None:
        """A leaf may take its gradient as its .grad: a copy of one held elsewhere (NOTE [stealing gradients])."""
        if id(buf[0]) in self.shared:
            buf[0] = self.clone(buf[0])
        self.shared[id(buf[0])] = buf[0]

    def _deliver(self, node: Node, out: tuple[Any, ...]) -> None:
        """Add each input gradient (fitted to the input's shape and dtype) into the slot its edge leads to,
        and queue a node once every edge that reaches it has delivered."""
        deps, ready = self.deps, self.ready
        for i, e in enumerate(node.next_functions):
            if e is None:
                continue
            nxt, slot = e
            g = out[i] if i < len(out) else None
            if g is not None:
                if g.shape != node.input_shapes[i] or g.dtype is not node.input_meta[i][0]:
                    g = _fit(node, i, g)
                self._add_to_slot(nxt, slot, g)
            d = deps[nxt] - 1
            deps[nxt] = d
            if d == 0:
                ready.append(nxt)

    def _add_to_slot(self, node: Node, slot: int, g: Any) -> None:
        buf = self.buffers.get(node)
        if buf is None:
            buf = self.buffers[node] = [None] * node.num_outputs()
        buf[slot] = g if buf[slot] is None else self.add(buf[slot], g)


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
