"""kael.nn losses (modules and functional forms) against PyTorch: values, gradients, gradcheck, errors."""

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
REDUCTIONS = ["mean", "sum", "none"]


def _both(*arrays: np.ndarray, grad: tuple[int, ...] = (0,)) -> tuple[list[Any], list[Any]]:
    ks = [kael.tensor(a, requires_grad=i in grad and a.dtype.kind == "f") for i, a in enumerate(arrays)]
    ts = [torch.tensor(a, requires_grad=i in grad and a.dtype.kind == "f") for i, a in enumerate(arrays)]
    return ks, ts


def _compare(kout: Any, tout: Any, kins: list[Any], tins: list[Any], rtol: float = 1e-5) -> None:
    np.testing.assert_allclose(kout.detach().numpy(), tout.detach().numpy(), rtol=rtol, atol=1e-6)
    if tout.numel() == 0 or not tout.requires_grad:
        return
    g = np.cos(np.arange(tout.numel(), dtype=np.float32) + 0.5).reshape(tout.shape).astype(np.float32)
    (kout * kael.tensor(g)).sum().backward()
    (tout * torch.tensor(g)).sum().backward()
    for k, t in zip(kins, tins):
        if t.grad is not None:
            np.testing.assert_allclose(k.grad.numpy(), t.grad.numpy(), rtol=1e-4, atol=1e-6)


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("smoothing", [0.0, 0.2])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("shape", [(5, 4), (3, 4, 2, 2), (4,)])
def test_cross_entropy_class_indices(reduction: str, smoothing: float, weighted: bool, shape: tuple[int, ...]) -> None:
    rng = _rng(1)
    x = rng.standard_normal(shape).astype(np.float32)
    c = shape[1] if len(shape) > 1 else shape[0]
    tshape = (shape[0],) + shape[2:] if len(shape) > 1 else ()
    y = rng.integers(0, c, tshape).astype(np.int64)
    if y.ndim and y.size > 1:
        y.flat[1] = -100  # ignored
    w = rng.uniform(0.2, 2.0, c).astype(np.float32)
    (kx, ky), (tx, ty) = _both(x, y)
    kw, tw = (kael.tensor(w), torch.tensor(w)) if weighted else (None, None)
    k = nn.CrossEntropyLoss(weight=kw, reduction=reduction, label_smoothing=smoothing)(kx, ky)
    t = torch.nn.CrossEntropyLoss(weight=tw, reduction=reduction, label_smoothing=smoothing)(tx, ty)
    _compare(k, t, [kx], [tx])


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("weighted", [False, True])
def test_cross_entropy_probabilities(reduction: str, smoothing: float, weighted: bool) -> None:
    rng = _rng(2)
    x = rng.standard_normal((3, 5, 2)).astype(np.float32)
    p = rng.uniform(0, 1, (3, 5, 2)).astype(np.float32)
    p /= p.sum(1, keepdims=True)
    w = rng.uniform(0.2, 2.0, 5).astype(np.float32)
    (kx, kp), (tx, tp) = _both(x, p, grad=(0, 1))
    kw, tw = (kael.tensor(w), torch.tensor(w)) if weighted else (None, None)
    k = F.cross_entropy(kx, kp, weight=kw, reduction=reduction, label_smoothing=smoothing)
    t = TF.cross_entropy(tx, tp, weight=tw, reduction=reduction, label_smoothing=smoothing)
    _compare(k, t, [kx, kp], [tx, tp])


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("weighted", [False, True])
def test_nll_loss(reduction: str, weighted: bool) -> None:
    rng = _rng(3)
    x = TF.log_softmax(torch.tensor(rng.standard_normal((6, 4, 3)).astype(np.float32)), 1).numpy()
    y = rng.integers(0, 4, (6, 3)).astype(np.int64)
    y[2, 1] = 7  # ignore_index below
    w = rng.uniform(0.2, 2.0, 4).astype(np.float32)
    (kx, ky), (tx, ty) = _both(x, y)
    kw, tw = (kael.tensor(w), torch.tensor(w)) if weighted else (None, None)
    k = nn.NLLLoss(weight=kw, ignore_index=7, reduction=reduction)(kx, ky)
    t = torch.nn.NLLLoss(weight=tw, ignore_index=7, reduction=reduction)(tx, ty)
    _compare(k, t, [kx], [tx])


