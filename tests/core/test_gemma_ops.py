"""The Gemma family's fused ops gelu_tanh_mul (GeGLU) and softcap against independent oracles.

Property tests (hypothesis) over shapes, layouts (transposed, sliced with steps, broadcast)
and dtypes check each op against its float64 formula written here in NumPy, forward and
backward (the backward against the formula's derivative, written out by hand). PyTorch is the
oracle for the 16-bit rounding: ``gelu(gate, approximate="tanh") * up`` (Hugging Face's
``act_fn(gate) * up``) and ``(x / cap).tanh() * cap`` (Gemma 2's soft-capping). Every op runs on
the default CPU backend, on the reference backend's fused kernels and as the decompositions on
a backend without fused kernels (``mode``); bad input raises a ``kael.KaelError`` subclass naming
the op and the offending value.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import kael
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from llama_ops_common import MODES, backend_mode
from llama_ops_common import float64_of as _np
from llama_ops_common import tensor_of as _t

K = math.sqrt(2.0 / math.pi)
C = 0.044715
ULP = {"bfloat16": 2.0**-7, "float16": 2.0**-10}


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> Iterator[str]:
    """The CPU backend as installed, the reference backend (fused host kernels), and one without fused kernels."""
    with backend_mode(request.param) as name:
        yield name


# -- float64 formulas, written independently of kael ------------------------------------------------


def gelu_ref(g: np.ndarray) -> np.ndarray:
    return 0.5 * g * (1.0 + np.tanh(K * (g + C * g**3)))


def gelu_grad_ref(g: np.ndarray) -> np.ndarray:
    """d/dg of 0.5 g (1 + tanh(u)), u = K (g + C g^3): 0.5 (1 + t) + 0.5 g (1 - t^2) K (1 + 3 C g^2)."""
    t = np.tanh(K * (g + C * g**3))
    return 0.5 * (1.0 + t) + 0.5 * g * (1.0 - t * t) * K * (1.0 + 3.0 * C * g * g)


def softcap_ref(x: np.ndarray, cap: float) -> np.ndarray:
    return cap * np.tanh(x / cap)


_LAYOUTS = ["contiguous", "transposed", "stepped"]


def _laid_out(a: np.ndarray, layout: str, grad: bool = False, dtype: object = None) -> kael.Tensor:
    """A kael tensor with a's values in a non-contiguous layout (a leaf when grad: the view is taken first)."""
    if layout == "transposed" and a.ndim >= 2:
        t = _t(np.ascontiguousarray(np.swapaxes(a, 0, -1)), dtype=dtype).transpose(0, -1)
    elif layout == "stepped" and a.ndim >= 1:  # every other element of a twice-as-long last dim
        wide = np.zeros(a.shape[:-1] + (2 * a.shape[-1],))
        wide[..., ::2] = a
        t = _t(wide, dtype=dtype)[..., ::2]
    else:
        t = _t(a, dtype=dtype)
    return t.detach().requires_grad_(True) if grad else t


