"""kael.nn convolutions (Conv1d, Conv2d, ConvTranspose2d, F.pad) against PyTorch: values, gradients, errors."""

from __future__ import annotations

from typing import Any

import kael
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kael import KaelError, nn
from kael.nn import functional as F
from kael.testing import gradcheck

TF = torch.nn.functional


def _copy(k: Any, t: Any) -> None:
    k.load_state_dict({name: kael.tensor(v.detach().numpy()) for name, v in t.state_dict().items()})


def _compare(km: Any, tm: Any, x: np.ndarray, transpose: bool = False, rtol: float = 1e-4) -> None:
    _copy(km, tm)
    kx, tx = kael.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    kin, tin = (kx.mT, tx.mT) if transpose else (kx, tx)
    ky, ty = km(kin), tm(tin)
    np.testing.assert_allclose(ky.detach().numpy(), ty.detach().numpy(), rtol=rtol, atol=1e-5)
    if ty.numel() == 0:
        return
    g = np.cos(np.arange(ty.numel(), dtype=np.float32)).reshape(ty.shape)
    (ky * kael.tensor(g)).sum().backward()
    (ty * torch.tensor(g)).sum().backward()
    np.testing.assert_allclose(kx.grad.numpy(), tx.grad.numpy(), rtol=rtol, atol=1e-4)
    kp, tp = dict(km.named_parameters()), dict(tm.named_parameters())
    for name, p in tp.items():
        np.testing.assert_allclose(kp[name].grad.numpy(), p.grad.numpy(), rtol=rtol, atol=1e-4, err_msg=name)


CONV2D = [
    {},
    {"stride": 2, "padding": 1},
    {"padding": "same", "dilation": 2},
    {"padding": "valid", "bias": False},
    {"padding": (1, 2), "stride": (2, 1)},
    {"padding": 2, "padding_mode": "reflect"},
    {"padding": 1, "padding_mode": "replicate", "stride": 2},
    {"padding": (1, 2), "padding_mode": "circular"},
    {"padding": "same", "padding_mode": "reflect"},
    {"groups": 2, "padding": 1},
]


@pytest.mark.parametrize("kw", CONV2D, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "default")
def test_conv2d_matches_torch(kw: dict[str, Any]) -> None:
    x = np.random.default_rng(0).standard_normal((2, 4, 7, 8)).astype(np.float32)
    _compare(nn.Conv2d(4, 6, 3, **kw), torch.nn.Conv2d(4, 6, 3, **kw), x)


def test_depthwise_unbatched_and_non_contiguous() -> None:
    rng = np.random.default_rng(1)
    _compare(
        nn.Conv2d(3, 6, (3, 2), groups=3),
        torch.nn.Conv2d(3, 6, (3, 2), groups=3),
        rng.standard_normal((1, 3, 6, 5)).astype(np.float32),
    )
    _compare(nn.Conv2d(3, 2, 2), torch.nn.Conv2d(3, 2, 2), rng.standard_normal((3, 5, 4)).astype(np.float32))
    _compare(
        nn.Conv2d(2, 3, 3, padding=1),
        torch.nn.Conv2d(2, 3, 3, padding=1),
        rng.standard_normal((1, 2, 5, 6)).astype(np.float32),
        transpose=True,
    )
    _compare(nn.Conv2d(2, 3, 3), torch.nn.Conv2d(2, 3, 3), np.zeros((0, 2, 5, 5), np.float32))


@pytest.mark.parametrize(
    "kw",
    [{}, {"stride": 2, "padding": 2, "dilation": 2}, {"padding": "same", "padding_mode": "circular"}, {"groups": 4}],
)
def test_conv1d_matches_torch(kw: dict[str, Any]) -> None:
    x = np.random.default_rng(2).standard_normal((3, 4, 11)).astype(np.float32)
    _compare(nn.Conv1d(4, 8, 3, **kw), torch.nn.Conv1d(4, 8, 3, **kw), x)


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"stride": 2},
        {"stride": 2, "padding": 1, "output_padding": 1},
        {"stride": (3, 2), "padding": (2, 0), "output_padding": (1, 0), "groups": 2, "bias": False},
        {"stride": 2, "dilation": 2, "padding": 1, "output_padding": 1},
    ],
)
def test_conv_transpose2d_matches_torch(kw: dict[str, Any]) -> None:
    x = np.random.default_rng(3).standard_normal((2, 4, 5, 4)).astype(np.float32)
    _compare(nn.ConvTranspose2d(4, 6, (3, 2), **kw), torch.nn.ConvTranspose2d(4, 6, (3, 2), **kw), x)


