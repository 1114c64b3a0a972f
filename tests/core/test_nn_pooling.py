"""kael.nn pooling and resampling (MaxPool, AvgPool, AdaptiveAvgPool, Upsample, PixelShuffle) against PyTorch."""

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


def _compare(km: Any, tm: Any, x: np.ndarray, transpose: bool = False) -> None:
    kx, tx = kael.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    kin, tin = (kx.mT, tx.mT) if transpose else (kx, tx)
    ky, ty = km(kin), tm(tin)
    if isinstance(ty, tuple):
        np.testing.assert_array_equal(ky[1].numpy(), ty[1].numpy())
        ky, ty = ky[0], ty[0]
    np.testing.assert_allclose(ky.detach().numpy(), ty.detach().numpy(), rtol=1e-5, atol=1e-6)
    if ty.numel() == 0:
        return
    g = np.cos(np.arange(ty.numel(), dtype=np.float32)).reshape(ty.shape)
    (ky * kael.tensor(g)).sum().backward()
    (ty * torch.tensor(g)).sum().backward()
    np.testing.assert_allclose(kx.grad.numpy(), tx.grad.numpy(), rtol=1e-5, atol=1e-6)


MAX2D = [
    {"kernel_size": 2},
    {"kernel_size": 3, "stride": 2, "padding": 1},
    {"kernel_size": 3, "stride": 2, "ceil_mode": True},
    {"kernel_size": (2, 3), "stride": (1, 2), "dilation": 2, "padding": 1},
    {"kernel_size": 2, "return_indices": True},
    {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True, "return_indices": True},
]
AVG2D = [
    {"kernel_size": 2},
    {"kernel_size": 3, "stride": 2, "padding": 1},
    {"kernel_size": 3, "stride": 2, "padding": 1, "count_include_pad": False},
    {"kernel_size": 3, "stride": 2, "ceil_mode": True},
    {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True, "count_include_pad": False},
    {"kernel_size": (2, 3), "divisor_override": 4},
]


@pytest.mark.parametrize("kw", MAX2D)
def test_max_pool2d(kw: dict[str, Any]) -> None:
    x = np.random.default_rng(0).standard_normal((2, 3, 9, 8)).astype(np.float32)
    _compare(nn.MaxPool2d(**kw), torch.nn.MaxPool2d(**kw), x)


def test_max_pool_ties_send_the_gradient_to_one_element() -> None:
    x = np.zeros((1, 1, 4, 4), np.float32)  # e.g. after a ReLU
    _compare(nn.MaxPool2d(2), torch.nn.MaxPool2d(2), x)


@pytest.mark.parametrize("kw", AVG2D)
def test_avg_pool2d(kw: dict[str, Any]) -> None:
    x = np.random.default_rng(1).standard_normal((2, 3, 9, 8)).astype(np.float32)
    _compare(nn.AvgPool2d(**kw), torch.nn.AvgPool2d(**kw), x)


@pytest.mark.parametrize(
    ("km", "tm"),
    [
        (nn.MaxPool1d(3, 2, 1), torch.nn.MaxPool1d(3, 2, 1)),
        (
            nn.MaxPool1d(2, ceil_mode=True, return_indices=True),
            torch.nn.MaxPool1d(2, ceil_mode=True, return_indices=True),
        ),
        (nn.AvgPool1d(3, 2, 1, count_include_pad=False), torch.nn.AvgPool1d(3, 2, 1, count_include_pad=False)),
        (nn.AvgPool1d(2, ceil_mode=True), torch.nn.AvgPool1d(2, ceil_mode=True)),
        (nn.AdaptiveAvgPool1d(4), torch.nn.AdaptiveAvgPool1d(4)),
    ],
)
def test_1d_pools(km: Any, tm: Any) -> None:
    _compare(km, tm, np.random.default_rng(2).standard_normal((2, 3, 9)).astype(np.float32))
    _compare(km, tm, np.random.default_rng(3).standard_normal((3, 7)).astype(np.float32))  # unbatched


@pytest.mark.parametrize("size", [(3, 4), 1, (5, None), (9, 8), (4, 3), (7, 5)])
def test_adaptive_avg_pool2d(size: Any) -> None:
    x = np.random.default_rng(4).standard_normal((2, 3, 9, 8)).astype(np.float32)
    _compare(nn.AdaptiveAvgPool2d(size), torch.nn.AdaptiveAvgPool2d(size), x)


@pytest.mark.parametrize(
    "kw",
    [
        {"size": (12, 5)},
        {"scale_factor": 2},
        {"scale_factor": 1.7},
        {"size": (12, 5), "mode": "bilinear"},
        {"size": (12, 17), "mode": "bilinear", "align_corners": True},
        {"scale_factor": 2.5, "mode": "bilinear"},
        {"scale_factor": 0.5, "mode": "bilinear", "align_corners": False},
        {"scale_factor": 1.7, "mode": "bilinear", "recompute_scale_factor": True},
        {"scale_factor": 1.7, "recompute_scale_factor": True},
    ],
)
def test_upsample(kw: dict[str, Any]) -> None:
    x = np.random.default_rng(5).standard_normal((2, 3, 6, 5)).astype(np.float32)
    _compare(nn.Upsample(**kw), torch.nn.Upsample(**kw), x)


