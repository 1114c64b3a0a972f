"""Gradients of every differentiable primitive op, against finite differences and PyTorch.

Unary and binary element-wise ops (with broadcasting and Python scalar operands),
reductions, matmul, views and indexing, and in-place ops, each a ``Case`` of
gradcheck_cases.py: ``kael.testing.gradcheck`` in float64 and, when PyTorch is installed,
PyTorch's autograd on the same inputs. Also checks that every differentiable primitive of
the catalogue has a case, and how Python scalar operands keep their sign, value and dtype.
"""

from __future__ import annotations

from typing import Any

import kael
import numpy as np
import pytest
from gradcheck_cases import Case, F, args, away0, check_case, distinct, ints, nrm, off_int, pos

# -- the case table -------------------------------------------------------------------------------

UNARY = [
    Case("neg", lambda m, x: m.neg(x), args(nrm(3, 4))),
    Case("exp", lambda m, x: m.exp(x), args(nrm(3, 4))),
    Case("log", lambda m, x: m.log(x), args(pos(3, 4))),
    Case("sqrt", lambda m, x: m.sqrt(x), args(pos(3, 4))),
    Case("rsqrt", lambda m, x: m.rsqrt(x), args(pos(3, 4))),
    Case("tanh", lambda m, x: m.tanh(x), args(nrm(3, 4))),
    Case("abs", lambda m, x: m.abs(x), args(away0(3, 4))),
    Case("sin", lambda m, x: m.sin(x), args(nrm(3, 4))),
    Case("cos", lambda m, x: m.cos(x), args(nrm(3, 4))),
    Case("sigmoid", lambda m, x: m.sigmoid(x), args(nrm(3, 4))),
    Case("erf", lambda m, x: m.erf(x), args(nrm(3, 4))),
    Case("log1p", lambda m, x: m.log1p(x), args(pos(3, 4, lo=-0.5, hi=2.0))),
    Case("expm1", lambda m, x: m.expm1(x), args(nrm(3, 4))),
    Case("floor", lambda m, x: m.floor(x) * x, args(off_int(3, 4))),
    Case("ceil", lambda m, x: m.ceil(x) * x, args(off_int(3, 4))),
    Case("round", lambda m, x: m.round(x) * x, args(off_int(3, 4))),
    Case("sign", lambda m, x: m.sign(x) * x, args(away0(3, 4))),
    Case("relu", lambda m, x: m.relu(x), args(away0(3, 4))),
    Case("relu_method", lambda m, x: x.relu(), args(away0(3, 4))),
    Case("clamp", lambda m, x: m.clamp(x, -0.5, 0.7), args(away0(3, 4))),
    Case("clamp_min", lambda m, x: m.clamp(x, min=0.1), args(away0(3, 4))),
    Case("pow_int_exponent", lambda m, x: x**3, args(nrm(3, 4))),
    Case("pow_float_exponent", lambda m, x: x**2.5, args(pos(3, 4))),
    Case("pow_zero_exponent", lambda m, x: x**0 + x, args(nrm(3, 4))),
    Case("rpow", lambda m, x: 2.0**x, args(nrm(3, 4))),
    Case("neg_operator", lambda m, x: -x, args(nrm(5))),
    Case("zero_dim", lambda m, x: m.exp(x) * x, args(lambda r: np.array(0.7))),
]

