"""Autograd through in-place ops and views, with exact expected values.

The version counter (saved tensors modified in place name the op; views share the
counter), in-place ops on leaves refused and rewriting history otherwise, setitem and
in-place ops on views (CopySlices), gradients of views and of advanced indexing with
repeated indices, and ties in max/maximum sharing the gradient.
"""

from __future__ import annotations

import kael
import numpy as np
import pytest
from kael import AutogradError
from tensor_values import t, val

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
