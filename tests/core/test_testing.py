"""kael.testing itself: assert_close's tolerances and messages, and gradcheck catching wrong gradients."""

from __future__ import annotations

from typing import Any

import kael
import numpy as np
import pytest
from kael.autograd import Function
from kael.testing import assert_close, gradcheck


def test_assert_close_passes_within_tolerance() -> None:
    assert_close(kael.tensor([1.0, 2.0]), [1.0, 2.0 + 1e-7])
    assert_close(np.array([np.nan, np.inf]), np.array([np.nan, np.inf]))
    assert_close(kael.tensor([1, 2]), np.array([1, 2]))
    assert_close(kael.tensor([1.0], dtype=kael.bfloat16), [1.004])  # bfloat16 tolerances
    assert_close(3.0, 3.0 + 1e-9)
    assert_close(kael.zeros(0, 3), np.zeros((0, 3)))


def test_assert_close_messages_are_precise() -> None:
    with pytest.raises(AssertionError) as info:
        assert_close(kael.tensor([[1.0, 2.0], [3.0, 4.0]]), [[1.0, 2.0], [3.5, 4.0]], msg="op 'add'")
    text = str(info.value)
    for part in (
        "op 'add'",
        "1 of 4 elements differ",
        "max abs diff 0.5",
        "worst at index (1, 0)",
        "actual 3.0, expected 3.5",
        "rtol=",
        "shape [2, 2]",
    ):
        assert part in text, f"{part!r} missing from {text!r}"
    with pytest.raises(AssertionError, match="shape mismatch"):
        assert_close(kael.ones(2), np.ones(3))
    with pytest.raises(AssertionError, match="dtype mismatch"):
        assert_close(kael.ones(2), kael.ones(2, dtype=kael.float64), check_dtype=True)
    with pytest.raises(AssertionError, match="actual nan"):
        assert_close([float("nan")], [1.0])
    with pytest.raises(AssertionError, match="actual 3, expected 2"):
        assert_close(kael.tensor([3]), [2])  # integers compare exactly
    with pytest.raises(AssertionError):
        assert_close([float("nan")], [float("nan")], equal_nan=False)


class _WrongSquare(Function):
    """x * x with a backward off by a factor of 2 (the classic forgotten chain-rule factor)."""

    @staticmethod
    def forward(ctx: Any, x: Any) -> Any:
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx: Any, g: Any) -> Any:
        (x,) = ctx.saved_tensors
        return g * x


def test_gradcheck_accepts_correct_gradients() -> None:
    x = kael.tensor([0.5, -1.5, 2.0], dtype=kael.float64, requires_grad=True)
    w = kael.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], dtype=kael.float64, requires_grad=True)
    assert gradcheck(lambda a, b: (kael.tanh(a) @ b, a.sum()), [x, w])  # two outputs, two inputs
    assert gradcheck(lambda a, k: a * k, [x, 3])  # non-tensor arguments pass through
    assert gradcheck(lambda a: kael.max(a.reshape(1, 3), 1), [x])  # the int indices output is ignored


def test_gradcheck_reports_wrong_gradients() -> None:
    x = kael.tensor([0.5, -1.5, 2.0], dtype=kael.float64, requires_grad=True)
    with pytest.raises(AssertionError) as info:
        gradcheck(_WrongSquare.apply, [x], name="square")
    text = str(info.value)
    assert "gradcheck (square): Jacobian mismatch for input 0 (shape [3])" in text
    assert "worst at output element 2, input element 2: analytical 2, numerical 4" in text


def test_gradcheck_input_validation() -> None:
    with pytest.raises(AssertionError, match="no input requires grad"):
        gradcheck(lambda a: a * 2, [kael.ones(2, dtype=kael.float64)])
    with pytest.raises(AssertionError, match="no floating-point tensor output"):
        gradcheck(lambda a: a > 0, [kael.ones(2, dtype=kael.float64, requires_grad=True)])