BINARY = [
    Case("add", lambda m, a, b: m.add(a, b), args(nrm(3, 4), nrm(3, 4))),
    Case("add_broadcast", lambda m, a, b: a + b, args(nrm(3, 1), nrm(1, 4))),
    Case("add_broadcast_rank", lambda m, a, b: a + b, args(nrm(2, 3, 4), nrm(4))),
    Case("sub", lambda m, a, b: m.sub(a, b), args(nrm(3, 4), nrm(4))),
    Case("mul", lambda m, a, b: m.mul(a, b), args(nrm(3, 4), nrm(3, 1))),
    Case("div", lambda m, a, b: m.div(a, b), args(nrm(3, 4), away0(4))),
    Case("pow", lambda m, a, b: m.pow(a, b), args(pos(3, 4), nrm(3, 4))),
    Case("maximum", lambda m, a, b: m.maximum(a, b), args(distinct(3, 4), distinct(3, 4))),
    Case("minimum", lambda m, a, b: m.minimum(a, b), args(distinct(3, 4), distinct(1, 4))),
    Case(
        "remainder", lambda m, a, b: m.remainder(a, b), args(off_int(3, 4), lambda r: np.array([1.5, -2.5, 3.5, 4.5]))
    ),
    Case("remainder_scalar", lambda m, a: a % 1.5, args(off_int(3, 4))),
    Case("scalar_right", lambda m, a: (a + 2) * 3 - 1.5, args(nrm(3, 4))),
    Case("scalar_left", lambda m, a: 2 - 3 / a, args(away0(3, 4))),
    Case("scalar_div", lambda m, a: a / 4, args(nrm(3, 4))),
    Case("zero_dim_operand", lambda m, a, b: a * b, args(nrm(3, 4), lambda r: np.array(1.3))),
    Case("same_input_twice", lambda m, a: a * a + a, args(nrm(3, 4))),
    Case("where", lambda m, a, b, c: m.where(c > 0, a, b), args(nrm(3, 4), nrm(4), nrm(3, 4))),
    Case("where_scalar", lambda m, a, c: m.where(c > 0, a, 0.0), args(nrm(3, 4), nrm(3, 4))),
]

REDUCE = [
    Case("sum_all", lambda m, x: x.sum(), args(nrm(3, 4))),
    Case("sum_dim", lambda m, x: x.sum(1), args(nrm(3, 4))),
    Case("sum_dims_keepdim", lambda m, x: x.sum((0, 2), keepdim=True), args(nrm(2, 3, 2))),
    Case("sum_negative_dim", lambda m, x: m.sum(x, -1), args(nrm(2, 3, 2))),
    Case("mean", lambda m, x: x.mean(1), args(nrm(3, 4))),
    Case("mean_all", lambda m, x: m.mean(x), args(nrm(3, 4))),
    Case("prod", lambda m, x: x.prod(1), args(pos(3, 4))),
    Case("prod_all", lambda m, x: m.prod(x), args(nrm(2, 3))),
    Case("prod_one_zero", lambda m, x: x.prod(1), args(lambda r: np.array([[1.5, 0.0, -2.0], [0.5, 1.2, 0.8]]))),
    Case("prod_two_zeros", lambda m, x: x.prod(1), args(lambda r: np.array([[0.0, 0.0, -2.0], [0.5, 1.2, 0.8]]))),
    Case("amax", lambda m, x: m.amax(x, 1), args(distinct(3, 4))),
    Case("amin_keepdim", lambda m, x: m.amin(x, 0, keepdim=True), args(distinct(3, 4))),
    Case("amax_all", lambda m, x: m.amax(x), args(distinct(3, 4))),
    Case("max_dim", lambda m, x: m.max(x, 1)[0], args(distinct(3, 4))),
    Case("min_dim_keepdim", lambda m, x: x.min(0, keepdim=True)[0], args(distinct(3, 4))),
    Case("max_all", lambda m, x: x.max(), args(distinct(3, 4))),
    Case("var", lambda m, x: x.var(1), args(nrm(3, 4))),
    Case("var_population", lambda m, x: m.var(x, 0, correction=0), args(nrm(3, 4))),
    Case("std", lambda m, x: x.std(1, keepdim=True), args(nrm(3, 4))),
]

