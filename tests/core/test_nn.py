"""kael.nn: Module bookkeeping, layers, containers, functional, init and clip_grad_norm_.

Values are checked against NumPy formulas and, when installed, PyTorch modules
loaded with the same weights.
"""

from __future__ import annotations

import math
from typing import Any

import kael
import numpy as np
import pytest
from kael import DTypeError, KaelError, ShapeError, nn
from kael.nn import functional as F


def arr(x: kael.Tensor) -> np.ndarray:
    return np.asarray(x.detach().numpy())


class Block(nn.Module):
    def __init__(self, n_in: int = 3) -> None:
        super().__init__()
        self.fc = nn.Linear(n_in, 2)
        self.norm = nn.LayerNorm(2)
        self.register_buffer("steps", kael.zeros(1, dtype=kael.int64))
        self.register_buffer("cache", kael.zeros(2), persistent=False)
        self.scale = 2.0  # a plain attribute

    def forward(self, x: kael.Tensor) -> kael.Tensor:
        return self.norm(self.fc(x)) * self.scale


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(3), Block(2)])
        self.head = nn.Linear(2, 4, bias=False)
        self.tied = self.head  # the same module twice: listed once

    def forward(self, x: kael.Tensor) -> kael.Tensor:
        for b in self.blocks:
            x = b(x)
        return self.head(x)


# -- Module bookkeeping -------------------------------------------------------------------------


def test_named_parameters_buffers_and_modules() -> None:
    net = Net()
    names = [n for n, _ in net.named_parameters()]
    assert names == [
        "blocks.0.fc.weight",
        "blocks.0.fc.bias",
        "blocks.0.norm.weight",
        "blocks.0.norm.bias",
        "blocks.1.fc.weight",
        "blocks.1.fc.bias",
        "blocks.1.norm.weight",
        "blocks.1.norm.bias",
        "head.weight",
    ]
    assert all(isinstance(p, nn.Parameter) and p.requires_grad for p in net.parameters())
    assert [n for n, _ in net.named_buffers()] == [
        "blocks.0.steps",
        "blocks.0.cache",
        "blocks.1.steps",
        "blocks.1.cache",
    ]
    assert [n for n, _ in net.named_modules()] == [
        "",
        "blocks",
        "blocks.0",
        "blocks.0.fc",
        "blocks.0.norm",
        "blocks.1",
        "blocks.1.fc",
        "blocks.1.norm",
        "head",
    ]
    assert [n for n, _ in net.named_children()] == ["blocks", "head"]
    assert len(list(net.children())) == 2
    assert [n for n, _ in net.blocks[0].named_parameters(prefix="b0")][:1] == ["b0.fc.weight"]
    assert len(list(net.blocks[0].parameters(recurse=False))) == 0
    assert net.blocks[0].scale == 2.0 and "scale" not in net.blocks[0]._parameters


def test_assigning_registers_and_reassigning_checks() -> None:
    m = nn.Linear(2, 2)
    with pytest.raises(DTypeError, match="cannot assign Tensor to a parameter"):
        m.weight = kael.zeros(2, 2)
    m.bias = None
    assert m.bias is None and [n for n, _ in m.named_parameters()] == ["weight"]
    m.extra = nn.Parameter(kael.ones(3))
    assert [n for n, _ in m.named_parameters()] == ["weight", "extra"]
    del m.extra
    assert not hasattr(m, "extra")
    with pytest.raises(AttributeError, match="'Linear' object has no attribute 'nope'"):
        m.nope  # noqa: B018

    class Broken(nn.Module):
        def __init__(self) -> None:
            self.w = nn.Parameter(kael.ones(1))

    with pytest.raises(KaelError, match="super\\(\\).__init__\\(\\)"):
        Broken()


