"""RMSprop, Adagrad, Adam/AdamW with amsgrad, state dict round trips and nn.utils vector helpers, against PyTorch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import kael
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kael import KaelError, nn, optim
from kael.nn.utils import parameters_to_vector, vector_to_parameters

CONFIGS: list[tuple[str, dict[str, Any]]] = [
    ("RMSprop", {}),
    ("RMSprop", {"lr": 0.05, "alpha": 0.9, "eps": 1e-6, "weight_decay": 0.1}),
    ("RMSprop", {"lr": 0.02, "momentum": 0.8}),
    ("RMSprop", {"lr": 0.02, "momentum": 0.5, "centered": True, "weight_decay": 0.01}),
    ("RMSprop", {"lr": 0.01, "centered": True, "maximize": True}),
    ("Adagrad", {}),
    ("Adagrad", {"lr": 0.1, "lr_decay": 0.05, "weight_decay": 0.1, "initial_accumulator_value": 0.3, "eps": 1e-6}),
    ("Adam", {"amsgrad": True}),
    ("Adam", {"lr": 0.05, "amsgrad": True, "weight_decay": 0.1, "betas": (0.8, 0.9)}),
    ("AdamW", {"lr": 0.05, "amsgrad": True}),
    ("AdamW", {"lr": 0.05, "amsgrad": False, "weight_decay": 0.2}),
]


def _run(name: str, kw: dict[str, Any], steps: int, seed: int = 0) -> tuple[list[np.ndarray], list[np.ndarray], Any]:
    rng = np.random.default_rng(seed)
    inits = [rng.standard_normal((3, 2)).astype(np.float32), rng.standard_normal(4).astype(np.float32)]
    grads = [[rng.standard_normal(a.shape).astype(np.float32) for a in inits] for _ in range(steps)]
    kp = [kael.tensor(a, requires_grad=True) for a in inits]
    tp = [torch.tensor(a, requires_grad=True) for a in inits]
    ko = getattr(optim, name)(kp, **kw)
    to = getattr(torch.optim, name)(tp, **kw)
    for gs in grads:
        for p, q, g in zip(kp, tp, gs):
            p.grad, q.grad = kael.tensor(g), torch.tensor(g)
        ko.step()
        to.step()
    return [p.detach().numpy() for p in kp], [q.detach().numpy() for q in tp], (ko, to)


@pytest.mark.parametrize(("name", "kw"), CONFIGS)
def test_updates_match_torch(name: str, kw: dict[str, Any]) -> None:
    k, t, (ko, to) = _run(name, kw, steps=6)
    for a, b in zip(k, t):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)
    # the state has PyTorch's keys and values
    for kp, tp in zip(ko.param_groups[0]["params"], to.param_groups[0]["params"]):
        ks, ts = ko.state[kp], to.state[tp]
        assert set(ks) == set(ts)
        for key, v in ts.items():
            if key == "step":
                assert int(ks[key]) == int(v)
            else:
                np.testing.assert_allclose(ks[key].numpy(), v.numpy(), rtol=2e-5, atol=2e-6)


@settings(max_examples=10, deadline=None)
@given(config=st.sampled_from(CONFIGS), steps=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_random_gradients(config: tuple[str, dict[str, Any]], steps: int, seed: int) -> None:
    k, t, _ = _run(*config, steps=steps, seed=seed)
    for a, b in zip(k, t):
        np.testing.assert_allclose(a, b, rtol=5e-5, atol=5e-6)


@pytest.mark.parametrize(("name", "kw"), [CONFIGS[3], CONFIGS[6], CONFIGS[8]])
def test_state_dict_round_trip(name: str, kw: dict[str, Any]) -> None:
    rng = np.random.default_rng(1)
    w0 = rng.standard_normal(5).astype(np.float32)
    grads = [rng.standard_normal(5).astype(np.float32) for _ in range(6)]

    def make() -> tuple[kael.Tensor, Any]:
        p = kael.tensor(w0, requires_grad=True)
        return p, getattr(optim, name)([p], **kw)

    p1, o1 = make()
    for g in grads:
        p1.grad = kael.tensor(g)
        o1.step()
    p2, o2 = make()
    for g in grads[:3]:
        p2.grad = kael.tensor(g)
        o2.step()
    p3, o3 = make()
    with kael.no_grad():
        p3.copy_(p2)
    o3.load_state_dict(o2.state_dict())
    assert o3.param_groups[0]["lr"] == o2.param_groups[0]["lr"]
    for g in grads[3:]:
        p3.grad = kael.tensor(g)
        o3.step()
    np.testing.assert_allclose(p3.detach().numpy(), p1.detach().numpy(), rtol=1e-6)


def test_trains_a_model() -> None:
    rng = np.random.default_rng(2)
    x = kael.tensor(rng.standard_normal((32, 3)).astype(np.float32))
    y = x @ kael.tensor([[1.0], [-2.0], [0.5]])
    for make in (
        lambda ps: optim.RMSprop(ps, lr=0.01, momentum=0.5),
        lambda ps: optim.Adagrad(ps, lr=0.3),
        lambda ps: optim.Adam(ps, lr=0.05, amsgrad=True),
    ):
        kael.manual_seed(0)
        m = nn.Linear(3, 1)
        o = make(m.parameters())
        first = None
        for _ in range(60):
            loss = nn.functional.mse_loss(m(x), y)
            first = first if first is not None else loss.item()
            o.zero_grad()
            loss.backward()
            o.step()
        assert loss.item() < 0.05 * first


def test_bad_hyper_parameters() -> None:
    p = [kael.zeros(2, requires_grad=True)]
    bad: list[Callable[[], Any]] = [
        lambda: optim.RMSprop(p, alpha=-0.1),
        lambda: optim.RMSprop(p, momentum=-1.0),
        lambda: optim.Adagrad(p, lr_decay=-1.0),
        lambda: optim.Adagrad(p, initial_accumulator_value=-1.0),
        lambda: optim.Adam(p, betas=(1.0, 0.9), amsgrad=True),
    ]
    for make in bad:
        with pytest.raises(KaelError):
            make()


def test_parameters_to_vector_round_trip() -> None:
    m, tm = nn.Linear(3, 2), torch.nn.Linear(3, 2)
    tm.load_state_dict({k: torch.tensor(v.numpy()) for k, v in m.state_dict().items()})
    v = parameters_to_vector(m.parameters())
    tv = torch.nn.utils.parameters_to_vector(tm.parameters())
    np.testing.assert_allclose(v.detach().numpy(), tv.detach().numpy())
    new = np.arange(8, dtype=np.float32)
    vector_to_parameters(kael.tensor(new), m.parameters())
    torch.nn.utils.vector_to_parameters(torch.tensor(new), tm.parameters())
    for k, t in zip(m.parameters(), tm.parameters()):
        np.testing.assert_allclose(k.detach().numpy(), t.detach().numpy())
    (v * kael.tensor(new)).sum().backward()  # differentiable back to the parameters
    np.testing.assert_allclose(m.weight.grad.numpy().ravel(), new[:6])
    with pytest.raises(KaelError, match="vec has 3 elements"):
        vector_to_parameters(kael.zeros(3), m.parameters())
    with pytest.raises(KaelError, match="1-d"):
        vector_to_parameters(kael.zeros(2, 4), m.parameters())