MATMUL = [
    Case("matmul_2d", lambda m, a, b: a @ b, args(nrm(3, 4), nrm(4, 2))),
    Case("matmul_vec_vec", lambda m, a, b: m.matmul(a, b), args(nrm(4), nrm(4))),
    Case("matmul_vec_mat", lambda m, a, b: m.matmul(a, b), args(nrm(4), nrm(4, 3))),
    Case("matmul_mat_vec", lambda m, a, b: m.matmul(a, b), args(nrm(3, 4), nrm(4))),
    Case("matmul_batched", lambda m, a, b: a @ b, args(nrm(2, 3, 4), nrm(2, 4, 2))),
    Case("matmul_broadcast", lambda m, a, b: a @ b, args(nrm(2, 3, 4), nrm(4, 2))),
    Case("matmul_broadcast_batch", lambda m, a, b: a @ b, args(nrm(2, 1, 2, 3), nrm(3, 3, 2))),
    Case("matmul_transposed", lambda m, a, b: a.T @ b, args(nrm(4, 3), nrm(4, 2))),
]

VIEWS = [
    Case("reshape", lambda m, x: x.reshape(2, 6) * 2, args(nrm(3, 4))),
    Case("view", lambda m, x: x.view(4, 3).exp(), args(nrm(3, 4))),
    Case("reshape_noncontiguous", lambda m, x: x.T.reshape(12), args(nrm(3, 4))),
    Case("permute", lambda m, x: x.permute(2, 0, 1) * m.arange(4.0), args(nrm(3, 4, 2))),
    Case("transpose", lambda m, x: m.transpose(x, 0, 2).exp(), args(nrm(3, 4, 2))),
    Case("T", lambda m, x: x.T.exp(), args(nrm(3, 4))),
    Case("mT", lambda m, x: x.mT @ x, args(nrm(2, 3, 4))),
    Case("expand", lambda m, x: x.expand(3, 4) * m.arange(12.0).reshape(3, 4), args(nrm(3, 1))),
    Case("expand_new_dims", lambda m, x: x.expand(2, 3, 4).sin(), args(nrm(4))),
    Case("squeeze", lambda m, x: x.squeeze(1).exp(), args(nrm(3, 1, 4))),
    Case("unsqueeze", lambda m, x: x.unsqueeze(0) * x.unsqueeze(1), args(nrm(4))),
    Case("flatten", lambda m, x: x.flatten(1) ** 2, args(nrm(2, 3, 2))),
    Case("narrow", lambda m, x: m.narrow(x, 1, 1, 2) ** 2, args(nrm(3, 4))),
    Case("select", lambda m, x: m.select(x, 1, 2).exp(), args(nrm(3, 4))),
    Case("getitem_int", lambda m, x: x[1] ** 2, args(nrm(3, 4))),
    Case("getitem_slice_step", lambda m, x: x[::2, 1::2].exp(), args(nrm(5, 6))),
    Case("getitem_none_ellipsis", lambda m, x: x[None, ..., 1] * 3, args(nrm(2, 3, 4))),
    Case("getitem_negative", lambda m, x: x[-1, -2:], args(nrm(3, 4))),
    Case("getitem_tensor", lambda m, x, i: x[i] * 2, args(nrm(5, 3), lambda r: np.array([4, 0, 4, 2]))),
    Case("getitem_list", lambda m, x: x[:, [2, 0, 2]].exp(), args(nrm(3, 4))),
    Case("getitem_bool_mask", lambda m, x: x[x > 0] * 2, args(away0(3, 4))),
    Case("getitem_two_tensors", lambda m, x: x[m.tensor([0, 2, 2]), m.tensor([1, 0, 1])] ** 2, args(nrm(3, 4))),
    Case("split", lambda m, x: tuple(p.exp() for p in x.split(2, 1)), args(nrm(2, 5))),
    Case("chunk", lambda m, x: x.chunk(3, 0)[1] * 2, args(nrm(6, 2))),
    Case("cat", lambda m, a, b: m.cat([a, b, a], 1), args(nrm(2, 3), nrm(2, 1))),
    Case("stack", lambda m, a, b: m.stack([a, b], 1), args(nrm(2, 3), nrm(2, 3))),
    Case("gather", lambda m, x, i: m.gather(x, 1, i), args(nrm(3, 4), ints(4, 3, 5))),
    Case("index_select", lambda m, x, i: m.index_select(x, 0, i), args(nrm(3, 4), lambda r: np.array([2, 0, 2]))),
    Case("contiguous", lambda m, x: x.T.contiguous() * 2, args(nrm(3, 4))),
    Case("clone", lambda m, x: x.clone() * x, args(nrm(3, 4))),
]

