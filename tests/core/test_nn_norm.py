"""kael.nn normalisation layers (BatchNorm1d/2d, InstanceNorm1d/2d, GroupNorm) and Dropout2d against PyTorch."""

from __future__ import annotations

from typing import Any

import kael
import numpy as np
import pytest
import torch
from kael import KaelError, nn
from kael.nn import functional as F
from kael.testing import gradcheck


def _sync(k: Any, t: Any) -> None:
    k.load_state_dict({name: kael.tensor(v.detach().numpy()) for name, v in t.state_dict().items()})


def _step(k: Any, t: Any, x: np.ndarray) -> None:
    kx, tx = kael.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    ky, ty = k(kx), t(tx)
    np.testing.assert_allclose(ky.detach().numpy(), ty.detach().numpy(), rtol=1e-4, atol=1e-5)
    g = np.cos(np.arange(ty.numel(), dtype=np.float32)).reshape(ty.shape)
    (ky * kael.tensor(g)).sum().backward()
    (ty * torch.tensor(g)).sum().backward()
    np.testing.assert_allclose(kx.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-5)
    kp = dict(k.named_parameters())
    for name, p in t.named_parameters():
        np.testing.assert_allclose(kp[name].grad.numpy(), p.grad.numpy(), rtol=1e-4, atol=1e-5, err_msg=name)
    tb = dict(t.named_buffers())
    for name, b in k.named_buffers():
        np.testing.assert_allclose(b.numpy(), tb[name].numpy(), rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"momentum": None},
        {"momentum": 0.3, "eps": 1e-3},
        {"affine": False},
        {"track_running_stats": False},
    ],
)
@pytest.mark.parametrize("cls", ["BatchNorm1d", "BatchNorm2d"])
def test_batch_norm_train_then_eval(cls: str, kw: dict[str, Any]) -> None:
    k, t = getattr(nn, cls)(3, **kw), getattr(torch.nn, cls)(3, **kw)
    if k.affine:
        t.weight.data.uniform_(0.5, 1.5)
        t.bias.data.uniform_(-0.5, 0.5)
    _sync(k, t)
    assert list(k.state_dict()) == list(t.state_dict())
    rng = np.random.default_rng(0)
    shape = (4, 3, 5, 2) if cls == "BatchNorm2d" else (6, 3)
    for i in range(3):  # running statistics accumulate over steps
        _step(k, t, (rng.standard_normal(shape) * (i + 1) + i).astype(np.float32))
    if k.track_running_stats:
        assert int(k.num_batches_tracked.item()) == 3
    k.eval()
    t.eval()
    _step(k, t, rng.standard_normal(shape).astype(np.float32))
    if cls == "BatchNorm1d":
        k.train()
        t.train()
        _step(k, t, rng.standard_normal((4, 3, 5)).astype(np.float32))  # [N, C, L]


def test_batch_norm_batch_one_and_empty() -> None:
    k, t = nn.BatchNorm2d(2), torch.nn.BatchNorm2d(2)
    _step(k, t, np.random.default_rng(1).standard_normal((1, 2, 3, 3)).astype(np.float32))
    with pytest.raises(KaelError, match="more than 1 value per channel"):
        nn.BatchNorm1d(2)(kael.ones(1, 2))
    k.eval()
    t.eval()
    assert k(kael.zeros(0, 2, 3, 3)).shape == (0, 2, 3, 3)


@pytest.mark.parametrize(
    "kw", [{}, {"affine": True}, {"track_running_stats": True}, {"affine": True, "track_running_stats": True}]
)
def test_instance_norm(kw: dict[str, Any]) -> None:
    k, t = nn.InstanceNorm2d(3, **kw), torch.nn.InstanceNorm2d(3, **kw)
    if k.affine:
        t.weight.data.uniform_(0.5, 1.5)
        t.bias.data.uniform_(-0.5, 0.5)
    _sync(k, t)
    rng = np.random.default_rng(2)
    for _ in range(2):
        _step(k, t, rng.standard_normal((2, 3, 4, 5)).astype(np.float32))
    k.eval()
    t.eval()
    _step(k, t, rng.standard_normal((2, 3, 4, 5)).astype(np.float32))
    _step(k, t, rng.standard_normal((3, 4, 5)).astype(np.float32))  # unbatched
    k1, t1 = nn.InstanceNorm1d(3, **kw), torch.nn.InstanceNorm1d(3, **kw)
    _sync(k1, t1)
    _step(k1, t1, rng.standard_normal((2, 3, 6)).astype(np.float32))


