"""kael.nn.init and gradient clipping (clip_grad_norm_, clip_grad_value_).

The init functions' ranges, moments and gains, their reproducibility with a generator
and that they record no graph; clip_grad_norm_'s float64 total norm, scaling, inf and p
norms, non-finite norms and parameters without gradients; clip_grad_value_.
"""

from __future__ import annotations

import math
from typing import Any

import kael
import numpy as np
import pytest
from kael import KaelError, ShapeError, nn
from tensor_values import arr

# -- init ----------------------------------------------------------------------------------------


def test_init_functions() -> None:
    g = kael.Generator().manual_seed(0)
    w = kael.empty(400, 300)
    nn.init.uniform_(w, -0.5, 0.25, generator=g)
    assert arr(w).min() >= -0.5 and arr(w).max() <= 0.25 and abs(arr(w).mean() + 0.125) < 0.01
    nn.init.normal_(w, 2.0, 0.5, generator=g)
    assert abs(arr(w).mean() - 2.0) < 0.01 and abs(arr(w).std() - 0.5) < 0.01
    nn.init.xavier_uniform_(w, generator=g)
    bound = math.sqrt(6 / 700)
    assert arr(w).max() <= bound and arr(w).max() > 0.95 * bound
    nn.init.kaiming_uniform_(w, nonlinearity="relu", generator=g)
    bound = math.sqrt(2) * math.sqrt(3 / 300)
    assert arr(w).max() <= bound and arr(w).max() > 0.95 * bound
    nn.init.kaiming_normal_(w, mode="fan_out", nonlinearity="relu", generator=g)
    assert abs(arr(w).std() - math.sqrt(2 / 400)) < 0.002
    nn.init.trunc_normal_(w, std=1.0, a=-0.5, b=1.0, generator=g)
    assert arr(w).min() >= -0.5 and arr(w).max() <= 1.0 and arr(w).min() < -0.49
    nn.init.zeros_(w)
    assert arr(w).max() == 0.0
    nn.init.ones_(w)
    assert arr(w).min() == 1.0
    nn.init.constant_(w, 0.25)
    assert arr(w).max() == 0.25
    assert nn.init.calculate_gain("relu") == math.sqrt(2) and nn.init.calculate_gain("tanh") == 5 / 3
    with pytest.raises(ShapeError, match="at least 2 dims"):
        nn.init.xavier_uniform_(kael.empty(3))


def test_init_is_reproducible_and_records_no_graph() -> None:
    p = nn.Parameter(kael.empty(3, 4))
    nn.init.normal_(p, generator=kael.Generator().manual_seed(5))
    first = arr(p).copy()
    nn.init.normal_(p, generator=kael.Generator().manual_seed(5))
    np.testing.assert_array_equal(arr(p), first)
    assert p.is_leaf and p.grad_fn is None and p.requires_grad
    kael.manual_seed(9)
    a = arr(nn.Linear(4, 4).weight).copy()
    kael.manual_seed(9)
    np.testing.assert_array_equal(arr(nn.Linear(4, 4).weight), a)


# -- clip_grad_norm_ -----------------------------------------------------------------------------


def _with_grads(*grads: Any) -> list[nn.Parameter]:
    ps = []
    for g in grads:
        p = nn.Parameter(kael.zeros(len(g)))
        p.grad = kael.tensor(g, dtype=kael.float32)
        ps.append(p)
    return ps


def test_clip_grad_norm_computes_the_total_norm_in_float64_and_scales() -> None:
    ps = _with_grads([3.0, 0.0], [0.0, 4.0, 0.0])
    norm = nn.utils.clip_grad_norm_(ps, max_norm=1.0)
    assert norm.dtype is kael.float64 and norm.shape == () and float(norm) == 5.0
    coef = 1.0 / (5.0 + 1e-6)
    np.testing.assert_allclose(arr(ps[0].grad), [3 * coef, 0.0], rtol=1e-6)
    np.testing.assert_allclose(arr(ps[1].grad), [0.0, 4 * coef, 0.0], rtol=1e-6)
    assert ps[0].grad.dtype is kael.float32


def test_clip_grad_norm_no_clip_inf_norm_and_p_norm() -> None:
    ps = _with_grads([0.3, -0.4])
    assert float(nn.utils.clip_grad_norm_(ps, 10.0)) == pytest.approx(0.5, rel=1e-7)
    np.testing.assert_allclose(arr(ps[0].grad), [0.3, -0.4], rtol=1e-7)  # untouched
    ps = _with_grads([1.0, -7.0], [2.0])
    assert float(nn.utils.clip_grad_norm_(ps, 100.0, norm_type=math.inf)) == 7.0
    assert float(nn.utils.clip_grad_norm_(ps, 100.0, norm_type=1)) == 10.0
    # float64 accumulation: 4096 gradients of 1e-4 have a norm of 6.4e-3 exactly
    big = _with_grads([1e-4] * 4096)
    assert float(nn.utils.clip_grad_norm_(big, 1.0)) == pytest.approx(math.sqrt(4096) * 1e-4, rel=1e-7)


def test_clip_grad_norm_nonfinite_and_no_grads() -> None:
    ps = _with_grads([1.0, float("inf")])
    with pytest.raises(KaelError, match="total norm"):
        nn.utils.clip_grad_norm_(ps, 1.0, error_if_nonfinite=True)
    assert float(nn.utils.clip_grad_norm_([nn.Parameter(kael.zeros(2))], 1.0)) == 0.0


def test_clip_grad_value() -> None:
    ps = _with_grads([3.0, -0.5, -2.0])
    nn.utils.clip_grad_value_(ps, 1.0)
    assert arr(ps[0].grad).tolist() == [1.0, -0.5, -1.0]
