"""The autograd engine and its API, with exact expected values.

Graph recording (node names, edges, shapes), gradient summation before a node runs,
retain_graph, the version counter, tensor hooks, grad modes, detach/requires_grad_,
custom Functions, kael.autograd.grad, in-place ops and views (CopySlices), gradients
of views, and the engine hook points that plugins implement.
"""

from __future__ import annotations

from typing import Any

import kael
import numpy as np
import pytest
from kael import AutogradError, DTypeError, ShapeError
from kael._plugins import manager
from kael.autograd import AccumulateGrad, Function


def t(values: Any, grad: bool = False, dtype: Any = kael.float64) -> kael.Tensor:
    return kael.tensor(values, dtype=dtype, requires_grad=grad)


def val(x: kael.Tensor) -> Any:
    return x.detach().tolist()


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


# -- version counter ----------------------------------------------------------------------------


def test_saved_tensor_modified_in_place_names_the_op() -> None:
    x = t([1.0, 2.0], grad=True)
    y = x.exp()  # ExpBackward saves its output
    y.add_(1.0)
    with pytest.raises(
        AutogradError,
        match=r"ExpBackward: saved tensor 0 of shape \[2\] was modified by an "
        r"in-place operation",
    ):
        y.sum().backward()


def test_saved_input_modified_in_place_names_the_op() -> None:
    x = t([1.0, 2.0], grad=True)
    a = x.clone()
    b = t([3.0, 4.0])
    y = a * b  # MulBackward saves a and b
    b.add_(1.0)
    assert b._version() == 1
    with pytest.raises(AutogradError, match="MulBackward: saved tensor 1"):
        y.sum().backward()


def test_in_place_on_a_view_bumps_the_shared_version() -> None:
    x = t([1.0, 2.0, 3.0])
    v = x[1:]
    before = x._version()
    v.mul_(2)
    assert x._version() == before + 1 and val(x) == [1.0, 4.0, 6.0]


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


# -- grad modes -------------------------------------------------------------------------------


def test_no_grad_enable_grad_and_set_grad_enabled() -> None:
    x = t([1.0], grad=True)
    with kael.no_grad():
        assert not kael.is_grad_enabled()
        assert not (x * 2).requires_grad
        with kael.enable_grad():
            assert (x * 2).requires_grad
        assert not (x * 2).requires_grad
    assert kael.is_grad_enabled()
    with kael.set_grad_enabled(False):
        assert not (x * 2).requires_grad
    assert kael.is_grad_enabled()
    kael.set_grad_enabled(False)
    try:
        assert not kael.is_grad_enabled()
    finally:
        kael.set_grad_enabled(True)

    @kael.no_grad()
    def f(v: kael.Tensor) -> kael.Tensor:
        return v * 2

    assert not f(x).requires_grad and kael.is_grad_enabled()


def test_grad_mode_restored_after_an_exception() -> None:
    with pytest.raises(ValueError), kael.no_grad():
        raise ValueError("boom")
    assert kael.is_grad_enabled()


def test_inference_mode() -> None:
    x = t([1.0], grad=True)
    with kael.inference_mode():
        y = x * 2
        assert not y.requires_grad and not kael.is_grad_enabled()
        with pytest.raises(AutogradError, match="inference_mode"):
            t([1.0]).requires_grad_()
    assert kael.is_grad_enabled() and (x * 2).requires_grad
    with kael.inference_mode(False):
        assert (x * 2).requires_grad


# -- detach / requires_grad_ ------------------------------------------------------------------


def test_detach_shares_memory_and_drops_history() -> None:
    x = t([1.0, 2.0], grad=True)
    y = x * 2
    d = y.detach()
    assert not d.requires_grad and d.grad_fn is None and d._storage is y._storage
    with kael.no_grad():
        d.mul_(10)
    assert val(y) == [20.0, 40.0]
    assert not (d * x.detach()).requires_grad


def test_requires_grad_() -> None:
    x = t([1.0])
    assert x.requires_grad_() is x and x.requires_grad and x.is_leaf
    x.requires_grad_(False)
    assert not x.requires_grad
    with pytest.raises(DTypeError, match="floating-point"):
        kael.tensor([1, 2]).requires_grad_()
    y = t([1.0], grad=True) * 2
    with pytest.raises(AutogradError, match="non-leaf"):
        y.requires_grad_(False)


# -- custom Functions -------------------------------------------------------------------------


class Cube(Function):
    @staticmethod
    def forward(ctx: Any, x: kael.Tensor, scale: float) -> kael.Tensor:
        ctx.save_for_backward(x)
        ctx.scale = scale
        return x * x * x * scale

    @staticmethod
    def backward(ctx: Any, g: kael.Tensor) -> Any:
        (x,) = ctx.saved_tensors
        return g * 3 * x * x * ctx.scale, None