@pytest.mark.parametrize(("groups", "affine"), [(1, True), (2, True), (4, False), (4, True)])
def test_group_norm(groups: int, affine: bool) -> None:
    k, t = nn.GroupNorm(groups, 4, affine=affine), torch.nn.GroupNorm(groups, 4, affine=affine)
    if affine:
        t.weight.data.uniform_(0.5, 1.5)
        t.bias.data.uniform_(-0.5, 0.5)
    _sync(k, t)
    rng = np.random.default_rng(3)
    _step(k, t, rng.standard_normal((2, 4, 3, 5)).astype(np.float32))
    _step(k, t, rng.standard_normal((3, 4, 5)).astype(np.float32))


def test_gradcheck_float64() -> None:
    rng = np.random.default_rng(4)
    x = kael.tensor(rng.standard_normal((3, 2, 2, 2)), requires_grad=True)
    w = kael.tensor(rng.uniform(0.5, 1.5, 2), requires_grad=True)
    b = kael.tensor(rng.standard_normal(2), requires_grad=True)
    assert gradcheck(lambda a, ww, bb: F.batch_norm(a, None, None, ww, bb, True), [x, w, b])
    assert gradcheck(lambda a, ww, bb: F.group_norm(a, 2, ww, bb), [x, w, b])
    assert gradcheck(lambda a, ww, bb: F.instance_norm(a, weight=ww, bias=bb), [x, w, b])


def test_dropout2d_zeroes_whole_channels() -> None:
    kael.manual_seed(0)
    x = kael.ones(8, 16, 3, 3)
    m = nn.Dropout2d(0.5)
    y = m(x).numpy()
    per_channel = y.reshape(8, 16, 9)
    assert set(np.unique(per_channel)) <= {0.0, 2.0}
    assert (per_channel.min(-1) == per_channel.max(-1)).all()  # a channel is kept or dropped as a whole
    assert 0.25 < (per_channel[..., 0] == 0).mean() < 0.75
    m.eval()
    np.testing.assert_array_equal(m(x).numpy(), x.numpy())
    assert F.dropout2d(kael.ones(4, 2, 2), 1.0).numpy().sum() == 0.0
    with pytest.raises(KaelError, match="3-d"):
        F.dropout2d(kael.ones(4, 2), 0.5)


def test_unflatten() -> None:
    x = np.arange(24, dtype=np.float32).reshape(2, 12)
    for dim, size in [(1, (3, 4)), (-1, (2, -1)), (0, (1, 2))]:
        np.testing.assert_array_equal(
            nn.Unflatten(dim, size)(kael.tensor(x)).numpy(), torch.nn.Unflatten(dim, size)(torch.tensor(x)).numpy()
        )


def test_bad_arguments_raise_kael_errors() -> None:
    with pytest.raises(KaelError, match="num_groups"):
        nn.GroupNorm(3, 4)
    with pytest.raises(KaelError, match="num_features"):
        nn.BatchNorm2d(0)
    with pytest.raises(KaelError, match="4-d"):
        nn.BatchNorm2d(3)(kael.ones(2, 3))
    with pytest.raises(KaelError, match="weight must have shape"):
        F.batch_norm(kael.ones(2, 3), None, None, kael.ones(2), training=True)


@pytest.mark.parametrize("cls", ["BatchNorm2d", "InstanceNorm2d"])
def test_bias_false_keys_values_and_repr(cls: str) -> None:
    k = getattr(nn, cls)(3, affine=True, bias=False)
    t = getattr(torch.nn, cls)(3, affine=True, bias=False)
    t.weight.data.uniform_(0.5, 1.5)
    _sync(k, t)
    assert list(k.state_dict()) == list(t.state_dict()) and k.bias is None
    assert repr(k) == repr(t)
    _step(k, t, np.random.default_rng(5).standard_normal((2, 3, 4, 4)).astype(np.float32))


def test_reprs_match_torch() -> None:
    for name, args in [("BatchNorm1d", (4,)), ("BatchNorm2d", (4,)), ("InstanceNorm2d", (3,)), ("GroupNorm", (2, 4))]:
        assert repr(getattr(nn, name)(*args)) == repr(getattr(torch.nn, name)(*args))
    assert repr(nn.GroupNorm(2, 4, bias=False)) == repr(torch.nn.GroupNorm(2, 4, bias=False))
    assert repr(nn.BatchNorm2d(3, momentum=None)) == repr(torch.nn.BatchNorm2d(3, momentum=None))
    assert repr(nn.Dropout2d(0.3)) == repr(torch.nn.Dropout2d(0.3))
    assert repr(nn.Unflatten(1, (2, 3))) == repr(torch.nn.Unflatten(1, (2, 3)))
