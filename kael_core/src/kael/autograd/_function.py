"""Autograd nodes and custom Functions.

A differentiable op is a ``Function`` subclass with static ``forward(ctx, ...)``
and ``backward(ctx, *grads)``. ``apply`` runs forward without recording, and when
grad is enabled and an input requires grad it attaches a node named
``<Name>Backward`` to the outputs. The node keeps one edge per tensor input
(``next_functions``: (node, output slot) or None) and the shape of each input,
which is the shape of the gradient that flows along that edge.

Graph walking (public, for tools such as kael-debug): ``get_gradient_edge(t)`` gives the
node a tensor's gradient flows into (its ``grad_fn``, or a leaf's ``AccumulateGrad``);
from there each ``Node`` has ``name()``, ``next_functions`` (per tensor input: the
``(node, slot)`` its gradient flows on to, or None) and ``input_shapes``.

NOTE [version counter]: ``ctx.save_for_backward`` records each tensor's storage
version; reading ``ctx.saved_tensors`` after an in-place change raises.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, NamedTuple

from .._errors import AutogradError
from .._tensor import Tensor
from ._grad_mode import STATE

__all__ = ["Function", "Node", "AccumulateGrad", "Context", "GradientEdge", "get_gradient_edge"]


class Context:
    __slots__ = ("__dict__", "_released", "_saved", "_versions", "needs_input_grad", "node_name")

    def __init__(self) -> None:
        self._saved: tuple[Any, ...] = ()
        self._versions: tuple[int, ...] = ()
        self._released = False
        self.needs_input_grad: tuple[bool, ...] = ()
        self.node_name = ""

    def save_for_backward(self, *tensors: Any) -> None:
        self._saved = tensors
        self._versions = tuple(-1 if t is None else t._storage.version for t in tensors)

    @property
    def saved_tensors(self) -> tuple[Any, ...]:
        if self._released:
            raise AutogradError(
                f"{self.node_name}: trying to backward through the graph a second time (its saved tensors were "
                "freed); pass retain_graph=True to the first backward()"
            )
        for i, (t, v) in enumerate(zip(self._saved, self._versions)):
            if t is not None and t._storage.version != v:
                raise AutogradError(
                    f"{self.node_name}: saved tensor {i} of shape {list(t.shape)} was modified by an in-place "
                    f"operation (version {t._storage.version}, expected {v}); gradient computation needs its "
                    "original value"
                )
        return self._saved


class _NoCtx:
    """Context used when no graph is recorded: saving is a no-op."""

    __slots__ = ()
    needs_input_grad: tuple[bool, ...] = ()

    def save_for_backward(self, *tensors: Any) -> None:
        pass

    def __setattr__(self, name: str, value: Any) -> None:
        pass


NO_CTX: Any = _NoCtx()


class Node:
    """A node of the backward graph.

    Public: ``name()`` (``<Function>Backward``, or ``AccumulateGrad`` for a leaf),
    ``next_functions`` (one entry per tensor input of the op: the ``(node, slot)`` the
    gradient for that input flows into, or None where the input needs no gradient) and
    ``input_shapes`` (per tensor input, the shape of the gradient sent along that edge).
    """

    __slots__ = ("__weakref__", "_pre_hooks", "_retained", "input_meta", "input_shapes", "next_functions")

    def __init__(self) -> None:
        self.next_functions: tuple[tuple[Node, int] | None, ...] = ()
        self.input_shapes: tuple[tuple[int, ...], ...] = ()
        self.input_meta: tuple[Any, ...] = ()  # (dtype, device) per input, to shape zero grads
        self._pre_hooks: dict[int, list[Callable[[Any], Any]]] | None = None
        self._retained: dict[int, Any] | None = None

    def name(self) -> str:
        return type(self).__name__

    def apply(self, grads: tuple[Any, ...], retain_graph: bool) -> tuple[Any, ...]:
        raise NotImplementedError

    def num_outputs(self) -> int:
        return 1

    def register_prehook(self, slot: int, fn: Callable[[Any], Any]) -> None:
        if self._pre_hooks is None:
            self._pre_hooks = {}
        self._pre_hooks.setdefault(slot, []).append(fn)

    def __repr__(self) -> str:
        return f"<{self.name()}>"


class AccumulateGrad(Node):
    """The sink for a leaf tensor: adds the incoming gradient into ``tensor.grad``, then runs the
    tensor's post-accumulate-grad hooks (``Tensor.register_post_accumulate_grad_hook``) on it.

    NOTE [accumulator cycle]: as PyTorch's, the accumulator holds its leaf (``variable``: a graph keeps the
    leaves its gradients flow into alive) and the leaf refers to its accumulator weakly (``t._accumulator``; the
    post-accumulate hooks live on the leaf), so the accumulator lives as long as a graph or a GradientEdge holds
    it. Both ways strong, every leaf that ever entered a graph was a reference cycle, freed only when Python's
    cycle collector ran: a model's replaced float32 weights (``from_pretrained(weights="q8_0")``) stayed in
    memory after the load."""

    __slots__ = ("variable",)

    def __init__(self, variable: Any) -> None:
        super().__init__()
        self.variable = variable

    def apply(self, grads: tuple[Any, ...], retain_graph: bool) -> tuple[Any, ...]:
        (g,) = grads
        t = self.variable
        own = True  # the engine hands over gradients nothing else holds (NOTE [stealing gradients])
        if t._hooks:
            for h in t._hooks:
                r = h(g)
                if r is not None and r is not g:
                    g, own = r, False
        if t.grad is None:
            t.grad = g.detach() if own and g._base is None and g.grad_fn is None else g.detach().clone()
        else:
            from .. import ops

            t.grad = ops.add(t.grad, g)
        if t._post_acc_hooks:
            for post in list(t._post_acc_hooks):
                post(t)
        return ()


class BackwardNode(Node):
    """The node a Function.apply creates."""

    __slots__ = ("_name", "ctx", "fn", "n_outputs", "tensor_pos")

    def __init__(self, fn: type[Function], ctx: Context, n_outputs: int) -> None:
        super().__init__()
        self.fn = fn
        self.ctx = ctx
        self.n_outputs = n_outputs
        self._name = fn.__name__ + "Backward"
        self.tensor_pos: tuple[int, ...] = ()

    def name(self) -> str:
        return self._name

    def num_outputs(self) -> int:
        return self.n_outputs

    def apply(self, grads: tuple[Any, ...], retain_graph: bool) -> tuple[Any, ...]:
        ctx = self.ctx
        out = self.fn.backward(ctx, *grads)
        if not isinstance(out, tuple):
            out = (out,)
        pos = self.tensor_pos
        if len(out) < len(pos) or (len(out) > len(pos) and len(out) <= pos[-1]):
            raise AutogradError(f"{self._name}: backward returned {len(out)} gradients, expected one per input")
        if len(out) != len(pos):
            out = tuple(out[i] for i in pos)
        if not retain_graph:
            ctx._saved = ()
            ctx._released = True
        return out  # type: ignore[no-any-return]


class GradientEdge(NamedTuple):
    """Where a tensor's gradient enters the backward graph: a node and the node's output slot."""

    node: Node
    output_nr: int


def get_gradient_edge(t: Tensor) -> GradientEdge:
    """The node t's gradient flows into: ``(t.grad_fn, slot)``, or for a leaf that requires grad its
    ``AccumulateGrad`` (made on first use, slot 0); like ``torch.autograd.graph.get_gradient_edge``."""
    if not isinstance(t, Tensor):
        raise AutogradError(f"get_gradient_edge: expected a kael.Tensor, got {type(t).__name__}")
    if t.grad_fn is not None:
        return GradientEdge(t.grad_fn, t._output_nr)
    if not t.requires_grad:
        raise AutogradError(
            f"get_gradient_edge: the tensor of shape {list(t.shape)} does not require grad, so it has no gradient edge"
        )
    return GradientEdge(_accumulator(t), 0)


def _accumulator(t: Any) -> AccumulateGrad:
    """The leaf's accumulator: the one a live graph holds, or a new one (NOTE [accumulator cycle])."""
    ref = t._accumulator
    acc = ref() if ref is not None else None
    if acc is None:
        acc = AccumulateGrad(t)
        acc.input_shapes = (t.shape,)
        t._accumulator = weakref.ref(acc)
    return acc