class SplitSum(Function):
    """Two outputs: the sum and the sum of squares."""

    @staticmethod
    def forward(ctx: Any, x: kael.Tensor) -> tuple[kael.Tensor, kael.Tensor]:
        ctx.save_for_backward(x)
        return x.sum(), (x * x).sum()

    @staticmethod
    def backward(ctx: Any, g1: Any, g2: Any) -> Any:
        (x,) = ctx.saved_tensors
        r = kael.zeros_like(x)
        if g1 is not None:
            r = r + g1
        if g2 is not None:
            r = r + g2 * 2 * x
        return r


def test_custom_function_values_name_and_saved_tensors() -> None:
    x = t([1.0, 2.0], grad=True)
    y = Cube.apply(x, 2.0)
    assert val(y) == [2.0, 16.0]
    assert y.grad_fn.name() == "CubeBackward"
    assert y.grad_fn.ctx.needs_input_grad == (True, False)
    y.sum().backward()
    assert val(x.grad) == [6.0, 24.0]
    with pytest.raises(AutogradError, match="CubeBackward.*second time"):
        y.sum().backward()


def test_custom_function_with_two_outputs() -> None:
    x = t([1.0, 2.0], grad=True)
    s, q = SplitSum.apply(x)
    assert s.grad_fn is q.grad_fn and (s._output_nr, q._output_nr) == (0, 1)
    (s * 3 + q).backward()
    assert val(x.grad) == [5.0, 7.0]
    x.grad = None
    s, q = SplitSum.apply(x)
    q.backward()  # the first output gets no gradient: backward sees None for it
    assert val(x.grad) == [2.0, 4.0]


def test_custom_function_without_grad_records_nothing() -> None:
    y = Cube.apply(t([2.0]), 1.0)
    assert y.grad_fn is None and val(y) == [8.0]
    with kael.no_grad():
        assert Cube.apply(t([2.0], grad=True), 1.0).grad_fn is None


def test_custom_function_returning_none_leaves_grad_unset() -> None:
    class Blocked(Function):
        @staticmethod
        def forward(ctx: Any, x: kael.Tensor) -> kael.Tensor:
            return x * 1

        @staticmethod
        def backward(ctx: Any, g: kael.Tensor) -> Any:
            return None

    x = t([1.0], grad=True)
    Blocked.apply(x).sum().backward()
    assert x.grad is None


def test_custom_function_gradient_shape_is_checked() -> None:
    class WrongShape(Function):
        @staticmethod
        def forward(ctx: Any, x: kael.Tensor) -> kael.Tensor:
            return x * 1

        @staticmethod
        def backward(ctx: Any, g: kael.Tensor) -> Any:
            return kael.ones(3, dtype=kael.float64)

    with pytest.raises(
        AutogradError,
        match=r"WrongShapeBackward returned a gradient of shape \[3\] for input 0, "
        r"expected \[2\]",
    ):
        WrongShape.apply(t([1.0, 2.0], grad=True)).sum().backward()

    class Broadcast(Function):
        @staticmethod
        def forward(ctx: Any, x: kael.Tensor) -> kael.Tensor:
            return x.sum()

        @staticmethod
        def backward(ctx: Any, g: kael.Tensor) -> Any:
            return kael.ones(3, 2, dtype=kael.float64)  # summed down to [2]

    x = t([1.0, 2.0], grad=True)
    Broadcast.apply(x).backward()
    assert val(x.grad) == [3.0, 3.0]

    class OtherDtype(Function):
        @staticmethod
        def forward(ctx: Any, x: kael.Tensor) -> kael.Tensor:
            return x * 1

        @staticmethod
        def backward(ctx: Any, g: kael.Tensor) -> Any:
            return g.double() * 0.5  # cast back to the input's float32

    x32 = t([1.0, 2.0], grad=True, dtype=kael.float32)
    OtherDtype.apply(x32).sum().backward()
    assert x32.grad.dtype is kael.float32 and val(x32.grad) == [0.5, 0.5]


def test_custom_function_saved_tensor_version_check() -> None:
    x = t([1.0, 2.0], grad=True)
    a = x * 1
    y = Cube.apply(a, 1.0)
    with kael.no_grad():
        a.add_(1.0)
    with pytest.raises(AutogradError, match="CubeBackward: saved tensor 0"):
        y.sum().backward()


# -- kael.autograd.grad --------------------------------------------------------------------------


def test_autograd_grad_returns_gradients_without_touching_dot_grad() -> None:
    x = t([1.0, 2.0], grad=True)
    y = t([3.0], grad=True)
    out = (x * x * y).sum()
    gx, gy = kael.autograd.grad(out, [x, y])
    assert val(gx) == [6.0, 12.0] and val(gy) == [5.0]
    assert x.grad is None and y.grad is None


def test_autograd_grad_of_an_intermediate_and_grad_outputs() -> None:
    x = t([1.0, 2.0], grad=True)
    h = x * 3
    y = h * h
    (gh,) = kael.autograd.grad(y, h, grad_outputs=t([1.0, 0.5]))
    assert val(gh) == [6.0, 6.0]
    assert x.grad is None