def test_parameter_shares_storage_and_ops_return_tensors() -> None:
    data = kael.ones(2, 3)
    p = nn.Parameter(data)
    assert p._storage is data._storage and p.shape == (2, 3) and p.requires_grad and p.is_leaf
    y = p * 2
    assert type(y) is kael.Tensor and y.grad_fn is not None
    y.sum().backward()
    assert arr(p.grad).tolist() == [[2.0] * 3] * 2
    assert not nn.Parameter(kael.ones(1), requires_grad=False).requires_grad
    assert repr(p).startswith("Parameter containing:\ntensor(")


def test_train_eval_and_requires_grad() -> None:
    net = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5))
    assert all(m.training for m in net.modules())
    assert net.eval() is net and not any(m.training for m in net.modules())
    net.train()
    assert net[1].training
    net.requires_grad_(False)
    assert not any(p.requires_grad for p in net.parameters())


def test_zero_grad() -> None:
    m = nn.Linear(2, 1)
    m(kael.ones(1, 2)).sum().backward()
    m.zero_grad(set_to_none=False)
    assert arr(m.weight.grad).tolist() == [[0.0, 0.0]]
    m.zero_grad()
    assert m.weight.grad is None and m.bias.grad is None


def test_to_dtype_keeps_parameter_identity() -> None:
    b = Block()
    w = b.fc.weight
    before = arr(w).copy()
    b(kael.ones(1, 3)).sum().backward()
    assert b.to(kael.float64) is b
    assert b.fc.weight is w and w.dtype is kael.float64 and w.grad.dtype is kael.float64
    np.testing.assert_allclose(arr(w), before, rtol=1e-7)
    assert b.steps.dtype is kael.int64 and b.cache.dtype is kael.float64
    y = b(kael.ones(1, 3, dtype=kael.float64))
    assert y.dtype is kael.float64
    b.float()
    assert w.dtype is kael.float32
    with pytest.raises(DTypeError, match="floating-point"):
        b.to(kael.int32)


# -- state dicts ---------------------------------------------------------------------------------


def test_state_dict_keys_and_values() -> None:
    net = Net()
    sd = net.state_dict()
    # PyTorch's order: a module's own parameters and buffers, then its children's; tied modules twice
    assert list(sd) == [
        "blocks.0.steps",
        "blocks.0.fc.weight",
        "blocks.0.fc.bias",
        "blocks.0.norm.weight",
        "blocks.0.norm.bias",
        "blocks.1.steps",
        "blocks.1.fc.weight",
        "blocks.1.fc.bias",
        "blocks.1.norm.weight",
        "blocks.1.norm.bias",
        "head.weight",
        "tied.weight",
    ]
    assert not any(v.requires_grad for v in sd.values())
    assert sd["head.weight"]._storage is net.head.weight._storage  # detached, not copied


def test_load_state_dict_round_trip_and_cast() -> None:
    a, b = Net(), Net()
    sd = {k: v.double() for k, v in a.state_dict().items()}  # cast back to float32 on load
    res = b.load_state_dict(sd)
    assert res.missing_keys == [] and res.unexpected_keys == []
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        assert p.dtype is q.dtype, n
        np.testing.assert_array_equal(arr(p), arr(q))
    x = kael.randn(4, 3)
    np.testing.assert_array_equal(arr(a(x)), arr(b(x)))
    assert b.head.weight.is_leaf and b.head.weight.grad_fn is None


