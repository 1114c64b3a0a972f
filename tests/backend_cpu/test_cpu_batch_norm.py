"""The C++ batch_norm / batch_norm_backward kernels (csrc/batch_norm.cpp) against the NumPy host kernels and torch.

Random shapes (2-d to 5-d), affine or not, strided and channels-last operands, strided
outputs, every float dtype, wanted-gradient subsets and thread counts (statistics are
per-channel tasks, so the results do not depend on the thread count: bit for bit);
bad shapes raise KaelErrors naming the op. Skipped when the extension has no batch_norm.
"""

from __future__ import annotations

from typing import Any

import kael
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("kael_backend_cpu")

from kael.backends import host  # noqa: E402
from kael_backend_cpu._native import C  # noqa: E402

pytestmark = pytest.mark.skipif(
    not hasattr(C, "batch_norm"), reason="this build of kael_backend_cpu._C has no batch_norm (built before it)"
)
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
TOL = {"float64": 1e-12, "float32": 2e-5, "float16": 2e-3, "bfloat16": 1.6e-2}


def _t(v: np.ndarray, kd: Any, layout: int) -> kael.Tensor:
    t = kael.tensor(v).to(dtype=kd)
    if layout == 1 and v.ndim >= 3:  # channels last
        perm = (0, *range(2, v.ndim), 1)
        back = (0, v.ndim - 1, *range(1, v.ndim - 1))
        return kael.tensor(np.ascontiguousarray(v.transpose(perm))).to(dtype=kd).permute(*back)
    if layout == 2:  # every other element of the last dim
        big = kael.zeros(*v.shape[:-1], 2 * v.shape[-1], dtype=kd)
        view = big[..., ::2]
        view.copy_(t)
        return view
    return t


def _close(a: kael.Tensor, b: kael.Tensor, dtype: str, msg: str) -> None:
    tol = TOL[dtype]
    np.testing.assert_allclose(
        a.to(dtype=kael.float64).numpy(), b.to(dtype=kael.float64).numpy(), rtol=tol, atol=tol, err_msg=msg
    )


