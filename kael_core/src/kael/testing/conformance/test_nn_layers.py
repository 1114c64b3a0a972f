"""Convolution, pooling, resampling and batch norm on the backend's device: values against NumPy, float64 gradients.

Convolutions run the conv2d fused ops (the backend's kernels, or their decompositions;
their own rows are in ``_table_conv``); pooling, resampling and batch norm are frontend
compositions of primitives (NOTE [convolution by gather and matmul] in ``kael.ops._conv``),
so this checks that either way the layers give the right values, on non-contiguous inputs too, and the right gradients
(``kael.testing.gradcheck`` in float64). The NumPy oracles below are direct loops over
output positions, written for reading.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import kael
from kael.nn import functional as F
from kael.testing import assert_close, gradcheck


def _conv2d_ref(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, s: int, p: int, d: int, g: int) -> np.ndarray:
    n, _c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)))
    oh, ow = (h + 2 * p - d * (kh - 1) - 1) // s + 1, (wd + 2 * p - d * (kw - 1) - 1) // s + 1
    out = np.zeros((n, o, oh, ow), np.float64)
    og = o // g
    for oc, i, j in itertools.product(range(o), range(oh), range(ow)):
        grp = oc // og
        patch = xp[
            :, grp * cg : (grp + 1) * cg, i * s : i * s + d * (kh - 1) + 1 : d, j * s : j * s + d * (kw - 1) + 1 : d
        ]
        out[:, oc, i, j] = (patch * w[oc]).sum((1, 2, 3)) + (b[oc] if b is not None else 0.0)
    return out


def _conv_transpose2d_ref(x: np.ndarray, w: np.ndarray, s: int, p: int, op: int) -> np.ndarray:
    n, _c, h, wd = x.shape
    _, o, kh, kw = w.shape
    full = np.zeros((n, o, (h - 1) * s + kh + op, (wd - 1) * s + kw + op), np.float64)
    for i, j in itertools.product(range(h), range(wd)):
        full[:, :, i * s : i * s + kh, j * s : j * s + kw] += np.einsum("nc,cokl->nokl", x[:, :, i, j], w)
    return full[:, :, p : full.shape[2] - p, p : full.shape[3] - p]


def _pool2d_ref(x: np.ndarray, k: int, s: int, p: int, kind: str) -> np.ndarray:
    n, c, h, wd = x.shape
    fill = -np.inf if kind == "max" else 0.0
    xp = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)), constant_values=fill)
    oh, ow = (h + 2 * p - k) // s + 1, (wd + 2 * p - k) // s + 1
    out = np.zeros((n, c, oh, ow), np.float64)
    for i, j in itertools.product(range(oh), range(ow)):
        win = xp[:, :, i * s : i * s + k, j * s : j * s + k]
        out[:, :, i, j] = win.max((2, 3)) if kind == "max" else win.sum((2, 3)) / (k * k)
    return out


def _bilinear_ref(x: np.ndarray, oh: int, ow: int) -> np.ndarray:
    """align_corners=True bilinear resampling."""
    n, c, h, w = x.shape
    out = np.zeros((n, c, oh, ow), np.float64)
    for i, j in itertools.product(range(oh), range(ow)):
        sy, sx = i * (h - 1) / (oh - 1), j * (w - 1) / (ow - 1)
        y0, x0 = min(math.floor(sy), h - 1), min(math.floor(sx), w - 1)
        y1, x1 = min(y0 + 1, h - 1), min(x0 + 1, w - 1)
        fy, fx = sy - y0, sx - x0
        out[:, :, i, j] = (
            x[:, :, y0, x0] * (1 - fy) * (1 - fx)
            + x[:, :, y0, x1] * (1 - fy) * fx
            + x[:, :, y1, x0] * fy * (1 - fx)
            + x[:, :, y1, x1] * fy * fx
        )
    return out


def _t(x: np.ndarray, device: Any, transpose: bool = False) -> Any:
    if transpose:  # a non-contiguous operand with the same values
        return kael.tensor(np.ascontiguousarray(x.swapaxes(-1, -2)), device=device).mT
    return kael.tensor(x, device=device)


@pytest.mark.parametrize(("s", "p", "d", "g"), [(1, 0, 1, 1), (2, 1, 1, 2), (1, 2, 2, 1)])
@pytest.mark.parametrize("transpose", [False, True])
def test_conv2d_values(kael_device: Any, s: int, p: int, d: int, g: int, transpose: bool) -> None:
    rng = np.random.default_rng(s * 7 + p + d + g)
    x = rng.standard_normal((2, 4, 7, 6)).astype(np.float32)
    w = rng.standard_normal((6, 4 // g, 3, 2)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    got = F.conv2d(_t(x, kael_device, transpose), _t(w, kael_device), _t(b, kael_device), s, p, d, g)
    assert got.device == kael_device
    assert_close(got, _conv2d_ref(x, w, b, s, p, d, g).astype(np.float32), rtol=1e-4, atol=1e-4)


def test_conv_transpose2d_values(kael_device: Any) -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    w = rng.standard_normal((3, 2, 3, 3)).astype(np.float32)
    got = F.conv_transpose2d(_t(x, kael_device), _t(w, kael_device), stride=2, padding=1, output_padding=1)
    want = _conv_transpose2d_ref(x.astype(np.float64), w.astype(np.float64), 2, 1, 1)
    assert_close(got, want.astype(np.float32), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("k", "s", "p"), [(2, 2, 0), (3, 2, 1), (3, 1, 1)])
@pytest.mark.parametrize("kind", ["max", "avg"])
def test_pool2d_values(kael_device: Any, k: int, s: int, p: int, kind: str) -> None:
    x = np.random.default_rng(k + s + p).standard_normal((2, 3, 7, 8)).astype(np.float32)
    fn = F.max_pool2d if kind == "max" else F.avg_pool2d
    got = fn(_t(x, kael_device, transpose=True), k, s, p)
    assert_close(got, _pool2d_ref(x, k, s, p, kind).astype(np.float32), rtol=1e-5, atol=1e-6)


def test_adaptive_pool_and_bilinear_values(kael_device: Any) -> None:
    x = np.random.default_rng(2).standard_normal((1, 2, 6, 4)).astype(np.float32)
    assert_close(F.adaptive_avg_pool2d(_t(x, kael_device), (3, 2)), x.reshape(1, 2, 3, 2, 2, 2).mean((3, 5)), rtol=1e-5)
    got = F.interpolate(_t(x, kael_device), size=(9, 7), mode="bilinear", align_corners=True)
    assert_close(got, _bilinear_ref(x.astype(np.float64), 9, 7).astype(np.float32), rtol=1e-5, atol=1e-6)


def test_batch_norm_training_values(kael_device: Any) -> None:
    x = np.random.default_rng(3).standard_normal((4, 3, 2, 5)).astype(np.float32)
    rm = kael.zeros(3, device=kael_device)
    rv = kael.ones(3, device=kael_device)
    got = F.batch_norm(_t(x, kael_device), rm, rv, training=True, momentum=0.5)
    mean, var = x.mean((0, 2, 3)), x.var((0, 2, 3))
    want = (x - mean[:, None, None]) / np.sqrt(var[:, None, None] + 1e-5)
    assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert_close(rm, 0.5 * mean, rtol=1e-5, atol=1e-6)
    assert_close(rv, 0.5 + 0.5 * x.var((0, 2, 3), ddof=1), rtol=1e-5)


GRADS: dict[str, tuple[Callable[..., Any], list[tuple[int, ...]]]] = {
    "conv2d": (lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1, groups=2), [(1, 4, 5, 4), (2, 2, 3, 3), (2,)]),
    "conv2d_dilated": (lambda x, w: F.conv2d(x, w, padding="same", dilation=2), [(1, 2, 5, 5), (2, 2, 2, 3)]),
    "conv1d": (lambda x, w: F.conv1d(x, w, stride=2), [(2, 2, 7), (3, 2, 3)]),
    "conv_transpose2d": (
        lambda x, w: F.conv_transpose2d(x, w, stride=2, output_padding=1),
        [(1, 2, 3, 3), (2, 2, 2, 2)],
    ),
    "max_pool2d": (lambda x: F.max_pool2d(x, 3, 2, 1, ceil_mode=True), [(1, 2, 5, 6)]),
    "avg_pool2d": (lambda x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False), [(1, 2, 5, 6)]),
    "adaptive_avg_pool2d": (lambda x: F.adaptive_avg_pool2d(x, (2, 4)), [(1, 2, 5, 6)]),
    "bilinear": (lambda x: F.interpolate(x, scale_factor=1.5, mode="bilinear"), [(1, 1, 3, 4)]),
    "reflect_pad": (lambda x: F.pad(x, (2, 1, 1, 2), mode="reflect"), [(1, 1, 3, 4)]),
    "batch_norm": (lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True), [(3, 2, 2, 2), (2,), (2,)]),
    "group_norm": (lambda x, w, b: F.group_norm(x, 2, w, b), [(2, 4, 3), (4,), (4,)]),
}


@pytest.mark.parametrize("name", sorted(GRADS))
def test_gradcheck_float64(name: str, kael_device: Any) -> None:
    fn, shapes = GRADS[name]
    rng = np.random.default_rng(sum(map(ord, name)))
    inputs = [
        kael.tensor(rng.standard_normal(s), dtype=kael.float64, device=kael_device, requires_grad=True) for s in shapes
    ]
    gradcheck(fn, inputs, name=name)