def test_load_state_dict_strict_errors_name_keys_and_write_nothing() -> None:
    m = nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 1))
    before = arr(m[0].weight).copy()
    sd = m.state_dict()
    good = {k: kael.zeros(v.shape) for k, v in sd.items()}
    bad = dict(good)
    del bad["1.bias"]
    bad["2.weight"] = kael.zeros(1)
    with pytest.raises(KaelError, match=r"missing key\(s\): '1.bias'.*unexpected key\(s\): '2.weight'"):
        m.load_state_dict(bad)
    shapes = dict(good)
    shapes["0.weight"] = kael.zeros(2, 3)
    with pytest.raises(ShapeError, match=r"size mismatch for '0.weight': checkpoint \[2, 3\] vs model \[3, 2\]"):
        m.load_state_dict(shapes)
    np.testing.assert_array_equal(arr(m[0].weight), before)  # nothing was written
    res = m.load_state_dict(bad, strict=False)
    assert res.missing_keys == ["1.bias"] and res.unexpected_keys == ["2.weight"]
    assert arr(m[0].weight).tolist() == [[0.0, 0.0]] * 3
    with pytest.raises(ShapeError, match="size mismatch"):
        m.load_state_dict({"0.weight": kael.zeros(5)}, strict=False)  # shapes are checked even when lax


def test_load_state_dict_accepts_numpy_arrays() -> None:
    m = nn.Linear(2, 1)
    m.load_state_dict({"weight": np.array([[1.0, 2.0]]), "bias": np.array([0.5])})
    assert arr(m(kael.tensor([[1.0, 1.0]]))).tolist() == [[3.5]]


def test_repr() -> None:
    net = nn.Sequential(
        nn.Linear(784, 256),
        nn.ReLU(),
        nn.Sequential(nn.Dropout(0.1), nn.GELU("tanh")),
        nn.LayerNorm(256),
        nn.Embedding(10, 4),
    )
    assert repr(net) == (
        "Sequential(\n"
        "  (0): Linear(in_features=784, out_features=256, bias=True)\n"
        "  (1): ReLU()\n"
        "  (2): Sequential(\n"
        "    (0): Dropout(p=0.1)\n"
        "    (1): GELU(approximate='tanh')\n"
        "  )\n"
        "  (3): LayerNorm((256,), eps=1e-05, elementwise_affine=True)\n"
        "  (4): Embedding(10, 4)\n"
        ")"
    )


# -- containers ---------------------------------------------------------------------------------


def test_sequential_module_list_and_module_dict() -> None:
    seq = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))
    assert len(seq) == 3 and isinstance(seq[-1], nn.Linear)
    assert isinstance(seq[1:], nn.Sequential) and len(seq[1:]) == 2
    x = kael.randn(4, 2)
    np.testing.assert_array_equal(arr(seq(x)), arr(seq[2](seq[1](seq[0](x)))))
    seq.append(nn.ReLU())
    assert [n for n, _ in seq.named_children()] == ["0", "1", "2", "3"]
    with pytest.raises(kael.IndexError_, match="index 7 is out of range for 4 modules"):
        seq[7]  # noqa: B018
    ml = nn.ModuleList([nn.ReLU(), nn.GELU()])
    ml.insert(1, nn.Linear(1, 1))
    assert [type(m).__name__ for m in ml] == ["ReLU", "Linear", "GELU"]
    del ml[0]
    assert [n for n, _ in ml.named_parameters()] == ["0.weight", "0.bias"]
    md = nn.ModuleDict({"a": nn.Linear(1, 2), "b": nn.ReLU()})
    md["c"] = nn.Linear(2, 2)
    assert list(md) == ["a", "b", "c"] and "b" in md and len(md) == 3
    assert [n for n, _ in md.named_parameters()] == ["a.weight", "a.bias", "c.weight", "c.bias"]
    assert isinstance(md.pop("b"), nn.ReLU) and list(md.keys()) == ["a", "c"]
    with pytest.raises(kael.IndexError_, match="no module named 'zz'"):
        md["zz"]  # noqa: B018


# -- layers ------------------------------------------------------------------------------------


