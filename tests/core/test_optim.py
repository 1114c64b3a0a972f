"""kael.optim: SGD, Adam, AdamW and the schedulers, step by step.

Updates are compared with PyTorch's optimizers on the same float64 parameters and
the same losses (when PyTorch is installed) and, always, with the closed-form
result of the first steps. AdamW's fused ``adamw_step`` runs through the backend
kernel and through its decomposition.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import kael
import numpy as np
import pytest
from kael import DTypeError, KaelError, ShapeError, nn, optim
from kael.backends.reference import ReferenceBackend
from kael.optim import lr_scheduler

P0 = [np.array([[0.5, -1.0, 2.0], [0.1, 0.0, -0.3]]), np.array([1.5, -0.7])]
W = [np.array([[1.0, 2.0, 0.5], [3.0, 1.0, 0.2]]), np.array([0.3, 4.0])]


def arr(x: Any) -> np.ndarray:
    return np.asarray(x.detach().numpy())


def kael_params() -> list[nn.Parameter]:
    return [nn.Parameter(kael.tensor(p, dtype=kael.float64)) for p in P0]


def loss_of(m: Any, params: list[Any]) -> Any:
    """A loss whose gradient changes from step to step: sum(w * p^2) + sum(sin(3 p))."""
    total = 0.0
    for p, w in zip(params, W):
        total = total + (p * p * m.tensor(w)).sum() + (p * 3.0).sin().sum()
    return total


def run_kael(make: Callable[[list[Any]], Any], steps: int) -> list[list[np.ndarray]]:
    params = kael_params()
    opt = make(params)
    out = []
    for _ in range(steps):
        opt.zero_grad()
        loss_of(kael, params).backward()
        opt.step()
        out.append([arr(p).copy() for p in params])
    return out


def run_torch(make: Callable[[list[Any]], Any], steps: int) -> list[list[np.ndarray]]:
    torch = pytest.importorskip("torch")
    params = [torch.tensor(p, requires_grad=True) for p in P0]
    opt = make(params)
    out = []
    for _ in range(steps):
        opt.zero_grad()
        loss_of(torch, params).backward()
        opt.step()
        out.append([p.detach().numpy().copy() for p in params])
    return out


CONFIGS = [
    ("SGD", dict(lr=0.1)),
    ("SGD", dict(lr=0.05, momentum=0.9)),
    ("SGD", dict(lr=0.05, momentum=0.9, dampening=0.3)),
    ("SGD", dict(lr=0.05, momentum=0.8, nesterov=True)),
    ("SGD", dict(lr=0.05, momentum=0.9, weight_decay=0.01, maximize=True)),
    ("SGD", dict(lr=0.1, weight_decay=0.1)),
    ("Adam", dict(lr=0.01)),
    ("Adam", dict(lr=0.02, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)),
    ("Adam", dict(lr=0.01, maximize=True)),
    ("AdamW", dict(lr=0.01)),
    ("AdamW", dict(lr=0.03, betas=(0.85, 0.99), weight_decay=0.3)),
]


@pytest.fixture(params=["fused_kernel", "decomposition"])
def fused_mode(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "fused_kernel":
        yield request.param
        return
    backend = ReferenceBackend(fused=False)
    backend.name = "reference_decomposition_optim"
    backend.priority = -1

    class Plugin:
        @kael.hookimpl
        def kael_backends(self) -> list[Any]:
            return [backend]

    kael.backends.register(Plugin(), "test_optim_decomposition")
    kael.backends.use("cpu", backend.name)
    try:
        yield request.param
    finally:
        kael.backends.use("cpu", None)
        from kael._plugins import manager

        manager.unregister("test_optim_decomposition")


@pytest.mark.parametrize(("name", "kw"), CONFIGS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CONFIGS)])
def test_matches_torch_step_by_step(name: str, kw: dict[str, Any], fused_mode: str) -> None:
    torch = pytest.importorskip("torch")
    ours = run_kael(lambda ps: getattr(optim, name)(ps, **kw), 6)
    theirs = run_torch(lambda ps: getattr(torch.optim, name)(ps, **kw), 6)
    for step, (a, b) in enumerate(zip(ours, theirs)):
        for i, (x, y) in enumerate(zip(a, b)):
            np.testing.assert_allclose(x, y, rtol=1e-12, atol=1e-14, err_msg=f"{name} {kw}: step {step} param {i}")


def _grads(params: list[np.ndarray]) -> list[np.ndarray]:
    return [2 * w * p + 3 * np.cos(3 * p) for p, w in zip(params, W)]


def test_sgd_closed_form() -> None:
    (p1,) = run_kael(lambda ps: optim.SGD(ps, lr=0.1), 1)
    for got, p, g in zip(p1, P0, _grads(P0)):
        np.testing.assert_allclose(got, p - 0.1 * g, rtol=1e-14)
    p1, p2 = run_kael(lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.5), 2)
    d1 = [g + 0.5 * p for g, p in zip(_grads(P0), P0)]
    e1 = [p - 0.1 * d for p, d in zip(P0, d1)]
    d2 = [0.9 * b + g + 0.5 * p for b, g, p in zip(d1, _grads(e1), e1)]
    for got, p, d in zip(p2, e1, d2):
        np.testing.assert_allclose(got, p - 0.1 * d, rtol=1e-13)


def test_adam_and_adamw_first_step_closed_form(fused_mode: str) -> None:
    # step 1: m_hat = g and v_hat = g^2, so the update is lr * g / (|g| + eps)
    (a1,) = run_kael(lambda ps: optim.Adam(ps, lr=0.01, eps=1e-8), 1)
    (w1,) = run_kael(lambda ps: optim.AdamW(ps, lr=0.01, eps=1e-8, weight_decay=0.5), 1)
    for got_a, got_w, p, g in zip(a1, w1, P0, _grads(P0)):
        np.testing.assert_allclose(got_a, p - 0.01 * g / (np.abs(g) + 1e-8), rtol=1e-12)
        np.testing.assert_allclose(got_w, p * (1 - 0.01 * 0.5) - 0.01 * g / (np.abs(g) + 1e-8), rtol=1e-12)


def test_adamw_state_counts_steps() -> None:
    params = kael_params()
    opt = optim.AdamW(params)
    for _ in range(3):
        opt.zero_grad()
        loss_of(kael, params).backward()
        opt.step()
    st = opt.state[params[0]]
    assert st["step"] == 3 and st["exp_avg"].shape == (2, 3) and st["exp_avg_sq"].dtype is kael.float64


def test_zero_grad_and_skipping_parameters_without_grad() -> None:
    a, b = nn.Parameter(kael.ones(2)), nn.Parameter(kael.ones(2))
    opt = optim.SGD([a, b], lr=1.0)
    (a * 3).sum().backward()
    opt.step()
    assert arr(a).tolist() == [-2.0, -2.0] and arr(b).tolist() == [1.0, 1.0] and b.grad is None
    opt.zero_grad(set_to_none=False)
    assert arr(a.grad).tolist() == [0.0, 0.0]
    opt.zero_grad()
    assert a.grad is None


def test_param_groups_have_their_own_hyper_parameters() -> None:
    a, b = nn.Parameter(kael.ones(1)), nn.Parameter(kael.ones(1))
    opt = optim.SGD([{"params": [a]}, {"params": b, "lr": 0.5}], lr=0.1, momentum=0.0)
    (a + b).sum().backward()
    opt.step()
    assert arr(a).item() == pytest.approx(0.9) and arr(b).item() == pytest.approx(0.5)
    assert opt.param_groups[1]["momentum"] == 0.0 and opt.param_groups[1]["lr"] == 0.5
    c = nn.Parameter(kael.ones(1))
    opt.add_param_group({"params": [c], "lr": 2.0})
    assert len(opt.param_groups) == 3
    with pytest.raises(KaelError, match="more than one place"):
        opt.add_param_group({"params": [a]})


def test_invalid_arguments() -> None:
    p = nn.Parameter(kael.ones(1))
    with pytest.raises(KaelError, match="empty parameter list"):
        optim.SGD([], lr=0.1)
    with pytest.raises(DTypeError, match="invalid lr: -1"):
        optim.SGD([p], lr=-1)
    with pytest.raises(DTypeError, match="invalid beta2: 1.0"):
        optim.Adam([p], betas=(0.9, 1.0))
    with pytest.raises(KaelError, match="Nesterov"):
        optim.SGD([p], lr=0.1, nesterov=True)
    with pytest.raises(KaelError, match="not a leaf"):
        optim.SGD([p * 2], lr=0.1)
    with pytest.raises(DTypeError, match="got a Tensor"):
        optim.SGD(p, lr=0.1)
    with pytest.raises(DTypeError, match="floating"):
        optim.SGD([kael.ones(2, dtype=kael.int64)], lr=0.1)


def test_step_with_closure_returns_the_loss() -> None:
    p = nn.Parameter(kael.tensor([2.0]))
    opt = optim.SGD([p], lr=0.25)

    def closure() -> kael.Tensor:
        opt.zero_grad()
        loss = (p * p).sum()
        loss.backward()
        return loss

    assert opt.step(closure).item() == 4.0 and arr(p).tolist() == [1.0]


@pytest.mark.parametrize("name", ["SGD", "Adam", "AdamW"])
def test_state_dict_round_trip_resumes_exactly(name: str) -> None:
    kw: dict[str, Any] = {"lr": 0.05, "momentum": 0.9} if name == "SGD" else {"lr": 0.05}
    straight = run_kael(lambda ps: getattr(optim, name)(ps, **kw), 5)[-1]

    params = kael_params()
    opt = getattr(optim, name)(params, **kw)
    for _ in range(3):
        opt.zero_grad()
        loss_of(kael, params).backward()
        opt.step()
    sd = opt.state_dict()
    assert sorted(sd["state"]) == [0, 1] and sd["param_groups"][0]["params"] == [0, 1]
    fresh = getattr(optim, name)(params, lr=123.0)
    fresh.load_state_dict(sd)
    assert fresh.param_groups[0]["lr"] == 0.05
    for k, v in sd["state"][0].items():  # loaded state is a copy
        if isinstance(v, kael.Tensor):
            assert fresh.state[params[0]][k]._storage is not v._storage
    for _ in range(2):
        fresh.zero_grad()
        loss_of(kael, params).backward()
        fresh.step()
    for x, y in zip([arr(p) for p in params], straight):
        np.testing.assert_array_equal(x, y)


def test_load_state_dict_checks_structure() -> None:
    a, b = nn.Parameter(kael.ones(2)), nn.Parameter(kael.ones(3))
    opt = optim.Adam([a, b])
    (a.sum() + b.sum()).backward()
    opt.step()
    sd = opt.state_dict()
    with pytest.raises(KaelError, match="group 0 has 2 parameters in the state dict but 1"):
        optim.Adam([a]).load_state_dict(sd)
    with pytest.raises(ShapeError, match="state 'exp_avg' of parameter 0 has shape \\[2\\]"):
        optim.Adam([nn.Parameter(kael.ones(4)), b]).load_state_dict(sd)
    with pytest.raises(DTypeError, match="state_dict"):
        opt.load_state_dict({"nope": 1})


# -- schedulers ---------------------------------------------------------------------------------


def _lrs(sched: Any, opt: Any, n: int) -> list[float]:
    out = []
    for _ in range(n):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def test_cosine_with_warmup_values() -> None:
    opt = optim.SGD([nn.Parameter(kael.ones(1))], lr=1.0)
    sched = lr_scheduler.CosineWithWarmupLR(opt, warmup_steps=4, total_steps=12, min_lr_ratio=0.1)
    got = _lrs(sched, opt, 14)
    expected = [s / 4 for s in range(4)]
    expected += [0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (s - 4) / 8)) for s in range(4, 13)]
    expected += [0.1]
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-15)
    assert got[4] == 1.0 and sched.get_last_lr() == [pytest.approx(0.1)]


def test_lambda_and_step_lr_match_torch() -> None:
    torch = pytest.importorskip("torch")
    f = lambda s: 0.9**s + 0.01 * s  # noqa: E731
    for make, tmake in (
        (lambda o: lr_scheduler.LambdaLR(o, f), lambda o: torch.optim.lr_scheduler.LambdaLR(o, f)),
        (lambda o: lr_scheduler.StepLR(o, 3, 0.5), lambda o: torch.optim.lr_scheduler.StepLR(o, 3, 0.5)),
    ):
        opt = optim.SGD([nn.Parameter(kael.ones(1))], lr=0.2)
        topt = torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.2)
        np.testing.assert_allclose(_lrs(make(opt), opt, 10), _lrs(tmake(topt), topt, 10), rtol=1e-12)


def test_scheduler_state_dict_and_groups() -> None:
    opt = optim.SGD(
        [{"params": [nn.Parameter(kael.ones(1))]}, {"params": [nn.Parameter(kael.ones(1))], "lr": 2.0}], lr=1.0
    )
    sched = lr_scheduler.LambdaLR(opt, [lambda s: 1.0 / (s + 1), lambda s: 0.5])
    sched.step()
    sched.step()
    assert [g["lr"] for g in opt.param_groups] == [pytest.approx(1 / 3), 1.0]
    sd = sched.state_dict()
    assert sd["last_epoch"] == 2 and "lr_lambdas" not in sd
    other = lr_scheduler.LambdaLR(optim.SGD([nn.Parameter(kael.ones(1))], lr=1.0), lambda s: 1.0 / (s + 1))
    other.load_state_dict({"last_epoch": 2})
    other.step()
    assert other.get_last_lr() == [pytest.approx(0.25)]
    with pytest.raises(KaelError, match="2 lr_lambdas for 1 parameter groups"):
        lr_scheduler.LambdaLR(optim.SGD([nn.Parameter(kael.ones(1))], lr=1.0), [f := (lambda s: 1.0), f])
