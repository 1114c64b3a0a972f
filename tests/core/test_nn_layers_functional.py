"""kael.nn layers and functional ops against NumPy formulas and PyTorch.

Linear (formula and init bounds), Embedding, LayerNorm, GELU (exact and tanh), ReLU,
Dropout (mask, scale, reproducibility, gradient), a small model against the same
PyTorch model loaded with the same weights, and the functional cross_entropy (reductions,
label smoothing, ignored targets, errors), softmax, nll_loss, mse_loss and
scaled_dot_product_attention formulas.
"""

from __future__ import annotations

import math

import kael
import numpy as np
import pytest
from kael import DTypeError, ShapeError, nn
from kael.nn import functional as F
from tensor_values import arr

# -- layers ------------------------------------------------------------------------------------


def test_linear_matches_formula_and_init_bounds() -> None:
    kael.manual_seed(0)
    m = nn.Linear(50, 7)
    assert m.weight.shape == (7, 50) and m.bias.shape == (7,)
    bound = 1 / math.sqrt(50)
    assert np.abs(arr(m.weight)).max() <= bound and np.abs(arr(m.bias)).max() <= bound
    assert np.abs(arr(m.weight)).max() > 0.8 * bound  # really spread over the range
    x = np.random.default_rng(0).standard_normal((3, 50)).astype(np.float32)
    np.testing.assert_allclose(arr(m(kael.tensor(x))), x @ arr(m.weight).T + arr(m.bias), rtol=1e-5, atol=1e-6)
    m2 = nn.Linear(3, 2, bias=False, dtype=kael.float64)
    assert m2.bias is None and m2.weight.dtype is kael.float64
    with pytest.raises(DTypeError, match="floating-point dtype"):
        nn.Linear(2, 2, dtype=kael.int32)


def test_embedding_layernorm_gelu_relu_values() -> None:
    kael.manual_seed(1)
    e = nn.Embedding(1000, 16)
    w = arr(e.weight)
    assert abs(w.mean()) < 0.05 and abs(w.std() - 1.0) < 0.05
    ids = kael.tensor([[3, 999], [3, 0]])
    np.testing.assert_array_equal(arr(e(ids)), w[[[3, 999], [3, 0]]])
    ln = nn.LayerNorm(4, eps=1e-5)
    assert arr(ln.weight).tolist() == [1.0] * 4 and arr(ln.bias).tolist() == [0.0] * 4
    x = np.array([[1.0, 2.0, 4.0, 7.0]], dtype=np.float32)
    ref = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(arr(ln(kael.tensor(x))), ref, rtol=1e-5, atol=1e-6)
    assert nn.LayerNorm(4, elementwise_affine=False).weight is None
    v = np.linspace(-3, 3, 13)
    erf = np.vectorize(math.erf)
    np.testing.assert_allclose(
        arr(nn.GELU()(kael.tensor(v, dtype=kael.float64))), 0.5 * v * (1 + erf(v / 2**0.5)), rtol=1e-12, atol=1e-15
    )
    tanh_ref = 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3)))
    np.testing.assert_allclose(
        arr(nn.GELU("tanh")(kael.tensor(v, dtype=kael.float64))), tanh_ref, rtol=1e-12, atol=1e-15
    )
    assert arr(nn.ReLU()(kael.tensor([-1.0, 0.0, 2.0]))).tolist() == [0.0, 0.0, 2.0]
    with pytest.raises(DTypeError, match="approximate"):
        nn.GELU("fast")


def test_dropout_masks_scales_and_is_reproducible() -> None:
    x = kael.ones(200, 50)
    g = kael.Generator().manual_seed(3)
    d = nn.Dropout(0.3, generator=g)
    y = arr(d(x))
    np.testing.assert_allclose(np.unique(y), [0.0, 1 / 0.7], rtol=1e-6)
    assert abs((y == 0).mean() - 0.3) < 0.02
    g.manual_seed(3)
    np.testing.assert_array_equal(arr(d(x)), y)
    d.eval()
    assert d(x) is x
    assert F.dropout(x, 0.0) is x and arr(F.dropout(x, 1.0)).max() == 0.0
    with pytest.raises(DTypeError, match="probability"):
        nn.Dropout(1.5)
    xr = kael.ones(4, 4, requires_grad=True)
    out = F.dropout(xr, 0.5, generator=kael.Generator().manual_seed(0))
    out.sum().backward()
    np.testing.assert_array_equal(arr(xr.grad), arr(out))  # the gradient is the same mask and scale


