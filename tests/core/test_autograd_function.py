"""Custom autograd Functions and kael.autograd.grad, with exact expected values.

Function subclasses with saved tensors, two outputs, no-grad inputs, None gradients,
gradient shapes and dtypes checked and fixed up, saved-tensor version checks; and
kael.autograd.grad (gradients without touching .grad, of intermediates, with
grad_outputs, unused inputs).
"""

from __future__ import annotations

from typing import Any

import kael
import pytest
from kael import AutogradError
from kael.autograd import Function
from tensor_values import t, val

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