INPLACE = [
    Case("inplace_mul", lambda m, x, z: x.clone().mul_(z), args(nrm(3, 4), nrm(4))),
    Case("inplace_chain", lambda m, x: (x * 1).mul_(2).add_(1.0).exp_(), args(nrm(3, 4))),
    Case(
        "inplace_unary_saving_input",
        lambda m, x: (x * 1).log_().abs_().clamp_(0.5, 0.9),
        args(pos(3, 4, lo=1.5, hi=3.0)),
    ),
    Case("setitem_slice", lambda m, x, z: _setitem(x * 1, (slice(1, 3),), z) ** 2, args(nrm(4, 3), nrm(2, 3))),
    Case("setitem_scalar", lambda m, x: _setitem(x * 2, (0, 1), 5.0) * x, args(nrm(3, 4))),
    Case("inplace_on_select", lambda m, x: _row_mul(x.clone(), 1, 3.0) * x, args(nrm(3, 4))),
    Case("inplace_on_view_two_outputs", lambda m, x, z: _view_add(x.clone(), z), args(nrm(3, 4), nrm(2, 4))),
    Case("inplace_on_transposed_view", lambda m, x, z: _t_add(x * 1, z), args(nrm(3, 4), nrm(3))),
]


def _setitem(y: Any, key: Any, value: Any) -> Any:
    y[key] = value
    return y


def _row_mul(y: Any, i: int, v: float) -> Any:
    y[i].mul_(v)
    return y


def _view_add(y: Any, z: Any) -> Any:
    v = y[1:]
    v.add_(z)
    return y, v


def _t_add(y: Any, z: Any) -> Any:
    y.T[1] += z
    return y.exp()


# a loss with no fused kernel: autograd through the primitives it is made of
COMPOSITE = [
    Case("mse_loss", lambda m, a, b: F(m).mse_loss(a, b), args(nrm(3, 4), nrm(3, 4))),
]

CASES = UNARY + BINARY + REDUCE + MATMUL + VIEWS + INPLACE + COMPOSITE


@pytest.mark.parametrize("case", [c for c in CASES if not c.fused], ids=lambda c: c.name)
def test_gradient(case: Case) -> None:
    check_case(case)


def test_every_differentiable_primitive_has_a_gradient_case() -> None:
    from kael._ops import BINARY_OPS, UNARY_OPS

    names = {c.name.split("_")[0] for c in CASES}
    non_diff = {"logical_not", "floor_divide"}  # floor_divide has no derivative (as in PyTorch)
    missing = [op for op in (*UNARY_OPS, *BINARY_OPS) if op not in non_diff and op not in names]
    assert not missing, f"no gradient case for {missing}"


def test_scalar_operands_keep_sign_value_and_dtype() -> None:
    """Python scalars become cached 0-d operands: -0.0 stays apart from 0.0, ints from floats and bools."""
    x = kael.tensor([1.0, -2.0])
    assert (x / -0.0).tolist() == [-np.inf, np.inf] and (x / 0.0).tolist() == [np.inf, -np.inf]
    assert (kael.tensor([3]) * 2).dtype is kael.int64 and (kael.tensor([3]) * 2.5).tolist() == [7.5]
    assert (kael.tensor([3]) + True).tolist() == [4] and (kael.tensor([3]) + 1).tolist() == [4]
    assert (x * 2).tolist() == [2.0, -4.0] and (2 - x).tolist() == [1.0, 4.0]
    h = kael.tensor([1.0], dtype=kael.float16) * 1e-4
    assert h.dtype is kael.float16 and abs(h.item() - 1e-4) < 1e-6