# -- gelu_tanh_mul --------------------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(
    shape=st.lists(st.integers(0, 5), min_size=0, max_size=3),
    broadcast=st.sampled_from(["none", "up", "gate"]),
    layout=st.sampled_from(_LAYOUTS),
    scale=st.sampled_from([1.0, 8.0]),
    seed=st.integers(0, 2**16),
)
def test_gelu_tanh_mul_forward_and_backward_property(
    shape: list[int], broadcast: str, layout: str, scale: float, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    full = tuple(shape)
    sg = full[-1:] if broadcast == "gate" and full else full
    su = full[-1:] if broadcast == "up" and full else full
    g, u = rng.standard_normal(sg) * scale, rng.standard_normal(su)
    kg, ku = _laid_out(g, layout, True), _t(u, True)
    y = kael.gelu_tanh_mul(kg, ku)
    assert y.shape == full and y.dtype is kael.float64
    # atol: for gate << 0, 1 + tanh(u) cancels in float64 as in any formula of this form
    np.testing.assert_allclose(_np(y), gelu_ref(g) * u, rtol=1e-12, atol=1e-14)
    go = rng.standard_normal(full)
    (y * _t(go)).sum().backward()
    dg = go * u * gelu_grad_ref(g)
    du = go * gelu_ref(g)
    if sg != full:  # a broadcast operand's gradient sums over the leading dims
        dg = dg.sum(axis=tuple(range(dg.ndim - len(sg))))
    if su != full:
        du = du.sum(axis=tuple(range(du.ndim - len(su))))
    np.testing.assert_allclose(_np(kg.grad), dg, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(_np(ku.grad), du, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16", "float16"])
@pytest.mark.parametrize("layout", _LAYOUTS)
def test_gelu_tanh_mul_on_every_backend_dtype_and_layout(dtype: str, layout: str, mode: str) -> None:
    rng = np.random.default_rng(5)
    g, u = rng.standard_normal((3, 7)) * 4, rng.standard_normal((3, 7))
    kd = getattr(kael, dtype)
    kg, ku = _laid_out(g, layout, dtype=kd), _laid_out(u, layout, dtype=kd)
    y = kael.nn.functional.gelu_tanh_mul(kg, ku)
    assert y.dtype is kd and y.shape == (3, 7)
    tol = {"float64": 1e-13, "float32": 2e-6, "bfloat16": 1.6e-2, "float16": 3e-3}[dtype]
    np.testing.assert_allclose(_np(y), gelu_ref(_np(kg)) * _np(ku), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_gelu_tanh_mul_half_rounds_like_hugging_face_act_fn_then_mul(dtype: str, mode: str) -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(6)
    g, u = rng.standard_normal((8, 64)) * 3, rng.standard_normal((8, 64))
    td, kd = getattr(torch, dtype), getattr(kael, dtype)
    tg = torch.tensor(g, dtype=td)
    want = (torch.nn.functional.gelu(tg, approximate="tanh") * torch.tensor(u, dtype=td)).double().numpy()
    got = _np(kael.gelu_tanh_mul(kael.tensor(g, dtype=kd), kael.tensor(u, dtype=kd)))
    # torch's float32 gelu cancels in 1 + tanh(u) for gate < -3 (kael's kernels keep those digits): compare the
    # rest bit for bit but for a few float32 tanh ulps that move a 16-bit rounding, and all within an ulp
    ok = _np(kael.tensor(g, dtype=kd)) > -3
    assert np.mean(got[ok] == want[ok]) > 0.97
    np.testing.assert_allclose(got, want, rtol=ULP[dtype], atol=1e-4)


def test_gelu_tanh_mul_bad_input() -> None:
    with pytest.raises(kael.DTypeError, match="gelu_tanh_mul: gate is kael.float32 but up is kael.float64"):
        kael.gelu_tanh_mul(kael.ones(2), kael.ones(2, dtype=kael.float64))
    with pytest.raises(kael.ShapeError, match="gelu_tanh_mul: shapes"):
        kael.gelu_tanh_mul(kael.ones(2, 3), kael.ones(4))
    with pytest.raises(kael.DTypeError, match="gelu_tanh_mul: up must be a floating-point tensor"):
        kael.gelu_tanh_mul(kael.ones(2), kael.ones(2, dtype=kael.int64))
    with pytest.raises(kael.DTypeError, match="gelu_tanh_mul: gate must be a tensor, got list"):
        kael.gelu_tanh_mul([1.0], kael.ones(1))  # type: ignore[arg-type]


# -- softcap --------------------------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(
    shape=st.lists(st.integers(0, 5), min_size=0, max_size=3),
    layout=st.sampled_from(_LAYOUTS),
    cap=st.sampled_from([0.25, 1.0, 30.0, 50.0]),
    scale=st.sampled_from([1.0, 40.0]),
    seed=st.integers(0, 2**16),
)
def test_softcap_forward_and_backward_property(
    shape: list[int], layout: str, cap: float, scale: float, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(tuple(shape)) * scale
    kx = _laid_out(x, layout, True)
    y = kael.softcap(kx, cap)
    assert y.shape == x.shape and y.dtype is kael.float64
    np.testing.assert_allclose(_np(y), softcap_ref(x, cap), rtol=1e-13, atol=1e-300)
    assert np.all(np.abs(_np(y)) <= cap)
    go = rng.standard_normal(x.shape)
    (y * _t(go)).sum().backward()
    # the derivative as sech^2 (no cancellation); the backward's 1 - tanh^2 (PyTorch's tanh backward) cancels where
    # |x| >> cap, to within a few float64 ulps of 1 (atol)
    with np.errstate(over="ignore"):  # cosh overflowing to inf: a derivative of 0, as it should be
        want = go / np.cosh(x / cap) ** 2
    np.testing.assert_allclose(_np(kx.grad), want, rtol=1e-10, atol=1e-15 * np.abs(go).max(initial=0))


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16", "float16"])
@pytest.mark.parametrize("layout", _LAYOUTS)
def test_softcap_on_every_backend_dtype_and_layout(dtype: str, layout: str, mode: str) -> None:
    rng = np.random.default_rng(7)
    x = rng.standard_normal((4, 9)) * 60
    kd = getattr(kael, dtype)
    kx = _laid_out(x, layout, dtype=kd)
    y = kael.nn.functional.softcap(kx, 50.0)
    assert y.dtype is kd and y.shape == (4, 9)
    tol = {"float64": 1e-13, "float32": 1e-6, "bfloat16": 2e-2, "float16": 3e-3}[dtype]
    np.testing.assert_allclose(_np(y), softcap_ref(_np(kx), 50.0), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("cap", [50.0, 30.0, 0.3, 7.0])
def test_softcap_half_rounds_like_torch_div_tanh_mul(dtype: str, cap: float, mode: str) -> None:
    """16-bit floats round after x / cap, after tanh and after * cap, as Gemma 2's ``(x / cap).tanh() * cap``."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(8)
    x = rng.standard_normal((8, 128)) * 40
    td, kd = getattr(torch, dtype), getattr(kael, dtype)
    want = ((torch.tensor(x, dtype=td) / cap).tanh() * cap).double().numpy()
    got = _np(kael.softcap(kael.tensor(x, dtype=kd), cap))
    if mode == "default":  # the C++ kernel's float32 tanh may move a 16-bit rounding now and then
        assert np.mean(got == want) > 0.99
        np.testing.assert_allclose(got, want, rtol=ULP[dtype], atol=0)
    else:  # the reference kernel and the decomposition round exactly where torch does
        np.testing.assert_array_equal(got, want)
    # one rounding fewer would differ: cap * tanh(x / cap) computed in float32 and rounded once
    once = kael.tensor(cap * np.tanh(_np(kael.tensor(x, dtype=kd)).astype(np.float32) / np.float32(cap)), dtype=kd)
    assert not np.array_equal(_np(once), want) or cap == 0.3


def test_softcap_float32_matches_torch() -> None:
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(9).standard_normal((16, 33)).astype(np.float32) * 30
    want = ((torch.tensor(x) / 30.0).tanh() * 30.0).double().numpy()
    np.testing.assert_allclose(_np(kael.softcap(kael.tensor(x), 30.0)), want, rtol=1e-6, atol=1e-6)


def test_softcap_bad_input() -> None:
    x = kael.ones(2, 3)
    for cap in (0.0, -1.0, -0.0, math.inf, -math.inf, math.nan, 0, -3, 10**400):
        with pytest.raises(kael.KaelError, match=f"softcap: cap must be a positive finite number, got {cap!r}"):
            kael.softcap(x, cap)
    for cap in (True, "30", None, kael.tensor(30.0)):
        with pytest.raises(kael.DTypeError, match="softcap: cap must be a number, got"):
            kael.softcap(x, cap)  # type: ignore[arg-type]
    with pytest.raises(kael.DTypeError, match="softcap: x must be a floating-point tensor, got kael.int64"):
        kael.softcap(kael.ones(2, dtype=kael.int64), 1.0)
    with pytest.raises(kael.DTypeError, match="softcap: x must be a tensor, got ndarray"):
        kael.softcap(np.ones(2), 1.0)  # type: ignore[arg-type]
    assert kael.softcap(x, 3).dtype is kael.float32  # an int cap is a number too