def test_autograd_grad_unused_inputs() -> None:
    x, z = t([1.0], grad=True), t([2.0], grad=True)
    y = (x * 2).sum()
    with pytest.raises(AutogradError, match="input 1 was not used"):
        kael.autograd.grad(y, [x, z], retain_graph=True)
    gx, gz = kael.autograd.grad(y, [x, z], allow_unused=True)
    assert val(gx) == [2.0] and gz is None
    with pytest.raises(AutogradError, match="input 0 does not require grad"):
        kael.autograd.grad((x * 2).sum(), [t([1.0])])


# -- in-place ops and views ---------------------------------------------------------------------


def test_in_place_on_a_leaf_requiring_grad_is_refused() -> None:
    x = t([1.0, 2.0], grad=True)
    with pytest.raises(AutogradError, match="leaf tensor that requires grad.*in-place"):
        x.add_(1.0)
    with pytest.raises(AutogradError, match="leaf"):
        x[0] = 5.0
    with kael.no_grad():
        x.add_(1.0)
    assert val(x) == [2.0, 3.0] and x.grad_fn is None


def test_in_place_op_rewrites_history() -> None:
    x = t([1.0, 2.0], grad=True)
    y = x * 2
    y.mul_(x + 1)  # y = 2x(x + 1), dy/dx = 4x + 2
    assert y.grad_fn.name() == "MulBackward" and val(y) == [4.0, 12.0]
    y.sum().backward()
    assert val(x.grad) == [6.0, 10.0]
    z = x * 2
    z.mul_(z)  # the second operand is saved and then overwritten: an error, as in PyTorch
    with pytest.raises(AutogradError, match="MulBackward: saved tensor 1"):
        z.sum().backward()


def test_setitem_with_a_tensor_uses_copy_slices() -> None:
    a = t([1.0, 2.0, 3.0], grad=True)
    c = t([5.0], grad=True)
    b = a.clone()
    b[1:2] = c * 2
    assert b.grad_fn.name() == "CopySlicesBackward"
    assert val(b) == [1.0, 10.0, 3.0]
    (b * t([1.0, 2.0, 3.0])).sum().backward()
    assert val(a.grad) == [1.0, 0.0, 3.0]  # the overwritten element gets no gradient
    assert val(c.grad) == [4.0]


def test_in_place_on_a_view_flows_to_base_and_view() -> None:
    a = t([[1.0, 2.0], [3.0, 4.0]], grad=True)
    b = a * 1
    row = b[1]
    row.mul_(3)
    assert val(b) == [[1.0, 2.0], [9.0, 12.0]]
    assert b.grad_fn.name() == "CopySlicesBackward"
    (b.sum() + row.sum()).backward()  # row elements count twice, and were scaled by 3
    assert val(a.grad) == [[1.0, 1.0], [6.0, 6.0]]


def test_views_gradients_exact() -> None:
    x = t(np.arange(12.0).reshape(3, 4), grad=True)
    parts = [x[1:, ::2].sum(), x.select(1, 3).sum() * 2, x.permute(1, 0)[0].sum() * 10, x[0].expand(2, 4).sum() * 100]
    sum(parts).backward()  # type: ignore[arg-type]
    expected = np.zeros((3, 4))
    expected[1:, ::2] += 1
    expected[:, 3] += 2
    expected[:, 0] += 10
    expected[0] += 200
    assert val(x.grad) == expected.tolist()


def test_advanced_indexing_accumulates_repeated_indices() -> None:
    x = t([1.0, 2.0, 3.0], grad=True)
    x[kael.tensor([0, 0, 2, 0])].sum().backward()
    assert val(x.grad) == [3.0, 0.0, 1.0]
    y = t([[1.0, 2.0], [3.0, 4.0]], grad=True)
    y[y > 1.5].sum().backward()
    assert val(y.grad) == [[0.0, 1.0], [1.0, 1.0]]
    z = t([[1.0, 2.0], [3.0, 4.0]], grad=True)
    z[[1, 1], [0, 0]].sum().backward()
    assert val(z.grad) == [[0.0, 0.0], [2.0, 0.0]]


def test_ties_in_max_and_maximum_share_the_gradient() -> None:
    x = t([2.0, 2.0, 1.0], grad=True)
    kael.amax(x).backward()
    assert val(x.grad) == [0.5, 0.5, 0.0]
    a, b = t([1.0, 3.0], grad=True), t([1.0, 2.0], grad=True)
    kael.maximum(a, b).sum().backward()
    assert val(a.grad) == [0.5, 1.0] and val(b.grad) == [0.5, 0.0]
    r = t([-1.0, 0.0, 2.0], grad=True)
    kael.relu(r).sum().backward()
    assert val(r.grad) == [0.0, 0.0, 1.0]  # like PyTorch: 0 at the kink