def test_linear_matches_formula_and_init_bounds() -> None:
    kael.manual_seed(0)
    m = nn.Linear(50, 7)
    assert m.weight.shape == (7, 50) and m.bias.shape == (7,)
    bound = 1 / math.sqrt(50)
    assert np.abs(arr(m.weight)).max() <= bound and np.abs(arr(m.bias)).max() <= bound
    assert np.abs(arr(m.weight)).max() > 0.8 * bound  # really spread over the range
    x = np.random.default_rng(0).standard_normal((3, 50)).astype(np.float32)
    np.testing.assert_allclose(arr(m(kael.tensor(x))), x @ arr(m.weight).T + arr(m.bias), rtol=1e-5, atol=1e-6)
    m2 = nn.Linear(3, 2, bias=False, dtype=kael.float64)
    assert m2.bias is None and m2.weight.dtype is kael.float64
    with pytest.raises(DTypeError, match="floating-point dtype"):
        nn.Linear(2, 2, dtype=kael.int32)


def test_embedding_layernorm_gelu_relu_values() -> None:
    kael.manual_seed(1)
    e = nn.Embedding(1000, 16)
    w = arr(e.weight)
    assert abs(w.mean()) < 0.05 and abs(w.std() - 1.0) < 0.05
    ids = kael.tensor([[3, 999], [3, 0]])
    np.testing.assert_array_equal(arr(e(ids)), w[[[3, 999], [3, 0]]])
    ln = nn.LayerNorm(4, eps=1e-5)
    assert arr(ln.weight).tolist() == [1.0] * 4 and arr(ln.bias).tolist() == [0.0] * 4
    x = np.array([[1.0, 2.0, 4.0, 7.0]], dtype=np.float32)
    ref = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(arr(ln(kael.tensor(x))), ref, rtol=1e-5, atol=1e-6)
    assert nn.LayerNorm(4, elementwise_affine=False).weight is None
    v = np.linspace(-3, 3, 13)
    erf = np.vectorize(math.erf)
    np.testing.assert_allclose(
        arr(nn.GELU()(kael.tensor(v, dtype=kael.float64))), 0.5 * v * (1 + erf(v / 2**0.5)), rtol=1e-12, atol=1e-15
    )
    tanh_ref = 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3)))
    np.testing.assert_allclose(
        arr(nn.GELU("tanh")(kael.tensor(v, dtype=kael.float64))), tanh_ref, rtol=1e-12, atol=1e-15
    )
    assert arr(nn.ReLU()(kael.tensor([-1.0, 0.0, 2.0]))).tolist() == [0.0, 0.0, 2.0]
    with pytest.raises(DTypeError, match="approximate"):
        nn.GELU("fast")


def test_dropout_masks_scales_and_is_reproducible() -> None:
    x = kael.ones(200, 50)
    g = kael.Generator().manual_seed(3)
    d = nn.Dropout(0.3, generator=g)
    y = arr(d(x))
    np.testing.assert_allclose(np.unique(y), [0.0, 1 / 0.7], rtol=1e-6)
    assert abs((y == 0).mean() - 0.3) < 0.02
    g.manual_seed(3)
    np.testing.assert_array_equal(arr(d(x)), y)
    d.eval()
    assert d(x) is x
    assert F.dropout(x, 0.0) is x and arr(F.dropout(x, 1.0)).max() == 0.0
    with pytest.raises(DTypeError, match="probability"):
        nn.Dropout(1.5)
    xr = kael.ones(4, 4, requires_grad=True)
    out = F.dropout(xr, 0.5, generator=kael.Generator().manual_seed(0))
    out.sum().backward()
    np.testing.assert_array_equal(arr(xr.grad), arr(out))  # the gradient is the same mask and scale


