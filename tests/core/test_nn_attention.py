"""kael.nn.MultiheadAttention against torch.nn.MultiheadAttention, and a PyTorch CNN checkpoint loaded into kael."""

from __future__ import annotations

from typing import Any

import kael
import numpy as np
import pytest
import torch
from kael import KaelError, nn


def _sync(k: Any, t: Any) -> None:
    ks = k.state_dict()
    ts = t.state_dict()
    assert list(ks) == list(ts)
    k.load_state_dict({name: kael.tensor(v.detach().numpy()) for name, v in ts.items()})


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("average", [True, False])
def test_self_attention_with_masks(batch_first: bool, average: bool) -> None:
    torch.manual_seed(0)
    t = torch.nn.MultiheadAttention(8, 2, batch_first=batch_first)
    with torch.no_grad():
        t.in_proj_bias.uniform_(-0.3, 0.3)
        t.out_proj.bias.uniform_(-0.3, 0.3)
    k = nn.MultiheadAttention(8, 2, batch_first=batch_first)
    _sync(k, t)
    rng = np.random.default_rng(0)
    n, length = 3, 5
    x = rng.standard_normal((n, length, 8) if batch_first else (length, n, 8)).astype(np.float32)
    causal = np.triu(np.ones((length, length), bool), 1)
    pad = np.zeros((n, length), bool)
    pad[1, -2:] = True
    float_mask = rng.standard_normal((n * 2, length, length)).astype(np.float32)
    for mask, kpm in [(None, None), (causal, None), (None, pad), (causal, pad), (float_mask, None)]:
        kx, tx = kael.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
        km = kael.tensor(mask) if mask is not None else None
        tm = torch.tensor(mask) if mask is not None else None
        kp = kael.tensor(kpm) if kpm is not None else None
        tp = torch.tensor(kpm) if kpm is not None else None
        ko, kw = k(kx, kx, kx, key_padding_mask=kp, attn_mask=km, average_attn_weights=average)
        to, tw = t(tx, tx, tx, key_padding_mask=tp, attn_mask=tm, average_attn_weights=average)
        np.testing.assert_allclose(ko.detach().numpy(), to.detach().numpy(), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(kw.detach().numpy(), tw.detach().numpy(), rtol=1e-4, atol=1e-6)
        ko.sum().backward()
        to.sum().backward()
        np.testing.assert_allclose(kx.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-4)
    kp_, tp_ = dict(k.named_parameters()), dict(t.named_parameters())
    for name, p in tp_.items():
        np.testing.assert_allclose(kp_[name].grad.numpy(), p.grad.numpy(), rtol=1e-4, atol=1e-4, err_msg=name)


def test_cross_attention_kdim_vdim_unbatched_and_no_weights() -> None:
    torch.manual_seed(1)
    t = torch.nn.MultiheadAttention(6, 3, kdim=4, vdim=5, batch_first=True)
    k = nn.MultiheadAttention(6, 3, kdim=4, vdim=5, batch_first=True)
    _sync(k, t)
    rng = np.random.default_rng(1)
    q = rng.standard_normal((2, 3, 6)).astype(np.float32)
    kk = rng.standard_normal((2, 4, 4)).astype(np.float32)
    v = rng.standard_normal((2, 4, 5)).astype(np.float32)
    ko, kw = k(kael.tensor(q), kael.tensor(kk), kael.tensor(v), need_weights=False)
    to, tw = t(torch.tensor(q), torch.tensor(kk), torch.tensor(v), need_weights=False)
    assert kw is None and tw is None
    np.testing.assert_allclose(ko.detach().numpy(), to.detach().numpy(), rtol=1e-4, atol=1e-5)
    ko, kw = k(kael.tensor(q[0]), kael.tensor(kk[0]), kael.tensor(v[0]))
    to, tw = t(torch.tensor(q[0]), torch.tensor(kk[0]), torch.tensor(v[0]))
    np.testing.assert_allclose(ko.detach().numpy(), to.detach().numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(kw.detach().numpy(), tw.detach().numpy(), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(("bias_kv", "zero_attn"), [(True, False), (False, True), (True, True)])
def test_bias_kv_and_zero_attn(bias_kv: bool, zero_attn: bool) -> None:
    torch.manual_seed(3)
    t = torch.nn.MultiheadAttention(4, 2, add_bias_kv=bias_kv, add_zero_attn=zero_attn)
    k = nn.MultiheadAttention(4, 2, add_bias_kv=bias_kv, add_zero_attn=zero_attn)
    _sync(k, t)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 2, 4)).astype(np.float32)
    mask = np.triu(np.ones((3, 3), bool), 1)
    pad = np.array([[False, False, True], [False, False, False]])
    kx, tx = kael.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    ko, kw = k(kx, kx, kx, attn_mask=kael.tensor(mask), key_padding_mask=kael.tensor(pad))
    to, tw = t(tx, tx, tx, attn_mask=torch.tensor(mask), key_padding_mask=torch.tensor(pad))
    np.testing.assert_allclose(ko.detach().numpy(), to.detach().numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(kw.detach().numpy(), tw.detach().numpy(), rtol=1e-4, atol=1e-6)
    ko.sum().backward()
    to.sum().backward()
    np.testing.assert_allclose(kx.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-4)
    if bias_kv:
        np.testing.assert_allclose(k.bias_k.grad.numpy(), t.bias_k.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_is_causal_matches_an_explicit_mask() -> None:
    m = nn.MultiheadAttention(4, 2, batch_first=True)
    x = kael.tensor(np.random.default_rng(4).standard_normal((2, 3, 4)).astype(np.float32))
    mask = kael.tensor(np.triu(np.ones((3, 3), bool), 1))
    a, _ = m(x, x, x, is_causal=True)
    b, _ = m(x, x, x, attn_mask=mask)
    np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy())


def test_bad_arguments() -> None:
    with pytest.raises(KaelError, match="divisible"):
        nn.MultiheadAttention(6, 4)
    m = nn.MultiheadAttention(4, 2)
    x = kael.ones(3, 2, 4)
    with pytest.raises(KaelError, match="attn_mask"):
        m(x, x, x, attn_mask=kael.ones(2, 2))
    with pytest.raises(KaelError, match="key_padding_mask"):
        m(x, x, x, key_padding_mask=kael.zeros(3, 3, dtype=kael.bool))


class _KaelCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 4, 3, padding=1),
            nn.BatchNorm2d(4),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(4, 8, 3, groups=2, padding="same", padding_mode="reflect"),
            nn.GroupNorm(2, 8),
            nn.PReLU(8),
            nn.AvgPool2d(2, ceil_mode=True),
            nn.ConvTranspose2d(8, 4, 2, stride=2),
            nn.InstanceNorm2d(4, affine=True),
            nn.Upsample(scale_factor=2, mode="bilinear"),
            nn.AdaptiveAvgPool2d((2, 2)),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Dropout(0.2), nn.Linear(16, 3), nn.BatchNorm1d(3), nn.Tanh())