def test_non_contiguous_batch_one_and_empty() -> None:
    rng = np.random.default_rng(6)
    x = rng.standard_normal((1, 2, 6, 7)).astype(np.float32)
    for km, tm in [
        (nn.MaxPool2d(2), torch.nn.MaxPool2d(2)),
        (nn.AvgPool2d(3, 2, 1), torch.nn.AvgPool2d(3, 2, 1)),
        (nn.AdaptiveAvgPool2d(3), torch.nn.AdaptiveAvgPool2d(3)),
        (nn.Upsample(scale_factor=2, mode="bilinear"), torch.nn.Upsample(scale_factor=2, mode="bilinear")),
    ]:
        _compare(km, tm, x, transpose=True)
        _compare(km, tm, np.zeros((0, 2, 6, 7), np.float32))


@settings(max_examples=20, deadline=None)
@given(
    hw=st.tuples(st.integers(2, 9), st.integers(2, 9)),
    k=st.integers(1, 3),
    stride=st.integers(1, 3),
    padding=st.integers(0, 1),
    ceil_mode=st.booleans(),
    count_include_pad=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_random_pools(
    hw: tuple[int, int], k: int, stride: int, padding: int, ceil_mode: bool, count_include_pad: bool, seed: int
) -> None:
    if 2 * padding > k or min(hw) + 2 * padding < k:
        return
    x = np.random.default_rng(seed).standard_normal((2, 2) + hw).astype(np.float32)
    _compare(
        nn.MaxPool2d(k, stride, padding, ceil_mode=ceil_mode),
        torch.nn.MaxPool2d(k, stride, padding, ceil_mode=ceil_mode),
        x,
    )
    kw = {"ceil_mode": ceil_mode, "count_include_pad": count_include_pad}
    _compare(nn.AvgPool2d(k, stride, padding, **kw), torch.nn.AvgPool2d(k, stride, padding, **kw), x)


@pytest.mark.parametrize("r", [1, 2, 3])
def test_pixel_shuffle_round_trip(r: int) -> None:
    x = np.random.default_rng(7).standard_normal((2, 2 * r * r, 3, 4)).astype(np.float32)
    _compare(nn.PixelShuffle(r), torch.nn.PixelShuffle(r), x)
    y = np.random.default_rng(8).standard_normal((2, 2, 3 * r, 2 * r)).astype(np.float32)
    _compare(nn.PixelUnshuffle(r), torch.nn.PixelUnshuffle(r), y)


def test_gradcheck_float64() -> None:
    x = kael.tensor(np.random.default_rng(9).standard_normal((1, 2, 5, 4)), requires_grad=True)
    assert gradcheck(lambda a: F.max_pool2d(a, 2, 1, ceil_mode=True), [x])
    assert gradcheck(lambda a: F.avg_pool2d(a, 3, 2, 1, ceil_mode=True, count_include_pad=False), [x])
    assert gradcheck(lambda a: F.adaptive_avg_pool2d(a, (3, 3)), [x])
    assert gradcheck(lambda a: F.interpolate(a, scale_factor=1.5, mode="bilinear", align_corners=True), [x])
    assert gradcheck(lambda a: F.interpolate(a, size=(7, 3)), [x])
    assert gradcheck(lambda a: F.pixel_shuffle(a, 1) * 2, [x])


def test_bad_arguments_raise_kael_errors() -> None:
    x = kael.ones(1, 2, 4, 4)
    with pytest.raises(KaelError, match="kernel_size"):
        F.max_pool2d(x, 6)
    with pytest.raises(KaelError, match="at most half"):
        F.max_pool2d(x, 2, padding=2)
    with pytest.raises(KaelError, match="stride"):
        F.avg_pool2d(x, 2, stride=-1)
    with pytest.raises(KaelError, match="divisor_override"):
        F.avg_pool2d(x, 2, divisor_override=0)
    with pytest.raises(KaelError, match="output_size"):
        F.adaptive_avg_pool2d(x, (0, 2))
    with pytest.raises(KaelError, match="exactly one of size and scale_factor"):
        F.interpolate(x)
    with pytest.raises(KaelError, match="mode"):
        F.interpolate(x, scale_factor=2, mode="bicubic")
    with pytest.raises(KaelError, match="antialias"):
        F.interpolate(x, scale_factor=0.5, mode="bilinear", antialias=True)
    with pytest.raises(KaelError, match="upscale_factor"):
        F.pixel_shuffle(kael.ones(1, 3, 2, 2), 2)


def test_reprs_match_torch() -> None:
    for name, args in [
        ("MaxPool2d", (2,)),
        ("MaxPool1d", (3, 2, 1)),
        ("AvgPool2d", (3,)),
        ("AvgPool1d", (2,)),
        ("AdaptiveAvgPool2d", ((2, 3),)),
        ("PixelShuffle", (2,)),
        ("PixelUnshuffle", (2,)),
    ]:
        assert repr(getattr(nn, name)(*args)) == repr(getattr(torch.nn, name)(*args))
    assert repr(nn.Upsample(scale_factor=2)) == repr(torch.nn.Upsample(scale_factor=2))
    assert repr(nn.Upsample(size=(3, 4), mode="bilinear")) == repr(torch.nn.Upsample(size=(3, 4), mode="bilinear"))