class Function:
    """Subclass with static forward(ctx, *args) and backward(ctx, *grad_outputs).

    backward returns one gradient (or None) per positional input of forward.
    """

    @staticmethod
    def forward(ctx: Any, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        raise NotImplementedError

    @classmethod
    def apply(cls, *args: Any, **kwargs: Any) -> Any:
        if STATE.enabled:
            need = False
            for a in args:
                if isinstance(a, Tensor) and a.requires_grad:
                    need = True
                    break
        else:
            need = False
        if not need:
            return cls.forward(NO_CTX, *args, **kwargs)
        ctx = Context()
        ctx.node_name = cls.__name__ + "Backward"
        ctx.needs_input_grad = tuple(isinstance(a, Tensor) and a.requires_grad for a in args)
        STATE.enabled = False
        try:
            out = cls.forward(ctx, *args, **kwargs)
        finally:
            STATE.enabled = True
        outs = out if isinstance(out, tuple) else (out,)
        node = BackwardNode(cls, ctx, len(outs))
        edges: list[tuple[Node, int] | None] = []
        shapes = []
        meta = []
        pos = []
        for j, a in enumerate(args):
            if isinstance(a, Tensor):
                pos.append(j)
                shapes.append(a.shape)
                meta.append((a.dtype, a.device))
                if not a.requires_grad:
                    edges.append(None)
                elif a.grad_fn is not None:
                    edges.append((a.grad_fn, a._output_nr))
                else:
                    edges.append((_accumulator(a), 0))
        node.next_functions = tuple(edges)
        node.input_shapes = tuple(shapes)
        node.input_meta = tuple(meta)
        node.tensor_pos = tuple(pos)
        for i, o in enumerate(outs):
            if isinstance(o, Tensor) and o.dtype.is_floating_point:
                if o.grad_fn is not None or o.requires_grad:
                    # forward returned an input (or a view of one made without recording); detach-alias it
                    o = o._alias()
                    outs = outs[:i] + (o,) + outs[i + 1 :]
                o.requires_grad = True
                o.grad_fn = node
                o._output_nr = i
        return outs if isinstance(out, tuple) else outs[0]