def test_model_matches_torch_forward_and_backward() -> None:
    torch = pytest.importorskip("torch")
    kael.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.GELU("tanh"), nn.LayerNorm(8), nn.Linear(8, 3))
    tmodel = torch.nn.Sequential(
        torch.nn.Linear(6, 8), torch.nn.GELU("tanh"), torch.nn.LayerNorm(8), torch.nn.Linear(8, 3)
    ).double()
    model.double()
    tmodel.load_state_dict({k: torch.from_numpy(arr(v).copy()) for k, v in model.state_dict().items()})
    x = np.random.default_rng(0).standard_normal((5, 6))
    y = np.array([0, 2, 1, 1, 0])
    loss = F.cross_entropy(model(kael.tensor(x, dtype=kael.float64)), kael.tensor(y), label_smoothing=0.1)
    tloss = torch.nn.functional.cross_entropy(tmodel(torch.tensor(x)), torch.tensor(y), label_smoothing=0.1)
    loss.backward()
    tloss.backward()
    assert loss.item() == pytest.approx(tloss.item(), rel=1e-12)
    for (n, p), (tn, tp) in zip(model.named_parameters(), tmodel.named_parameters()):
        assert n == tn
        np.testing.assert_allclose(arr(p.grad), tp.grad.numpy(), rtol=1e-9, atol=1e-12, err_msg=n)


# -- functional -------------------------------------------------------------------------------


def _log_softmax(z: np.ndarray) -> np.ndarray:
    s = z - z.max(1, keepdims=True)
    return s - np.log(np.exp(s).sum(1, keepdims=True))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.25])
def test_cross_entropy_formula(reduction: str, smoothing: float) -> None:
    rng = np.random.default_rng(1)
    z = rng.standard_normal((6, 4))
    y = np.array([0, 3, -100, 1, 2, -100])
    logp = _log_softmax(z)
    keep = y != -100
    safe = np.where(keep, y, 0)
    per = -(1 - smoothing) * logp[np.arange(6), safe] - smoothing * logp.mean(1)
    per = np.where(keep, per, 0.0)
    expected = {"none": per, "sum": per.sum(), "mean": per.sum() / keep.sum()}[reduction]
    got = F.cross_entropy(
        kael.tensor(z, dtype=kael.float64), kael.tensor(y), reduction=reduction, label_smoothing=smoothing
    )
    np.testing.assert_allclose(arr(got), expected, rtol=1e-12)


def test_cross_entropy_errors() -> None:
    z = kael.zeros(3, 4)
    with pytest.raises(kael.IndexError_, match="target 4 is out of range for 4 classes"):
        F.cross_entropy(z, kael.tensor([0, 4, 1]))
    with pytest.raises(ShapeError, match=r"logits \[N, C\] and target \[N\]"):
        F.cross_entropy(z, kael.tensor([0, 1]))
    with pytest.raises(DTypeError, match="integer tensor of class ids"):
        F.cross_entropy(z, kael.zeros(3))
    assert math.isnan(F.cross_entropy(z, kael.tensor([-100, -100, -100])).item())  # no target counted: 0/0


def test_softmax_nll_mse_and_attention_formulas() -> None:
    rng = np.random.default_rng(2)
    z = rng.standard_normal((3, 5))
    np.testing.assert_allclose(
        arr(F.softmax(kael.tensor(z, dtype=kael.float64), dim=1)), np.exp(_log_softmax(z)), rtol=1e-12
    )
    y = np.array([4, 0, 2])
    nll = F.nll_loss(F.log_softmax(kael.tensor(z, dtype=kael.float64), 1), kael.tensor(y))
    assert nll.item() == pytest.approx(-_log_softmax(z)[np.arange(3), y].mean(), rel=1e-12)
    a, b = rng.standard_normal(4), rng.standard_normal(4)
    assert F.mse_loss(kael.tensor(a), kael.tensor(b)).item() == pytest.approx(((a - b) ** 2).mean(), rel=1e-6)
    q, k, v = (rng.standard_normal((2, 3, 4)) for _ in range(3))
    s = q @ k.transpose(0, 2, 1) / 2.0
    s = np.where(np.tril(np.ones((3, 3))) > 0, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    got = F.scaled_dot_product_attention(*(kael.tensor(x, dtype=kael.float64) for x in (q, k, v)), is_causal=True)
    assert got.shape == (2, 3, 4)
    np.testing.assert_allclose(arr(got), p @ v, rtol=1e-10)


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