@given(
    shape=st.lists(st.integers(1, 5), min_size=2, max_size=5).map(tuple),
    dtype=st.sampled_from(["float64", "float32", "float16", "bfloat16"]),
    affine=st.booleans(),
    seed=st.integers(0, 99),
)
@SETTINGS
def test_forward_and_backward_match_the_host_kernels(
    shape: tuple[int, ...], dtype: str, affine: bool, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    kd = getattr(kael, dtype)
    st_ = kael.float64 if dtype == "float64" else kael.float32
    c = shape[1]
    x = _t(rng.uniform(-2, 2, shape) + 1, kd, seed % 3)
    w = _t(rng.uniform(0.5, 1.5, c), kd, 0) if affine else None
    b = _t(rng.uniform(-1, 1, c), kd, 0) if affine else None
    got = [kael.empty(*shape, dtype=kd), kael.empty(c, dtype=st_), kael.empty(c, dtype=st_)]
    want = [kael.empty(*shape, dtype=kd), kael.empty(c, dtype=st_), kael.empty(c, dtype=st_)]
    C.batch_norm(*got, x, w, b, 1e-3)
    host.kernel("batch_norm")(*want, x, w, b, 1e-3)
    for name, a, e in zip(("out", "mean", "rstd"), got, want):
        _close(a, e, dtype if name == "out" else "float64" if dtype == "float64" else "float32", name)
    g = _t(rng.uniform(-1, 1, shape), kd, (seed + 1) % 3)
    grads = [kael.empty(*shape, dtype=kd), kael.empty(c, dtype=kd), kael.empty(c, dtype=kd)]
    wants = [kael.empty(*shape, dtype=kd), kael.empty(c, dtype=kd), kael.empty(c, dtype=kd)]
    C.batch_norm_backward(*grads, g, x, got[1], got[2], w)
    host.kernel("batch_norm_backward")(*wants, g, x, got[1], got[2], w)
    for name, a, e in zip(("dx", "dweight", "dbias"), grads, wants):
        _close(a, e, dtype, name)


def test_against_torch_bit_identical_across_threads_and_gradient_subsets() -> None:
    rng = np.random.default_rng(0)
    x, w, b = rng.standard_normal((16, 6, 12, 12)).astype(np.float32), rng.uniform(0.5, 1.5, 6), rng.standard_normal(6)
    tx, tw, tb = (torch.tensor(v, dtype=torch.float32, requires_grad=True) for v in (x, w, b))
    ty = torch.nn.functional.batch_norm(tx, None, None, tw, tb, training=True)
    g = rng.standard_normal(x.shape).astype(np.float32)
    ty.backward(torch.tensor(g))
    args = [kael.tensor(v).to(dtype=kael.float32) for v in (x, w, b)]
    before = kael.get_num_threads()
    results = []
    try:
        for threads in (1, 2):
            kael.set_num_threads(threads)
            out, mean, rstd = kael.empty(*x.shape), kael.empty(6), kael.empty(6)
            C.batch_norm(out, mean, rstd, *args, 1e-5)
            np.testing.assert_allclose(out.numpy(), ty.detach().numpy(), rtol=1e-4, atol=1e-4)
            for want in [(0,), (1, 2), (0, 1, 2)]:
                shapes = (x.shape, (6,), (6,))
                outs = [kael.empty(*shapes[i]) if i in want else None for i in range(3)]
                C.batch_norm_backward(*outs, kael.tensor(g), args[0], mean, rstd, args[1])
                for i, ref in enumerate((tx.grad, tw.grad, tb.grad)):
                    got = outs[i]
                    if got is not None and ref is not None:
                        np.testing.assert_allclose(got.numpy(), ref.numpy(), rtol=1e-3, atol=1e-3)
            results.append(out.numpy())
    finally:
        kael.set_num_threads(before)
    np.testing.assert_array_equal(results[0], results[1])


def test_bad_shapes_raise_kael_errors_naming_the_op() -> None:
    x = kael.zeros(2, 3, 4)
    with pytest.raises(kael.ShapeError, match=r"batch_norm: weight must be \[3\]"):
        C.batch_norm(kael.empty(2, 3, 4), kael.empty(3), kael.empty(3), x, kael.ones(4), None, 1e-5)
    with pytest.raises(kael.DTypeError, match="batch_norm: mean and rstd must be float32"):
        C.batch_norm(kael.empty(2, 3, 4), kael.empty(3, dtype=kael.float64), kael.empty(3), x, None, None, 1e-5)
    with pytest.raises(kael.ShapeError, match="batch_norm_backward: grad and dx must have x's shape"):
        C.batch_norm_backward(
            kael.empty(2, 3, 4), None, None, kael.zeros(2, 3, 5), x, kael.zeros(3), kael.ones(3), None
        )


@given(
    shape=st.lists(st.integers(1, 5), min_size=2, max_size=4).map(tuple),
    dtype=st.sampled_from(["float64", "float32", "float16", "bfloat16"]),
    affine=st.booleans(),
    seed=st.integers(0, 99),
)
@SETTINGS
def test_eval_matches_the_host_kernel(shape: tuple[int, ...], dtype: str, affine: bool, seed: int) -> None:
    rng = np.random.default_rng(seed)
    kd = getattr(kael, dtype)
    c = shape[1]
    x = _t(rng.uniform(-2, 2, shape), kd, seed % 3)
    mean = kael.tensor(rng.standard_normal(c)).to(dtype=kael.float32)  # float32 running stats, any x dtype
    var = kael.tensor(rng.uniform(0.1, 2, c)).to(dtype=kael.float32)
    w = _t(rng.uniform(0.5, 1.5, c), kd, 0) if affine else None
    b = _t(rng.uniform(-1, 1, c), kd, 0) if affine else None
    got, want = kael.empty(*shape, dtype=kd), kael.empty(*shape, dtype=kd)
    C.batch_norm_eval(got, x, mean, var, w, b, 1e-3)
    host.kernel("batch_norm_eval")(want, x, mean, var, w, b, 1e-3)
    _close(got, want, dtype, "out")
