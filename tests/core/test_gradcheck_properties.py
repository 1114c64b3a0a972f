"""Property tests of gradients through broadcasting and views, with NumPy as the oracle.

Hypothesis draws broadcast-compatible shape pairs for add, sub, mul and div, and random
permute-then-index views (ints, slices with steps, full slices); the gradient must be the
output weights summed back to each operand's shape, or scattered back through the view.
"""

from __future__ import annotations

from typing import Any

import kael
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st


def _sum_to(g: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    while g.ndim > len(shape):
        g = g.sum(0)
    for i, n in enumerate(shape):
        if n == 1 and g.shape[i] != 1:
            g = g.sum(i, keepdims=True)
    return g


@st.composite
def broadcast_pair(draw: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    out = draw(st.lists(st.integers(1, 3), min_size=0, max_size=3))
    a = [n if draw(st.booleans()) else 1 for n in out]
    b = [n if draw(st.booleans()) else 1 for n in out]
    return tuple(a[draw(st.integers(0, len(a))) :]), tuple(b[draw(st.integers(0, len(b))) :])


@settings(max_examples=40, deadline=None)
@given(shapes=broadcast_pair(), op=st.sampled_from(["add", "sub", "mul", "div"]), seed=st.integers(0, 2**16))
def test_broadcast_binary_gradients_property(
    shapes: tuple[tuple[int, ...], tuple[int, ...]], op: str, seed: int
) -> None:
    r = np.random.default_rng(seed)
    a, b = r.standard_normal(shapes[0]), r.uniform(0.5, 2.0, shapes[1])
    ka, kb = kael.tensor(a, requires_grad=True), kael.tensor(b, requires_grad=True)
    out = getattr(kael, op)(ka, kb)
    w = r.standard_normal(out.shape)
    (out * kael.tensor(w)).sum().backward()
    bb = np.broadcast_to(b, out.shape)
    aa = np.broadcast_to(a, out.shape)
    da, db = {"add": (w, w), "sub": (w, -w), "mul": (w * bb, w * aa), "div": (w / bb, -w * aa / bb**2)}[op]
    np.testing.assert_allclose(ka.grad.numpy(), _sum_to(da, a.shape), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(kb.grad.numpy(), _sum_to(db, b.shape), rtol=1e-12, atol=1e-12)


@st.composite
def view_key(draw: Any) -> tuple[tuple[int, ...], tuple[Any, ...], tuple[int, ...]]:
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    perm = tuple(draw(st.permutations(range(len(shape)))))
    key: list[Any] = []
    for n in (shape[i] for i in perm):
        kind = draw(st.sampled_from(["int", "slice", "full"]))
        if kind == "int":
            key.append(draw(st.integers(-n, n - 1)))
        elif kind == "slice":
            start = draw(st.integers(-n, n))
            stop = draw(st.integers(-n, n))
            key.append(slice(start, stop, draw(st.integers(1, 3))))
        else:
            key.append(slice(None))
    return shape, tuple(key[: draw(st.integers(1, len(key)))]), perm


@settings(max_examples=40, deadline=None)
@given(case=view_key(), seed=st.integers(0, 2**16))
def test_view_gradients_property(case: tuple[tuple[int, ...], tuple[Any, ...], tuple[int, ...]], seed: int) -> None:
    """d sum(w * x.permute(p)[key]) / dx scatters w back through the same view (NumPy as the oracle)."""
    shape, key, perm = case
    r = np.random.default_rng(seed)
    x = kael.tensor(r.standard_normal(shape), requires_grad=True)
    v = x.permute(perm)[key]
    w = r.standard_normal(v.shape)
    (v * kael.tensor(w)).sum().backward()
    expected = np.zeros(shape)
    view = np.transpose(expected, perm)[key]
    if view.ndim == 0:
        np.transpose(expected, perm)[key] = w
    else:
        view += w
    np.testing.assert_allclose(x.grad.numpy(), expected, rtol=0, atol=0)
