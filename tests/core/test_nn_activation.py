"""kael.nn activations (modules and functional forms) against PyTorch: values, gradients, gradcheck, errors."""

from __future__ import annotations

from collections.abc import Callable
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

# (kael module factory, torch module factory), same arguments
CASES: dict[str, tuple[Callable[[], Any], Callable[[], Any]]] = {
    "Tanh": (nn.Tanh, torch.nn.Tanh),
    "Sigmoid": (nn.Sigmoid, torch.nn.Sigmoid),
    "Softmax1": (lambda: nn.Softmax(1), lambda: torch.nn.Softmax(1)),
    "Softmax-last": (lambda: nn.Softmax(-1), lambda: torch.nn.Softmax(-1)),
    "LogSoftmax1": (lambda: nn.LogSoftmax(1), lambda: torch.nn.LogSoftmax(1)),
    "LeakyReLU": (nn.LeakyReLU, torch.nn.LeakyReLU),
    "LeakyReLU0.2": (lambda: nn.LeakyReLU(0.2), lambda: torch.nn.LeakyReLU(0.2)),
    "ELU": (nn.ELU, torch.nn.ELU),
    "ELU0.5": (lambda: nn.ELU(alpha=0.5), lambda: torch.nn.ELU(alpha=0.5)),
    "Softplus": (nn.Softplus, torch.nn.Softplus),
    "Softplus-beta": (lambda: nn.Softplus(beta=2.0, threshold=3.0), lambda: torch.nn.Softplus(2.0, 3.0)),
    "Mish": (nn.Mish, torch.nn.Mish),
    "Hardswish": (nn.Hardswish, torch.nn.Hardswish),
    "Hardsigmoid": (nn.Hardsigmoid, torch.nn.Hardsigmoid),
    "Hardtanh": (nn.Hardtanh, torch.nn.Hardtanh),
    "Hardtanh-2": (lambda: nn.Hardtanh(-2.0, 0.5), lambda: torch.nn.Hardtanh(-2.0, 0.5)),
    "ReLU6": (nn.ReLU6, torch.nn.ReLU6),
    "ReLU": (nn.ReLU, torch.nn.ReLU),
    "GELU": (nn.GELU, torch.nn.GELU),
    "GELU-tanh": (lambda: nn.GELU("tanh"), lambda: torch.nn.GELU("tanh")),
    "SiLU": (nn.SiLU, torch.nn.SiLU),
    "Softsign": (nn.Softsign, torch.nn.Softsign),
    "LogSigmoid": (nn.LogSigmoid, torch.nn.LogSigmoid),
    "PReLU": (nn.PReLU, torch.nn.PReLU),
    "PReLU3": (lambda: nn.PReLU(3, init=0.1), lambda: torch.nn.PReLU(3, init=0.1)),
}


def _pair(name: str) -> tuple[Any, Any]:
    km, tm = CASES[name]
    k, t = km(), tm()
    if isinstance(k, nn.PReLU):  # distinct slopes per channel, shared by both
        w = np.linspace(-0.5, 0.7, k.weight.numel()).astype(np.float32)
        k.load_state_dict({"weight": kael.tensor(w)})
        t.load_state_dict({"weight": torch.tensor(w)})
    return k, t


