"""kael.nn.Module: bookkeeping, state dicts, repr and containers.

Named parameters, buffers (persistent or not) and modules, attribute registration and
its checks, Parameter, train/eval, zero_grad and dtype casts keeping parameter identity;
state_dict order and load_state_dict (round trip, casts, strict errors that write
nothing, NumPy arrays); the module tree's repr; Sequential, ModuleList and ModuleDict.
"""

from __future__ import annotations

import kael
import numpy as np
import pytest
from kael import DTypeError, KaelError, ShapeError, nn
from tensor_values import arr


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
