"""The Llama family's rope (rotary position embedding) against independent oracles.

A property test (hypothesis) over shapes, shared or per-row positions and a heads-last layout
checks rope against its float64 formula written here in NumPy, one element pair at a time,
forward and backward (the backward is the rotation by the opposite angle); Hugging Face's
``apply_rotary_pos_emb`` is the oracle in float32 and for the half-precision rounding. rope runs
on the default CPU backend, on the reference backend's fused kernels and as the decomposition on
a backend without fused kernels (``mode``); bad input raises a ``kael.KaelError`` subclass naming
the op and the offending value.
"""

from __future__ import annotations

from collections.abc import Iterator

import kael
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from llama_ops_common import MODES, backend_mode
from llama_ops_common import float64_of as _np
from llama_ops_common import tensor_of as _t


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> Iterator[str]:
    """The CPU backend as installed, the reference backend (fused host kernels), and one without fused kernels."""
    with backend_mode(request.param) as name:
        yield name


def _tables(p: int, half: int, base: float = 10000.0) -> tuple[np.ndarray, np.ndarray]:
    ang = np.arange(p)[:, None] * base ** (-np.arange(half) / half)
    return np.cos(ang), np.sin(ang)


# -- float64 formulas, written independently of kael ------------------------------------------------


def rope_ref(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """Pair (x[..., i], x[..., i + D/2]) rotated by the angle of (cos, sin)[pos, i], one element at a time."""
    b, h, t, d = x.shape
    out = np.empty_like(x)
    for bi, hi, ti, i in np.ndindex(b, h, t, d // 2):
        c, s = cos[pos[bi, ti], i], sin[pos[bi, ti], i]
        a, z = x[bi, hi, ti, i], x[bi, hi, ti, i + d // 2]
        out[bi, hi, ti, i] = a * c - z * s
        out[bi, hi, ti, i + d // 2] = z * c + a * s
    return out


# -- rope -----------------------------------------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(
    b=st.integers(1, 3),
    h=st.integers(1, 3),
    t=st.integers(1, 4),
    half=st.integers(1, 4),
    shared=st.booleans(),
    heads_last=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_rope_forward_and_backward_property(
    b: int, h: int, t: int, half: int, shared: bool, heads_last: bool, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    d, p = 2 * half, 7
    x = rng.standard_normal((b, h, t, d))
    cos, sin = _tables(p, half)
    pos = rng.integers(0, p, (t,) if shared else (b, t))
    pos_bt = np.broadcast_to(pos, (b, t))
    if heads_last:  # x viewed [B, H, T, D] from [B, T, H, D] storage, as a model splits heads
        src = _t(np.ascontiguousarray(x.transpose(0, 2, 1, 3)), True)
        kx = src.permute(0, 2, 1, 3)
    else:
        src = kx = _t(x, True)
    y = kael.rope(kx, _t(cos), _t(sin), kael.tensor(pos))
    assert y.shape == x.shape and y.dtype is kael.float64
    np.testing.assert_allclose(_np(y), rope_ref(x, cos, sin, pos_bt), rtol=1e-12, atol=1e-13)
    g = rng.standard_normal(x.shape)
    (y * _t(g)).sum().backward()
    # a rotation's transpose is the rotation by the opposite angle
    want = rope_ref(g, cos, -sin, pos_bt)
    got = _np(src.grad).transpose(0, 2, 1, 3) if heads_last else _np(src.grad)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_rope_matches_hugging_face_apply_rotary_pos_emb(dtype: str, mode: str) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    rng = np.random.default_rng(3)
    b, h, t, d, p = 2, 3, 5, 8, 12
    x = rng.standard_normal((b, h, t, d))
    pos = np.stack([np.arange(t), np.arange(4, 4 + t)])  # the second row continues a 4-token cache
    cos, sin = _tables(p, d // 2)
    c2 = torch.tensor(np.concatenate([cos, cos], -1)[pos], dtype=torch.float32)  # HF: [B, T, D]
    s2 = torch.tensor(np.concatenate([sin, sin], -1)[pos], dtype=torch.float32)
    tx = torch.tensor(x, dtype=torch.float32)
    want, _ = apply_rotary_pos_emb(tx, tx, c2, s2)
    kd = getattr(kael, dtype)
    got = kael.rope(
        kael.tensor(x, dtype=kd),
        kael.tensor(cos, dtype=kael.float32),
        kael.tensor(sin, dtype=kael.float32),
        kael.tensor(pos),
    )
    assert got.dtype is kd
    # computed in float32 from x rounded to dtype, rounded once at the end
    tol = {"float32": 1e-6, "bfloat16": 2 * 2.0**-8, "float16": 2 * 2.0**-11}[dtype]
    xr = _np(kael.tensor(x, dtype=kd))
    np.testing.assert_allclose(_np(got), rope_ref(xr, cos, sin, pos), rtol=tol, atol=tol)
    np.testing.assert_allclose(
        _np(
            kael.rope(
                kael.tensor(x, dtype=kael.float32),
                kael.tensor(cos, dtype=kael.float32),
                kael.tensor(sin, dtype=kael.float32),
                kael.tensor(pos),
            )
        ),
        want.numpy(),
        rtol=1e-5,
        atol=1e-6,
    )


def test_rope_positions_broadcast_without_copy_and_on_every_backend(mode: str) -> None:
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 2, 4, 6))
    cos, sin = _tables(10, 3)
    shared = kael.rope(_t(x), _t(cos), _t(sin), kael.arange(4))
    rows = kael.rope(_t(x), _t(cos), _t(sin), kael.tensor(np.tile(np.arange(4), (3, 1))))
    np.testing.assert_array_equal(_np(shared), _np(rows))
    np.testing.assert_allclose(
        _np(shared), rope_ref(x, cos, sin, np.tile(np.arange(4), (3, 1))), rtol=1e-12, atol=1e-13
    )
    assert kael.nn.functional.rope(_t(x), _t(cos), _t(sin), kael.arange(4)).shape == x.shape


def test_rope_bad_input_names_op_and_value() -> None:
    x = kael.randn(1, 2, 3, 4)
    cos, sin = kael.ones(8, 2), kael.zeros(8, 2)
    with pytest.raises(kael.IndexError_, match=r"rope: position 8 is out of range for tables of 8 positions"):
        kael.rope(x, cos, sin, kael.tensor([0, 1, 8]))
    with pytest.raises(kael.IndexError_, match="position -1"):
        kael.rope(x, cos, sin, kael.tensor([[0, -1, 2]]))
    with pytest.raises(kael.ShapeError, match=r"rope: x must be \[B, H, T, D\], got shape \[2, 3, 4\]"):
        kael.rope(kael.randn(2, 3, 4), cos, sin, kael.arange(3))
    with pytest.raises(kael.ShapeError, match="must be even, got 5"):
        kael.rope(kael.randn(1, 1, 3, 5), cos, sin, kael.arange(3))
    with pytest.raises(kael.ShapeError, match=r"cos must be \[P, D/2\] = \[P, 2\].*got \[8, 3\]"):
        kael.rope(x, kael.ones(8, 3), kael.ones(8, 3), kael.arange(3))
    with pytest.raises(kael.ShapeError, match=r"positions must be \[B, T\] = \[1, 3\] or \[T\] = \[3\], got \[4\]"):
        kael.rope(x, cos, sin, kael.arange(4))
    with pytest.raises(kael.DTypeError, match="positions must be an integer tensor"):
        kael.rope(x, cos, sin, kael.zeros(3))
    with pytest.raises(kael.DTypeError, match="cos must be a float32 or float64 table, got kael.float16"):
        kael.rope(x, cos.to(dtype=kael.float16), sin.to(dtype=kael.float16), kael.arange(3))
    with pytest.raises(kael.ShapeError, match="must have the same shape and dtype"):
        kael.rope(x, cos, kael.zeros(9, 2), kael.arange(3))