def test_conv_transpose2d_output_size() -> None:
    k, t = nn.ConvTranspose2d(2, 3, 3, stride=2, padding=1), torch.nn.ConvTranspose2d(2, 3, 3, stride=2, padding=1)
    _copy(k, t)
    x = np.random.default_rng(4).standard_normal((1, 2, 4, 4)).astype(np.float32)
    ky, ty = k(kael.tensor(x), output_size=[8, 8]), t(torch.tensor(x), output_size=[8, 8])
    assert ky.shape == tuple(ty.shape) == (1, 3, 8, 8)
    np.testing.assert_allclose(ky.detach().numpy(), ty.detach().numpy(), rtol=1e-4, atol=1e-5)
    with pytest.raises(KaelError, match="output_size"):
        k(kael.tensor(x), output_size=[12, 12])


@settings(max_examples=15, deadline=None)
@given(
    n=st.integers(1, 2),
    c=st.sampled_from([1, 2, 4]),
    o=st.sampled_from([2, 4]),
    hw=st.tuples(st.integers(3, 8), st.integers(3, 8)),
    k=st.integers(1, 3),
    stride=st.integers(1, 3),
    padding=st.integers(0, 2),
    dilation=st.integers(1, 2),
    groups=st.sampled_from([1, 2]),
    seed=st.integers(0, 2**16),
)
def test_conv2d_random(
    n: int,
    c: int,
    o: int,
    hw: tuple[int, int],
    k: int,
    stride: int,
    padding: int,
    dilation: int,
    groups: int,
    seed: int,
) -> None:
    if c % groups or o % groups or min(hw) + 2 * padding < dilation * (k - 1) + 1:
        return
    x = np.random.default_rng(seed).standard_normal((n, c) + hw).astype(np.float32)
    kw = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}
    _compare(nn.Conv2d(c, o, k, **kw), torch.nn.Conv2d(c, o, k, **kw), x)


def test_gradcheck_float64() -> None:
    rng = np.random.default_rng(5)
    x = kael.tensor(rng.standard_normal((1, 2, 5, 4)), requires_grad=True)
    w = kael.tensor(rng.standard_normal((4, 1, 2, 3)), requires_grad=True)
    b = kael.tensor(rng.standard_normal(4), requires_grad=True)
    assert gradcheck(
        lambda a, ww, bb: F.conv2d(a, ww, bb, stride=(2, 1), padding=1, dilation=(1, 2), groups=2), [x, w, b]
    )
    wt = kael.tensor(rng.standard_normal((2, 3, 2, 2)), requires_grad=True)
    assert gradcheck(lambda a, ww: F.conv_transpose2d(a, ww, stride=2, padding=1, output_padding=1), [x, wt])
    x1 = kael.tensor(rng.standard_normal((2, 2, 6)), requires_grad=True)
    w1 = kael.tensor(rng.standard_normal((3, 2, 3)), requires_grad=True)
    assert gradcheck(lambda a, ww: F.conv1d(a, ww, padding="same"), [x1, w1])
    assert gradcheck(lambda a: F.pad(a, (2, 1, 1, 2), mode="reflect"), [x])


