"""The op surface made from the catalogue, and silu, the elementwise fused op added through it.

* Every elementwise catalogue op is ``kael.<op>``, in ``kael.ops.__all__``, a Tensor method
  where its entry says so (and an in-place one), and computes its own definition.
* silu against PyTorch (values over dtypes and strided views, special values, gradients),
  its backward against float64 finite differences, the decomposition against the fused
  kernel, and the dispatch: a backend without the kernel runs ``x * sigmoid(x)``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import kael
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kael.backends import catalogue, dispatch, host
from kael.backends.reference import ReferenceBackend
from kael.testing import assert_close, gradcheck

torch = pytest.importorskip("torch")


# -- the generated surface --------------------------------------------------------------------------


@pytest.mark.parametrize("op", catalogue.POINTWISE_OPS)
def test_every_elementwise_op_has_its_function_and_methods(op: str) -> None:
    d = catalogue.op(op)
    p = d.pointwise
    assert p is not None
    fn = getattr(kael, op)
    assert fn is getattr(kael.ops, op) and op in kael.ops.__all__ and op in kael.__all__
    assert fn.__name__ == op and op in (fn.__doc__ or "")
    assert hasattr(kael.Tensor, op) == p.method
    assert hasattr(kael.Tensor, op + "_") == p.inplace
    rng = np.random.default_rng(sum(map(ord, op)))
    if p.dtypes == "bool":
        vals = [rng.random(6) < 0.5 for _ in range(d.arity[1])]
    else:
        vals = [rng.uniform(0.5, 2.0, 6) for _ in range(d.arity[1])]  # in every op's domain
    args = [kael.tensor(v, dtype=kael.bool if p.dtypes == "bool" else kael.float64) for v in vals]
    with np.errstate(all="ignore"):
        want = p.compute(np, *vals)
    assert_close(fn(*args), want, rtol=1e-12, atol=1e-12, msg=op)
    if p.method:
        assert_close(getattr(args[0], op)(*args[1:]), want, rtol=1e-12, atol=1e-12, msg=f"Tensor.{op}")


def test_a_non_tensor_operand_is_a_dtype_error_naming_the_op() -> None:
    with pytest.raises(kael.DTypeError, match="silu: expected a tensor, got list"):
        kael.silu([1.0, 2.0])  # type: ignore[arg-type]
    with pytest.raises(kael.DTypeError, match="exp: expected a tensor, got float"):
        kael.exp(1.0)  # type: ignore[arg-type]


# -- silu -------------------------------------------------------------------------------------------

DTYPES = {"float64": 1e-12, "float32": 2e-6, "float16": 2e-3, "bfloat16": 1.6e-2}


@settings(max_examples=30, deadline=None)
@given(
    shape=st.lists(st.integers(0, 5), min_size=0, max_size=3),
    transpose=st.booleans(),
    dtype=st.sampled_from(sorted(DTYPES)),
    seed=st.integers(0, 2**16),
    scale=st.sampled_from([1.0, 8.0, 40.0]),
)
def test_silu_matches_torch(shape: list[int], transpose: bool, dtype: str, seed: int, scale: float) -> None:
    x = np.random.default_rng(seed).standard_normal(shape) * scale
    t = kael.tensor(x, dtype=getattr(kael, dtype))
    r = torch.tensor(x).to(getattr(torch, dtype))
    if transpose and len(shape) >= 2:
        t, r = t.transpose(0, 1), r.transpose(0, 1)
    got = kael.silu(t)
    assert got.dtype is t.dtype and got.shape == tuple(r.shape)
    want = torch.nn.functional.silu(r).double().numpy()
    assert_close(got, want, rtol=DTYPES[dtype], atol=DTYPES[dtype], msg=f"silu {dtype}")


def test_silu_special_values_match_torch() -> None:
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30, -1e-30, 88.0, -88.0, 710.0, -710.0, -1e4])
    got = kael.silu(kael.tensor(x, dtype=kael.float64)).numpy()
    want = torch.nn.functional.silu(torch.tensor(x)).numpy()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got[~np.isnan(want)], want[~np.isnan(want)], rtol=1e-15, atol=0)
    assert np.signbit(got[4]) == np.signbit(want[4])


def test_silu_of_integers_is_computed_in_the_default_float_dtype() -> None:
    got = kael.silu(kael.tensor([-2, 0, 3]))
    assert got.dtype is kael.float32
    assert_close(got, torch.nn.functional.silu(torch.tensor([-2.0, 0.0, 3.0])).numpy())


def test_silu_gradient_matches_torch_and_finite_differences() -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 5)) * 3
    up = rng.standard_normal((4, 5))
    t = kael.tensor(x, dtype=kael.float64, requires_grad=True)
    (kael.silu(t.T) * kael.tensor(up.T, dtype=kael.float64)).sum().backward()
    r = torch.tensor(x, requires_grad=True)
    (torch.nn.functional.silu(r.T) * torch.tensor(up.T)).sum().backward()
    assert_close(t.grad, r.grad.numpy(), rtol=1e-12, atol=1e-12)
    s = 1 / (1 + np.exp(-x))
    assert_close(t.grad, up * (s + x * s * (1 - s)), rtol=1e-12, atol=1e-12)  # the formula of the brief
    assert gradcheck(kael.silu, [kael.tensor(x, dtype=kael.float64, requires_grad=True)])


def test_fused_kernel_and_decomposition_agree() -> None:
    x = kael.tensor(np.random.default_rng(5).standard_normal((6, 7)) * 6, dtype=kael.float64)[:, ::2]
    kernel_out = kael.empty(x.shape, dtype=kael.float64)
    host.kernel("silu")(kernel_out, x)
    assert_close(catalogue.decomposition("silu")(x), kernel_out, rtol=1e-13, atol=1e-15)


@pytest.fixture
def without_fused_kernels() -> Iterator[None]:
    class Plugin:
        @kael.hookimpl
        def kael_backends(self) -> list[Any]:
            b = ReferenceBackend(fused=False)
            b.name = "reference-primitives"
            return [b]

    prev = kael.backends.override("cpu")
    kael.backends.register(Plugin(), "test-primitives-only")
    kael.backends.use("cpu", "reference-primitives")
    try:
        yield
    finally:
        kael.backends.use("cpu", prev)
        kael.backends.unregister("test-primitives-only")


def _traced(fn: Any) -> list[str]:
    seen: list[str] = []
    dispatch.set_kernel_wrapper(lambda dev, op, backend, k: lambda *a: (seen.append(op), k(*a))[1])
    try:
        fn()
    finally:
        dispatch.set_kernel_wrapper(None)
    return seen


def test_a_backend_without_the_kernel_runs_the_decomposition(without_fused_kernels: None) -> None:
    assert dispatch.fused_kernel("cpu", "silu") is None
    x = kael.tensor([-1.0, 0.5, 3.0], requires_grad=True)
    ops = _traced(lambda: kael.silu(x).sum().backward())
    assert "silu" not in ops and ops[:2] == ["sigmoid", "mul"], ops
    s = 1 / (1 + np.exp(-np.array([-1.0, 0.5, 3.0])))
    assert_close(x.grad, s + np.array([-1.0, 0.5, 3.0]) * s * (1 - s), rtol=1e-6)


def test_a_backend_with_the_kernel_runs_it() -> None:
    prev = kael.backends.override("cpu")
    kael.backends.use("cpu", "reference")
    try:
        ops = _traced(lambda: kael.silu(kael.tensor([1.0, 2.0])))
    finally:
        kael.backends.use("cpu", prev)
    assert ops == ["silu"]


def test_nn_silu_module_and_functional() -> None:
    x = np.array([[-3.0, -0.5], [0.0, 2.0]], np.float32)
    m = kael.nn.SiLU()
    assert repr(m) == "SiLU()" and repr(kael.nn.SiLU(inplace=True)) == "SiLU(inplace=True)"
    want = torch.nn.SiLU()(torch.tensor(x)).numpy()
    assert_close(m(kael.tensor(x)), want)
    assert_close(kael.nn.functional.silu(kael.tensor(x)), want)
    t = kael.tensor(x)
    r = kael.nn.functional.silu(t, inplace=True)
    assert r is t
    assert_close(t, want)
    assert_close(kael.nn.SiLU(inplace=True)(kael.tensor(x)), want)


def test_inplace_silu_keeps_the_graph() -> None:
    x = kael.tensor([-1.0, 2.0], requires_grad=True)
    y = x * 1.0
    y.silu_()
    y.sum().backward()
    s = 1 / (1 + np.exp(-np.array([-1.0, 2.0])))
    assert_close(x.grad, s + np.array([-1.0, 2.0]) * s * (1 - s), rtol=1e-6)
