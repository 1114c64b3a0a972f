"""Autograd's grad modes and graph detachment, with exact expected values.

no_grad, enable_grad, set_grad_enabled (as context managers, decorators and plain calls,
restored after exceptions), inference_mode, detach (shared memory, no history) and
requires_grad_ (only on float leaves).
"""

from __future__ import annotations

import kael
import pytest
from kael import AutogradError, DTypeError
from tensor_values import t, val

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