@pytest.mark.parametrize("mode", ["constant", "reflect", "replicate", "circular"])
def test_pad_matches_torch(mode: str) -> None:
    x = np.random.default_rng(6).standard_normal((2, 3, 4, 5)).astype(np.float32)
    for p in [(1, 2), (2, 0, 1, 3), (0, 1, 1, 0)] if mode == "constant" else [(2, 0, 1, 3), (0, 1, 1, 0), (1, 1, 2, 2)]:
        kw = {"value": 1.5} if mode == "constant" else {}
        np.testing.assert_array_equal(
            F.pad(kael.tensor(x), p, mode, **kw).numpy(), TF.pad(torch.tensor(x), p, mode, **kw).numpy()
        )
    np.testing.assert_array_equal(F.pad(kael.tensor(x), (-1, 2)).numpy(), TF.pad(torch.tensor(x), (-1, 2)).numpy())


def test_init_matches_torch_distribution() -> None:
    kael.manual_seed(0)
    m = nn.Conv2d(16, 32, 3)
    bound = 1 / np.sqrt(16 * 9)
    w = m.weight.detach().numpy()
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.9 * bound
    assert np.abs(m.bias.detach().numpy()).max() <= bound
    assert list(m.state_dict()) == list(torch.nn.Conv2d(16, 32, 3).state_dict())
    assert repr(nn.Conv2d(4, 8, 3, stride=2, padding=1, groups=2, bias=False)) == repr(
        torch.nn.Conv2d(4, 8, 3, stride=2, padding=1, groups=2, bias=False)
    )
    assert repr(nn.ConvTranspose2d(4, 8, 3, stride=2, output_padding=1)) == repr(
        torch.nn.ConvTranspose2d(4, 8, 3, stride=2, output_padding=1)
    )


def test_bad_arguments_raise_kael_errors() -> None:
    x = kael.ones(1, 4, 5, 5)
    w = kael.ones(2, 4, 7, 7)
    with pytest.raises(KaelError, match="kernel_size"):
        F.conv2d(x, w)
    with pytest.raises(KaelError, match="groups"):
        nn.Conv2d(4, 6, 3, groups=3)
    with pytest.raises(KaelError, match="groups"):
        F.conv2d(x, kael.ones(6, 4, 3, 3), groups=3)
    with pytest.raises(KaelError, match="stride"):
        nn.Conv2d(4, 6, 3, stride=-1)
    with pytest.raises(KaelError, match="stride"):
        F.conv2d(x, kael.ones(2, 4, 3, 3), stride=0)
    with pytest.raises(KaelError, match="padding"):
        nn.Conv2d(4, 6, 3, stride=2, padding="same")
    with pytest.raises(KaelError, match="padding_mode"):
        nn.Conv2d(4, 6, 3, padding_mode="mirror")
    with pytest.raises(KaelError, match="input channels"):
        F.conv2d(x, kael.ones(2, 3, 3, 3))
    with pytest.raises(KaelError, match="reflect padding"):
        F.pad(x, (5, 5), mode="reflect")
    with pytest.raises(KaelError, match="output_padding"):
        F.conv_transpose2d(x, kael.ones(4, 2, 3, 3), stride=2, output_padding=2)


@settings(max_examples=15, deadline=None)
@given(
    hw=st.tuples(st.integers(1, 5), st.integers(1, 5)),
    k=st.tuples(st.integers(1, 3), st.integers(1, 3)),
    stride=st.integers(1, 3),
    padding=st.integers(0, 2),
    extra=st.integers(0, 2),
    dilation=st.integers(1, 2),
    groups=st.sampled_from([1, 2]),
    seed=st.integers(0, 2**16),
)
def test_conv_transpose2d_random(
    hw: tuple[int, int],
    k: tuple[int, int],
    stride: int,
    padding: int,
    extra: int,
    dilation: int,
    groups: int,
    seed: int,
) -> None:
    output_padding = min(extra, max(stride, dilation) - 1)
    out = [(n - 1) * stride - 2 * padding + dilation * (kk - 1) + output_padding + 1 for n, kk in zip(hw, k)]
    if min(out) < 1:
        return
    x = np.random.default_rng(seed).standard_normal((2, 4) + hw).astype(np.float32)
    kw = {
        "stride": stride,
        "padding": padding,
        "output_padding": output_padding,
        "dilation": dilation,
        "groups": groups,
    }
    _compare(nn.ConvTranspose2d(4, 2, k, **kw), torch.nn.ConvTranspose2d(4, 2, k, **kw), x)