def _check(name: str, x: np.ndarray, transpose: bool = False, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    k, t = _pair(name)
    kx = kael.tensor(x, requires_grad=True)
    tx = torch.tensor(x, requires_grad=True)
    kin, tin = (kx.mT, tx.mT) if transpose else (kx, tx)
    ky, ty = k(kin), t(tin)
    np.testing.assert_allclose(ky.detach().numpy(), ty.detach().numpy(), rtol=rtol, atol=atol)
    g = np.cos(np.arange(ty.numel(), dtype=np.float32)).reshape(ty.shape)
    (ky * kael.tensor(g)).sum().backward()
    (ty * torch.tensor(g)).sum().backward()
    np.testing.assert_allclose(kx.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", sorted(CASES))
def test_values_and_grads_match_torch(name: str) -> None:
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((4, 3, 5)) * 4).astype(np.float32)
    x[0, 0, :3] = [0.0, 25.0, -30.0]  # a kink, softplus's linear part and a large negative
    _check(name, x)


@pytest.mark.parametrize("name", ["Tanh", "ELU", "Softplus", "Mish", "Hardswish", "LogSoftmax1", "PReLU3", "GELU"])
def test_non_contiguous_and_batch_one_and_empty(name: str) -> None:
    rng = np.random.default_rng(1)
    _check(name, rng.standard_normal((1, 2, 3)).astype(np.float32), transpose=True)
    _check(name, rng.standard_normal((1, 3)).astype(np.float32))
    _check(name, np.zeros((0, 3, 2), np.float32))


@settings(max_examples=20, deadline=None)
@given(
    name=st.sampled_from(sorted(CASES)),
    shape=st.lists(st.integers(1, 4), min_size=2, max_size=3),
    scale=st.floats(0.1, 30.0),
    seed=st.integers(0, 2**16),
)
def test_random_shapes(name: str, shape: list[int], scale: float, seed: int) -> None:
    if name.startswith("PReLU3"):
        shape[1] = 3
    x = (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)
    # atol: the CPU backend's fused log_softmax rounds log(1 + tiny) to float32 (a few 1e-6 absolute)
    _check(name, x, rtol=2e-5, atol=1e-5)


@pytest.mark.parametrize(
    "fn",
    [
        F.tanh,
        F.sigmoid,
        lambda x: F.softmax(x, 0),
        lambda x: F.log_softmax(x, 1),
        lambda x: F.leaky_relu(x, 0.3),
        lambda x: F.elu(x, 0.7),
        lambda x: F.softplus(x, 1.5, 2.0),
        F.mish,
        F.hardswish,
        F.hardsigmoid,
        lambda x: F.hardtanh(x, -0.5, 0.8),
        F.softsign,
        F.logsigmoid,
        lambda x: F.gelu(x, "none"),
        lambda x: F.prelu(x, kael.tensor([0.1, -0.2, 0.3], dtype=kael.float64, requires_grad=True)),
    ],
)
def test_gradcheck_float64(fn: Callable[[kael.Tensor], kael.Tensor]) -> None:
    # points away from the kinks at 0, +-3 and the clip bounds
    x = np.array([[-2.3, -0.9, 0.35], [1.1, 2.2, -0.25], [0.7, -1.7, 4.5]], np.float64)
    assert gradcheck(fn, [kael.tensor(x, requires_grad=True)])


def test_functional_forms_match_torch() -> None:
    x = np.random.default_rng(2).standard_normal((3, 4)).astype(np.float32) * 3
    kx, tx = kael.tensor(x), torch.tensor(x)
    tf = torch.nn.functional
    pairs = [
        (F.relu6(kx), tf.relu6(tx)),
        (F.softmax(kx, None), tf.softmax(tx, 1)),
        (F.log_softmax(kx, 0, dtype=kael.float64), tf.log_softmax(tx, 0, dtype=torch.float64)),
        (F.elu(kx), tf.elu(tx)),
        (F.softplus(kx, beta=0.5), tf.softplus(tx, beta=0.5)),
        (F.leaky_relu(kx), tf.leaky_relu(tx)),
        (F.softsign(kx), tf.softsign(tx)),
    ]
    for k, t in pairs:
        np.testing.assert_allclose(k.numpy(), t.numpy(), rtol=1e-5, atol=1e-6)


def test_inplace_overwrites_input() -> None:
    x = np.array([-2.0, -0.5, 0.5, 7.0], np.float32)
    for kf, tf in [
        (lambda t: F.leaky_relu(t, 0.1, inplace=True), lambda t: torch.nn.functional.leaky_relu(t, 0.1, True)),
        (lambda t: F.relu6(t, inplace=True), lambda t: torch.nn.functional.relu6(t, True)),
        (lambda t: F.elu(t, inplace=True), lambda t: torch.nn.functional.elu(t, inplace=True)),
    ]:
        kx, tx = kael.tensor(x), torch.tensor(x)
        out = kf(kx)
        tf(tx)
        assert out is kx
        np.testing.assert_allclose(kx.numpy(), tx.numpy(), rtol=1e-6)


def test_prelu_state_dict_key_and_repr() -> None:
    m = nn.PReLU(4)
    assert list(m.state_dict()) == ["weight"] == list(torch.nn.PReLU(4).state_dict())
    np.testing.assert_allclose(m.weight.detach().numpy(), np.full(4, 0.25, np.float32))
    assert repr(m) == repr(torch.nn.PReLU(4))
    assert repr(nn.LeakyReLU(0.2)) == repr(torch.nn.LeakyReLU(0.2))
    assert repr(nn.Softplus(2.0, 10.0)) == repr(torch.nn.Softplus(2.0, 10.0))
    assert repr(nn.Hardtanh(-2.0, 2.0)) == repr(torch.nn.Hardtanh(-2.0, 2.0))


def test_bad_arguments_raise_kael_errors() -> None:
    x = kael.ones(2, 3)
    with pytest.raises(KaelError, match="weight has 2 parameters"):
        F.prelu(x, kael.ones(2))
    with pytest.raises(KaelError, match="min_val"):
        nn.Hardtanh(1.0, -1.0)
    with pytest.raises(KaelError, match="negative_slope"):
        F.leaky_relu(x, "a")  # type: ignore[arg-type]
    with pytest.raises(KaelError, match="num_parameters"):
        nn.PReLU(0)
    with pytest.raises(KaelError, match="approximate"):
        nn.GELU("fast")
    with pytest.raises(KaelError, match="input must be a tensor"):
        F.tanh([1.0])  # type: ignore[arg-type]
    with pytest.raises(KaelError, match="floating-point"):
        F.softmax(kael.ones(3, dtype=kael.int64), 0)


def test_functional_signatures_match_torch() -> None:
    import inspect

    for name in ["softmax", "log_softmax", "leaky_relu", "elu", "hardtanh", "relu6", "mish", "hardswish", "silu"]:
        ours = list(inspect.signature(getattr(F, name)).parameters)
        theirs = list(inspect.signature(getattr(torch.nn.functional, name)).parameters)
        assert ours == theirs, name