def _elementwise_losses() -> list[tuple[str, Any, Any]]:
    return [
        ("mse", lambda r: nn.MSELoss(reduction=r), lambda r: torch.nn.MSELoss(reduction=r)),
        ("l1", lambda r: nn.L1Loss(reduction=r), lambda r: torch.nn.L1Loss(reduction=r)),
        ("smoothl1", lambda r: nn.SmoothL1Loss(reduction=r), lambda r: torch.nn.SmoothL1Loss(reduction=r)),
        (
            "smoothl1-b",
            lambda r: nn.SmoothL1Loss(reduction=r, beta=0.3),
            lambda r: torch.nn.SmoothL1Loss(reduction=r, beta=0.3),
        ),
        (
            "smoothl1-0",
            lambda r: nn.SmoothL1Loss(reduction=r, beta=0.0),
            lambda r: torch.nn.SmoothL1Loss(reduction=r, beta=0.0),
        ),
        ("huber", lambda r: nn.HuberLoss(r), lambda r: torch.nn.HuberLoss(reduction=r)),
        ("huber-d", lambda r: nn.HuberLoss(r, 2.5), lambda r: torch.nn.HuberLoss(reduction=r, delta=2.5)),
    ]


@settings(max_examples=30, deadline=None)
@given(
    case=st.sampled_from(_elementwise_losses()),
    reduction=st.sampled_from(REDUCTIONS),
    shape=st.lists(st.integers(0, 4), min_size=1, max_size=3),
    transpose=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_elementwise_losses(case: Any, reduction: str, shape: list[int], transpose: bool, seed: int) -> None:
    _, km, tm = case
    rng = _rng(seed)
    x = (rng.standard_normal(shape) * 2).astype(np.float32)
    y = (rng.standard_normal(shape) * 2).astype(np.float32)
    (kx, ky), (tx, ty) = _both(x, y, grad=(0, 1))
    kin, tin = (kx.mT, tx.mT) if transpose and x.ndim >= 2 else (kx, tx)
    kt, tt = (ky.mT, ty.mT) if transpose and x.ndim >= 2 else (ky, ty)
    _compare(km(reduction)(kin, kt), tm(reduction)(tin, tt), [kx, ky], [tx, ty])


def test_elementwise_losses_broadcast_target() -> None:
    rng = _rng(4)
    x = rng.standard_normal((3, 4)).astype(np.float32)
    y = rng.standard_normal((4,)).astype(np.float32)
    for _, km, tm in _elementwise_losses():
        (kx, ky), (tx, ty) = _both(x, y, grad=(0, 1))
        with pytest.warns(UserWarning):
            t = tm("mean")(tx, ty)
        _compare(km("mean")(kx, ky), t, [kx, ky], [tx, ty])


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("weighted", [False, True])
def test_bce(reduction: str, weighted: bool) -> None:
    rng = _rng(5)
    p = rng.uniform(0.01, 0.99, (4, 3)).astype(np.float32)
    p[0, 0], p[0, 1] = 0.0, 1.0  # the clamped logs
    y = rng.uniform(0, 1, (4, 3)).astype(np.float32)
    w = rng.uniform(0.5, 2.0, (3,)).astype(np.float32)
    (kp, ky), (tp, ty) = _both(p, y, grad=())  # values only: torch's target gradient is +-inf at 0 and 1
    kw, tw = (kael.tensor(w), torch.tensor(w)) if weighted else (None, None)
    _compare(nn.BCELoss(kw, reduction=reduction)(kp, ky), torch.nn.BCELoss(tw, reduction=reduction)(tp, ty), [ky], [ty])
    p[0, :2] = 0.3
    (kp, ky), (tp, ty) = _both(p, y, grad=(0, 1))
    _compare(
        nn.BCELoss(kw, reduction=reduction)(kp, ky),
        torch.nn.BCELoss(tw, reduction=reduction)(tp, ty),
        [kp, ky],
        [tp, ty],
    )


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("pos_weighted", [False, True])
@pytest.mark.parametrize("weighted", [False, True])
def test_bce_with_logits(reduction: str, pos_weighted: bool, weighted: bool) -> None:
    rng = _rng(6)
    x = (rng.standard_normal((5, 3)) * 5).astype(np.float32)
    x[0] = [-120.0, 0.0, 90.0]  # stable where sigmoid saturates
    y = rng.uniform(0, 1, (5, 3)).astype(np.float32)
    pw = rng.uniform(0.5, 3.0, (3,)).astype(np.float32)
    w = rng.uniform(0.5, 2.0, (5, 1)).astype(np.float32)
    (kx, ky), (tx, ty) = _both(x, y, grad=(0, 1))
    kpw, tpw = (kael.tensor(pw), torch.tensor(pw)) if pos_weighted else (None, None)
    kw, tw = (kael.tensor(w), torch.tensor(w)) if weighted else (None, None)
    k = nn.BCEWithLogitsLoss(kw, reduction=reduction, pos_weight=kpw)(kx, ky)
    t = torch.nn.BCEWithLogitsLoss(tw, reduction=reduction, pos_weight=tpw)(tx, ty)
    assert np.isfinite(k.detach().numpy()).all()
    _compare(k, t, [kx, ky], [tx, ty])


@pytest.mark.filterwarnings("ignore:reduction")
@pytest.mark.parametrize("reduction", [*REDUCTIONS, "batchmean"])
@pytest.mark.parametrize("log_target", [False, True])
def test_kl_div(reduction: str, log_target: bool) -> None:
    rng = _rng(7)
    x = TF.log_softmax(torch.tensor(rng.standard_normal((4, 5)).astype(np.float32)), 1).numpy()
    p = TF.softmax(torch.tensor(rng.standard_normal((4, 5)).astype(np.float32)), 1).numpy()
    p[0, 0] = 0.0
    t = np.log(p + 1e-3).astype(np.float32) if log_target else p
    # torch's target gradient is nan where target == 0 (kael's is 0 there): target grads only for log targets
    (kx, kt), (tx, tt) = _both(x, t, grad=(0, 1) if log_target else (0,))
    k = nn.KLDivLoss(reduction=reduction, log_target=log_target)(kx, kt)
    tr = torch.nn.KLDivLoss(reduction=reduction, log_target=log_target)(tx, tt)
    _compare(k, tr, [kx, kt], [tx, tt])


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("margin", [0.0, 0.3])
def test_cosine_embedding_loss(reduction: str, margin: float) -> None:
    rng = _rng(8)
    a = rng.standard_normal((6, 4)).astype(np.float32)
    b = rng.standard_normal((6, 4)).astype(np.float32)
    y = np.array([1, -1, 1, -1, -1, 1], np.float32)
    (ka, kb, ky), (ta, tb, ty) = _both(a, b, y, grad=(0, 1))
    k = nn.CosineEmbeddingLoss(margin, reduction=reduction)(ka, kb, ky)
    t = torch.nn.CosineEmbeddingLoss(margin, reduction=reduction)(ta, tb, ty)
    _compare(k, t, [ka, kb], [ta, tb])
    k1 = F.cosine_embedding_loss(kael.tensor(a[0]), kael.tensor(b[0]), kael.tensor(-1.0), margin)
    t1 = TF.cosine_embedding_loss(torch.tensor(a[0]), torch.tensor(b[0]), torch.tensor(-1.0), margin)
    np.testing.assert_allclose(k1.numpy(), t1.numpy(), rtol=1e-5, atol=1e-7)


def test_empty_batches_and_batch_one() -> None:
    x = np.zeros((0, 3), np.float32)
    y = np.zeros((0,), np.int64)
    for reduction in ("sum", "none"):
        k = F.cross_entropy(kael.tensor(x), kael.tensor(y), reduction=reduction)
        t = TF.cross_entropy(torch.tensor(x), torch.tensor(y), reduction=reduction)
        np.testing.assert_allclose(k.numpy(), t.numpy())
    assert np.isnan(F.mse_loss(kael.tensor(x), kael.tensor(x)).item())
    one = np.array([[0.2, -1.0, 3.0]], np.float32)
    k = F.nll_loss(kael.tensor(one), kael.tensor([2]), weight=kael.tensor([1.0, 2.0, 3.0]))
    t = TF.nll_loss(torch.tensor(one), torch.tensor([2]), weight=torch.tensor([1.0, 2.0, 3.0]))
    np.testing.assert_allclose(k.numpy(), t.numpy(), rtol=1e-6)


def test_gradcheck_float64() -> None:
    rng = _rng(9)
    x = kael.tensor(rng.standard_normal((3, 4)), requires_grad=True)
    y = kael.tensor(rng.standard_normal((3, 4)), requires_grad=True)
    ids = kael.tensor([1, 3, 0])
    w = kael.tensor([0.5, 1.0, 2.0, 1.5], dtype=kael.float64)
    probs = kael.tensor(rng.uniform(0.1, 0.9, (3, 4)))
    assert gradcheck(lambda a: F.cross_entropy(a, ids, weight=w, label_smoothing=0.1), [x])
    assert gradcheck(lambda a: F.nll_loss(a, ids, weight=w), [x])
    assert gradcheck(lambda a, b: F.smooth_l1_loss(a, b, beta=0.7), [x, y])
    assert gradcheck(lambda a, b: F.huber_loss(a, b, delta=0.4), [x, y])
    assert gradcheck(lambda a, b: F.binary_cross_entropy_with_logits(a, probs, pos_weight=b[0]), [x, y])
    assert gradcheck(lambda a: F.binary_cross_entropy(F.sigmoid(a), probs), [x])
    assert gradcheck(lambda a: F.kl_div(F.log_softmax(a, 1), probs, reduction="batchmean"), [x])
    assert gradcheck(lambda a, b: F.cosine_embedding_loss(a, b, kael.tensor([1.0, -1.0, -1.0]), 0.1), [x, y])


def test_bad_arguments_raise_kael_errors() -> None:
    z = kael.zeros(3, 4)
    with pytest.raises(kael.IndexError_, match="target 5 is out of range for 4 classes"):
        nn.CrossEntropyLoss(weight=kael.ones(4))(z, kael.tensor([0, 5, 1]))
    with pytest.raises(kael.IndexError_, match="target -3 is out of range"):
        F.nll_loss(z, kael.tensor([0, -3, 1]))
    with pytest.raises(KaelError, match="weight must have shape \\[4\\]"):
        F.nll_loss(z, kael.tensor([0, 1, 1]), weight=kael.ones(3))
    with pytest.raises(KaelError, match="reduction"):
        nn.MSELoss(reduction="avg")
    with pytest.raises(KaelError, match="reduction"):
        F.kl_div(z, z, reduction="batch")
    with pytest.raises(KaelError, match="probabilities in \\[0, 1\\]"):
        F.binary_cross_entropy(kael.tensor([0.5, 1.5]), kael.tensor([0.0, 1.0]))
    with pytest.raises(KaelError, match="target shape"):
        F.binary_cross_entropy_with_logits(z, kael.zeros(3))
    with pytest.raises(KaelError, match="beta"):
        F.smooth_l1_loss(z, z, beta=-1.0)
    with pytest.raises(KaelError, match="delta"):
        F.huber_loss(z, z, delta=0.0)
    with pytest.raises(KaelError, match="label_smoothing"):
        F.cross_entropy(z, kael.tensor([0, 1, 1]), label_smoothing=1.5)


def test_buffers_in_state_dict() -> None:
    m = nn.BCEWithLogitsLoss(weight=kael.ones(3), pos_weight=kael.ones(3))
    t = torch.nn.BCEWithLogitsLoss(weight=torch.ones(3), pos_weight=torch.ones(3))
    assert sorted(m.state_dict()) == sorted(t.state_dict())
    assert sorted(nn.CrossEntropyLoss(kael.ones(2)).state_dict()) == sorted(
        torch.nn.CrossEntropyLoss(torch.ones(2)).state_dict()
    )


def test_signatures_match_torch_positionally() -> None:
    import inspect

    for name in [
        "cross_entropy",
        "nll_loss",
        "mse_loss",
        "l1_loss",
        "smooth_l1_loss",
        "huber_loss",
        "binary_cross_entropy",
        "binary_cross_entropy_with_logits",
        "kl_div",
        "cosine_embedding_loss",
    ]:
        ours = list(inspect.signature(getattr(F, name)).parameters)
        theirs = list(inspect.signature(getattr(TF, name)).parameters)
        assert ours == theirs, name
    for name in [
        "CrossEntropyLoss",
        "NLLLoss",
        "MSELoss",
        "L1Loss",
        "SmoothL1Loss",
        "HuberLoss",
        "BCELoss",
        "BCEWithLogitsLoss",
        "KLDivLoss",
        "CosineEmbeddingLoss",
    ]:
        ours = list(inspect.signature(getattr(nn, name).__init__).parameters)
        theirs = list(inspect.signature(getattr(torch.nn, name).__init__).parameters)
        assert ours == theirs, name


@pytest.mark.parametrize(("size_average", "reduce"), [(False, None), (None, False), (True, True), (False, True)])
def test_deprecated_size_average_and_reduce(size_average: Any, reduce: Any) -> None:
    rng = _rng(11)
    x, y = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((3, 4)).astype(np.float32)
    with pytest.warns(UserWarning, match="deprecated"):
        k = nn.MSELoss(size_average, reduce)(kael.tensor(x), kael.tensor(y))
    with pytest.warns(UserWarning):
        t = torch.nn.MSELoss(size_average, reduce)(torch.tensor(x), torch.tensor(y))
    np.testing.assert_allclose(k.numpy(), t.numpy(), rtol=1e-6)
    ids = np.array([1, 0, 3])
    with pytest.warns(UserWarning, match="deprecated"):
        k = F.cross_entropy(kael.tensor(x), kael.tensor(ids), None, size_average, -100, reduce)
    with pytest.warns(UserWarning):
        t = TF.cross_entropy(torch.tensor(x), torch.tensor(ids), None, size_average, -100, reduce)
    np.testing.assert_allclose(k.numpy(), t.numpy(), rtol=1e-6)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("name", ["mse_loss", "l1_loss", "huber_loss"])
def test_elementwise_weight(name: str, reduction: str) -> None:
    rng = _rng(12)
    x, y = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((3, 4)).astype(np.float32)
    w = rng.uniform(0.1, 2.0, (3, 4)).astype(np.float32)
    (kx, ky), (tx, ty) = _both(x, y, grad=(0, 1))
    k = getattr(F, name)(kx, ky, reduction=reduction, weight=kael.tensor(w))
    t = getattr(TF, name)(tx, ty, reduction=reduction, weight=torch.tensor(w))
    _compare(k, t, [kx, ky], [tx, ty])
    with pytest.raises(KaelError, match="weight must have the input's shape"):
        getattr(F, name)(kx, ky, weight=kael.ones(4))