def _torch_cnn() -> torch.nn.Module:
    tn = torch.nn
    m = tn.Module()
    m.features = tn.Sequential(
        tn.Conv2d(1, 4, 3, padding=1),
        tn.BatchNorm2d(4),
        tn.ReLU(),
        tn.MaxPool2d(2),
        tn.Conv2d(4, 8, 3, groups=2, padding="same", padding_mode="reflect"),
        tn.GroupNorm(2, 8),
        tn.PReLU(8),
        tn.AvgPool2d(2, ceil_mode=True),
        tn.ConvTranspose2d(8, 4, 2, stride=2),
        tn.InstanceNorm2d(4, affine=True),
        tn.Upsample(scale_factor=2, mode="bilinear"),
        tn.AdaptiveAvgPool2d((2, 2)),
    )
    m.head = tn.Sequential(tn.Flatten(), tn.Dropout(0.2), tn.Linear(16, 3), tn.BatchNorm1d(3), tn.Tanh())
    return m


def test_torch_cnn_state_dict_loads_and_gives_the_same_outputs() -> None:
    torch.manual_seed(2)
    t = _torch_cnn()
    t.train()
    x = torch.randn(4, 1, 10, 9)
    with torch.no_grad():
        t.features(x)  # move the running statistics away from their initial values
        for p in t.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    t.eval()
    k = _KaelCNN()
    _sync(k, t)
    k.eval()
    with torch.no_grad():
        want = t.head(t.features(x)).numpy()
    got = k.head(k.features(kael.tensor(x.numpy()))).detach().numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
