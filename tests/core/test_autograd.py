"""The autograd engine, with exact expected values.

Graph recording (node names, edges, shapes), the backward pass (gradients summed before a
node runs, each node run once, retain_graph, non-scalar and several roots, leaves never
sharing a .grad tensor, grad dtypes), the engine hook points that plugins implement, and
tensor hooks and retain_grad.
"""

from __future__ import annotations

from typing import Any

import kael
import pytest
from kael import AutogradError, ShapeError
from kael._plugins import manager
from kael.autograd import AccumulateGrad
from tensor_values import t, val


class Recorder:
    """A plugin implementing the engine hooks, recording what it sees."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, Any]] = []

    @kael.hookimpl
    def kael_backward_begin(self, roots: Any) -> None:
        self.events.append(("begin", "", [tuple(r.shape) for r in roots]))

    @kael.hookimpl
    def kael_backward_node_pre(self, node: Any, grad_outputs: Any) -> None:
        self.events.append(("pre", node.name(), [None if g is None else val(g) for g in grad_outputs]))

    @kael.hookimpl
    def kael_backward_node_post(self, node: Any, grad_outputs: Any, grad_inputs: Any) -> None:
        self.events.append(("post", node.name(), [None if g is None else val(g) for g in grad_inputs]))


@pytest.fixture
def recorder() -> Any:
    rec = Recorder()
    manager.register(rec, "test_autograd_recorder")
    try:
        yield rec
    finally:
        manager.unregister("test_autograd_recorder")


# -- graph recording --------------------------------------------------------------------------


def test_leaf_and_node_names_edges_and_shapes() -> None:
    w = t([3.0, 3.0], grad=True)
    x = t([[1.0, 2.0]])
    y = (w * x).sum().sqrt()
    assert w.is_leaf and w.grad_fn is None and y.grad_fn is not None and not y.is_leaf
    assert y.grad_fn.name() == "SqrtBackward"
    (s_edge,) = y.grad_fn.next_functions
    assert s_edge is not None and s_edge[0].name() == "SumBackward"
    assert s_edge[0].input_shapes == ((1, 2),)
    mul = s_edge[0].next_functions[0][0]
    assert mul.name() == "MulBackward"
    assert mul.input_shapes == ((2,), (1, 2))
    acc, none_edge = mul.next_functions
    assert isinstance(acc[0], AccumulateGrad) and acc[0].name() == "AccumulateGrad" and acc[0].variable is w
    assert none_edge is None  # x does not require grad
    assert (w + 1).grad_fn.name() == "AddBackward"
    assert repr(y).endswith("grad_fn=<SqrtBackward>)")


def test_a_leaf_that_entered_a_graph_is_freed_without_the_cycle_collector() -> None:
    # NOTE [accumulator cycle]: the leaf refers to its accumulator weakly, so a leaf whose graphs are gone is freed
    # when the last reference goes (reference counts alone, the cycle collector off), its accumulator with it;
    # while a graph lives, it keeps the leaf alive (as PyTorch's): a hook on a leaf only the graph holds still
    # runs, and the graph's accumulator is the one get_gradient_edge gives.
    import gc
    import weakref

    gc.disable()
    try:
        w = t([1.0, 2.0], grad=True)
        (w * 2).sum().backward()
        assert val(w.grad) == [2.0, 2.0]
        node = kael.autograd.get_gradient_edge(w).node
        assert node.variable is w
        gone, acc = weakref.ref(w), weakref.ref(node)
        del w, node
        assert gone() is None and acc() is None

        seen: list[list[float]] = []
        v = t([3.0, 4.0], grad=True)
        v.register_hook(lambda g: seen.append(val(g)))
        posts: list[list[float]] = []
        v.register_post_accumulate_grad_hook(lambda leaf: posts.append(val(leaf.grad)))
        loss = v.sum() * 3  # (sum saves no input: only the accumulator refers to v)
        assert kael.autograd.get_gradient_edge(v).node is loss.grad_fn.next_functions[0][0].next_functions[0][0]
        held = weakref.ref(v)
        del v
        assert held() is not None  # the graph holds it
        loss.backward()
        assert seen == [[3.0, 3.0]] and posts == [[3.0, 3.0]]
        del loss
        assert held() is None
    finally:
        gc.enable()


def test_non_float_results_and_no_grad_inputs_record_nothing() -> None:
    x = t([1.0, -2.0], grad=True)
    assert not (x > 0).requires_grad and (x > 0).grad_fn is None
    assert kael.argmax(x).grad_fn is None
    y = t([1.0, 2.0]) * 2
    assert not y.requires_grad and y.grad_fn is None


# -- the engine ---------------------------------------------------------------------------------


def test_gradients_are_summed_before_accumulate_grad_runs(recorder: Recorder) -> None:
    w = t([3.0, 3.0], grad=True)
    seen = []
    w.register_hook(lambda g: seen.append(val(g)))
    (w * w).sum().backward()
    assert seen == [[6.0, 6.0]]  # one call with the sum, not two with [3, 3]
    acc = [e for e in recorder.events if e[1] == "AccumulateGrad"]
    assert acc == [("pre", "AccumulateGrad", [[6.0, 6.0]]), ("post", "AccumulateGrad", [])]
    assert val(w.grad) == [6.0, 6.0]


def test_diamond_graph_runs_each_node_once_after_all_its_inputs(recorder: Recorder) -> None:
    x = t([1.0, 2.0], grad=True)
    a = x * 2
    b = x * 3
    c = (a * b).sum()  # c = 6 x^2, dc/dx = 12 x
    c.backward()
    assert val(x.grad) == [12.0, 24.0]
    names = [e[1] for e in recorder.events if e[0] == "pre"]
    assert names.count("AccumulateGrad") == 1
    assert names[0] == "SumBackward" and names[-1] == "AccumulateGrad"
    # the node for a*b runs before both x*2 and x*3, which both run before the leaf
    assert names.index("MulBackward") == 1 and names[2:4] == ["MulBackward", "MulBackward"]
    assert recorder.events[0] == ("begin", "", [()])
    posts = [e for e in recorder.events if e[0] == "post" and e[1] == "SumBackward"]
    assert posts == [("post", "SumBackward", [[[1.0, 1.0]][0]])]


def test_hooks_are_checked_once_per_backward(monkeypatch: pytest.MonkeyPatch) -> None:
    from kael.autograd import _engine

    calls = []
    real = _engine._plugin_hooks

    def counting() -> Any:
        calls.append(1)
        return real()

    monkeypatch.setattr(_engine, "_plugin_hooks", counting)
    x = t([1.0, 2.0], grad=True)
    ((x * 2).exp() * x).sum().backward()
    assert len(calls) == 1
    assert real() is None  # no plugin implements the node hooks: the engine skips them entirely


def test_recorder_unregistered_sees_nothing() -> None:
    rec = Recorder()
    manager.register(rec, "test_autograd_recorder_2")
    manager.unregister("test_autograd_recorder_2")
    x = t([1.0], grad=True)
    (x * 2).sum().backward()
    assert rec.events == []


def test_backward_twice_without_retain_graph_fails_clearly() -> None:
    x = t([1.0, 2.0], grad=True)
    y = (x * x).sum()
    y.backward()
    with pytest.raises(AutogradError, match="second time.*retain_graph=True"):
        y.backward()


def test_retain_graph_allows_a_second_backward_and_grads_accumulate() -> None:
    x = t([1.0, 2.0], grad=True)
    y = (x * x).sum()
    y.backward(retain_graph=True)
    assert val(x.grad) == [2.0, 4.0]
    y.backward()
    assert val(x.grad) == [4.0, 8.0]


def test_backward_on_non_scalar_needs_gradient() -> None:
    x = t([1.0, 2.0], grad=True)
    with pytest.raises(AutogradError, match="scalar"):
        (x * 2).backward()
    (x * 2).backward(t([1.0, 10.0]))
    assert val(x.grad) == [2.0, 20.0]
    with pytest.raises(ShapeError, match=r"gradient has shape \[3\], expected \[2\]"):
        (x * 2).backward(t([1.0, 1.0, 1.0]))


def test_backward_of_tensor_without_grad_fails() -> None:
    with pytest.raises(AutogradError, match="does not require grad"):
        (t([1.0]) * 2).sum().backward()


def test_backward_from_several_roots() -> None:
    x = t([1.0, 2.0], grad=True)
    kael.autograd.backward([(x * 2).sum(), x * x], [None, t([1.0, 1.0])])
    assert val(x.grad) == [4.0, 6.0]


def test_gradient_of_a_leaf_root() -> None:
    x = t([1.0, 2.0], grad=True)
    g = t([5.0, 7.0])
    x.backward(g)
    assert val(x.grad) == [5.0, 7.0]
    g.mul_(0)  # the caller's gradient is not aliased by .grad
    assert val(x.grad) == [5.0, 7.0]


def test_two_leaves_never_share_a_grad_tensor() -> None:
    a, b = t([1.0, 2.0], grad=True), t([3.0, 4.0], grad=True)
    g = t([1.0, 1.0])
    (a + b).backward(g)  # AddBackward hands the same tensor to both inputs
    assert a.grad._storage is not b.grad._storage and a.grad._storage is not g._storage
    a.grad.mul_(10)
    assert val(b.grad) == [1.0, 1.0] and val(a.grad) == [10.0, 10.0]
    c, d = t([1.0], grad=True), t([2.0], grad=True)
    (c * 3 + d * 3).sum().backward()
    assert c.grad._storage is not d.grad._storage
    e, f = t([1.0, 2.0], grad=True), t([3.0, 4.0], grad=True)
    (e + f.clone()).backward(t([1.0, 1.0]) * 2)  # CloneBackward passes Add's gradient on unchanged
    assert e.grad._storage is not f.grad._storage and val(f.grad) == [2.0, 2.0]
    u = e.clone()
    u.retain_grad()
    e.grad = None
    (u * 1).backward(t([1.0, 1.0]) * 3)
    assert u.grad._storage is not e.grad._storage and val(e.grad) == [3.0, 3.0]


def test_grad_dtype_follows_the_leaf() -> None:
    x = t([1.0, 2.0], grad=True, dtype=kael.float32)
    y = t([3.0, 4.0], grad=True)
    (x * y).sum().backward()
    assert x.grad.dtype is kael.float32 and y.grad.dtype is kael.float64
    assert val(x.grad) == [3.0, 4.0] and val(y.grad) == [1.0, 2.0]
    z = t([1.5], grad=True, dtype=kael.float32)
    z.double().sum().backward()
    assert z.grad.dtype is kael.float32 and val(z.grad) == [1.0]


# -- hooks ---------------------------------------------------------------------------------------


def test_hook_on_a_leaf_replaces_its_gradient() -> None:
    x = t([1.0, 2.0], grad=True)
    x.register_hook(lambda g: g * 10)
    (x * 3).sum().backward()
    assert val(x.grad) == [30.0, 30.0]


def test_hook_on_an_intermediate_changes_what_flows_upstream() -> None:
    x = t([1.0, 2.0], grad=True)
    y = x * 2
    seen = []
    y.register_hook(lambda g: seen.append(val(g)))
    handle = y.register_hook(lambda g: g + 1)
    (y * y).sum().backward(retain_graph=True)  # dL/dy = 2y = [4, 8], +1 -> [5, 9]; dL/dx = 2 * that
    assert seen == [[4.0, 8.0]]
    assert val(x.grad) == [10.0, 18.0]
    handle.remove()
    x.grad = None
    (y * 1).sum().backward()
    assert val(x.grad) == [2.0, 2.0]


def test_register_hook_needs_requires_grad() -> None:
    with pytest.raises(AutogradError, match="doesn't require grad"):
        t([1.0]).register_hook(lambda g: g)


def test_retain_grad_keeps_an_intermediate_gradient() -> None:
    x = t([1.0, 2.0], grad=True)
    y = x * 3
    y.retain_grad()
    (y * y).sum().backward()
    assert val(y.grad) == [6.0, 12.0] and val(x.grad) == [18.0, 36.0]