def test_model_matches_torch_forward_and_backward() -> None:
    torch = pytest.importorskip("torch")
    kael.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.GELU("tanh"), nn.LayerNorm(8), nn.Linear(8, 3))
    tmodel = torch.nn.Sequential(
        torch.nn.Linear(6, 8), torch.nn.GELU("tanh"), torch.nn.LayerNorm(8), torch.nn.Linear(8, 3)
    ).double()
    model.double()
    tmodel.load_state_dict({k: torch.from_numpy(arr(v).copy()) for k, v in model.state_dict().items()})
    x = np.random.default_rng(0).standard_normal((5, 6))
    y = np.array([0, 2, 1, 1, 0])
    loss = F.cross_entropy(model(kael.tensor(x, dtype=kael.float64)), kael.tensor(y), label_smoothing=0.1)
    tloss = torch.nn.functional.cross_entropy(tmodel(torch.tensor(x)), torch.tensor(y), label_smoothing=0.1)
    loss.backward()
    tloss.backward()
    assert loss.item() == pytest.approx(tloss.item(), rel=1e-12)
    for (n, p), (tn, tp) in zip(model.named_parameters(), tmodel.named_parameters()):
        assert n == tn
        np.testing.assert_allclose(arr(p.grad), tp.grad.numpy(), rtol=1e-9, atol=1e-12, err_msg=n)


# -- functional -------------------------------------------------------------------------------


def _log_softmax(z: np.ndarray) -> np.ndarray:
    s = z - z.max(1, keepdims=True)
    return s - np.log(np.exp(s).sum(1, keepdims=True))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.25])
def test_cross_entropy_formula(reduction: str, smoothing: float) -> None:
    rng = np.random.default_rng(1)
    z = rng.standard_normal((6, 4))
    y = np.array([0, 3, -100, 1, 2, -100])
    logp = _log_softmax(z)
    keep = y != -100
    safe = np.where(keep, y, 0)
    per = -(1 - smoothing) * logp[np.arange(6), safe] - smoothing * logp.mean(1)
    per = np.where(keep, per, 0.0)
    expected = {"none": per, "sum": per.sum(), "mean": per.sum() / keep.sum()}[reduction]
    got = F.cross_entropy(
        kael.tensor(z, dtype=kael.float64), kael.tensor(y), reduction=reduction, label_smoothing=smoothing
    )
    np.testing.assert_allclose(arr(got), expected, rtol=1e-12)


def test_cross_entropy_errors() -> None:
    z = kael.zeros(3, 4)
    with pytest.raises(kael.IndexError_, match="target 4 is out of range for 4 classes"):
        F.cross_entropy(z, kael.tensor([0, 4, 1]))
    with pytest.raises(ShapeError, match=r"logits \[N, C\] and target \[N\]"):
        F.cross_entropy(z, kael.tensor([0, 1]))
    with pytest.raises(DTypeError, match="integer tensor of class ids"):
        F.cross_entropy(z, kael.zeros(3))
    assert math.isnan(F.cross_entropy(z, kael.tensor([-100, -100, -100])).item())  # no target counted: 0/0


def test_softmax_nll_mse_and_attention_formulas() -> None:
    rng = np.random.default_rng(2)
    z = rng.standard_normal((3, 5))
    np.testing.assert_allclose(
        arr(F.softmax(kael.tensor(z, dtype=kael.float64), dim=1)), np.exp(_log_softmax(z)), rtol=1e-12
    )
    y = np.array([4, 0, 2])
    nll = F.nll_loss(F.log_softmax(kael.tensor(z, dtype=kael.float64), 1), kael.tensor(y))
    assert nll.item() == pytest.approx(-_log_softmax(z)[np.arange(3), y].mean(), rel=1e-12)
    a, b = rng.standard_normal(4), rng.standard_normal(4)
    assert F.mse_loss(kael.tensor(a), kael.tensor(b)).item() == pytest.approx(((a - b) ** 2).mean(), rel=1e-6)
    q, k, v = (rng.standard_normal((2, 3, 4)) for _ in range(3))
    s = q @ k.transpose(0, 2, 1) / 2.0
    s = np.where(np.tril(np.ones((3, 3))) > 0, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    got = F.scaled_dot_product_attention(*(kael.tensor(x, dtype=kael.float64) for x in (q, k, v)), is_causal=True)
    assert got.shape == (2, 3, 4)
    np.testing.assert_allclose(arr(got), p @ v, rtol=1e-10)
