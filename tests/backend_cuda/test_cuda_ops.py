"""Frontend ops on emulated cuda tensors against the same ops on cpu (the reference backend).

Property tests draw shapes, strides and broadcasting; the fused ops, autograd through
them, an AdamW training step and GPT-2 logits and greedy decoding are compared too.
"""

from __future__ import annotations

import json
from pathlib import Path

import kael
import kael.nn.functional as F
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kael.ops._indexing import index_add_nograd as index_add

DATA = Path(__file__).resolve().parents[1] / "data" / "tiny-gpt2"


def _close(got: kael.Tensor, want: kael.Tensor, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    assert got.device.type == "cuda", got.device
    assert got.dtype is want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got.cpu().numpy(), want.numpy(), rtol=rtol, atol=atol)


@st.composite
def strided(draw: st.DrawFn) -> tuple[np.ndarray, list[int], tuple[int, ...]]:
    """A base array, a permutation and steps: the view base.transpose(perm)[::steps]."""
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=ndim, max_size=ndim)))
    perm = draw(st.permutations(range(ndim)))
    steps = tuple(draw(st.lists(st.integers(1, 2), min_size=ndim, max_size=ndim)))
    seed = draw(st.integers(0, 2**16))
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32), list(perm), steps


def _view(t: kael.Tensor, perm: list[int], steps: tuple[int, ...]) -> kael.Tensor:
    v = t.permute(*perm)
    return v[tuple(slice(None, None, s) for s in steps)]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(strided(), st.sampled_from(["exp", "tanh", "abs", "neg", "sigmoid", "sqrt_abs", "round", "silu", "erf"]))
def test_unary_on_strided_views(emulate, case, op):
    base, perm, steps = case
    c = _view(kael.tensor(base), perm, steps)
    g = _view(kael.tensor(base, device="cuda"), perm, steps)
    f = {"sqrt_abs": lambda t: t.abs().sqrt()}.get(op, lambda t: getattr(t, op)())
    _close(f(g), f(c))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(strided(), st.sampled_from(["add", "sub", "mul", "div", "maximum", "lt", "ge"]), st.booleans())
def test_binary_with_broadcasting(emulate, case, op, row):
    base, perm, steps = case
    c = _view(kael.tensor(base), perm, steps)
    g = _view(kael.tensor(base, device="cuda"), perm, steps)
    other = c[..., :1] if row else c.flatten()[:1].reshape(())  # stride-0 broadcast operand
    f = getattr(kael, op)
    _close(f(g, other.to("cuda")), f(c, other))
    _close(f(g, 1.5), f(c, 1.5))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(strided(), st.sampled_from(["sum", "amax", "mean", "argmax", "prod"]), st.booleans())
def test_reductions_over_dims(emulate, case, op, keepdim):
    base, perm, steps = case
    c = _view(kael.tensor(base), perm, steps)
    g = _view(kael.tensor(base, device="cuda"), perm, steps)
    dim = c.ndim - 1
    _close(getattr(g, op)(dim, keepdim=keepdim), getattr(c, op)(dim, keepdim=keepdim))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(1, 4), st.integers(1, 6), st.integers(1, 5), st.integers(1, 4), st.booleans())
def test_batched_matmul_on_transposed_operands(emulate, b, m, k, n, transposed):
    rng = np.random.default_rng(b * 100 + m * 10 + k)
    a = kael.tensor(rng.standard_normal((b, m, k)).astype(np.float32))
    w = kael.tensor(rng.standard_normal((b, n, k)).astype(np.float32))
    wt = w.transpose(1, 2) if transposed else w.transpose(1, 2).contiguous()
    _close(
        a.to("cuda") @ wt.to("cuda") if not transposed else a.to("cuda") @ w.to("cuda").transpose(1, 2),
        a @ wt,
        rtol=1e-5,
        atol=1e-5,
    )


def test_indexing_family(emulate):
    rng = np.random.default_rng(0)
    c = kael.tensor(rng.standard_normal((5, 4)).astype(np.float32))
    g = c.to("cuda")
    idx = kael.tensor([4, 0, 4, 2])
    _close(g.index_select(0, idx.to("cuda")), c.index_select(0, idx))
    _close(g[idx.to("cuda")], c[idx])
    _close(g[g > 0], c[c > 0])
    gi = kael.tensor([[0, 1, 1, 3], [2, 2, 0, 0]])
    _close(g.gather(0, gi.to("cuda")), c.gather(0, gi))
    acc_c = kael.zeros(3, 4)
    acc_g = acc_c.to("cuda")
    index_add(acc_c, 0, kael.tensor([0, 2, 0, 1, 0]), c)
    index_add(acc_g, 0, kael.tensor([0, 2, 0, 1, 0], device="cuda"), g)
    _close(acc_g, acc_c)
    _close(kael.cat([g, g[:2]], 0), kael.cat([c, c[:2]], 0))


def test_integer_scatter_add_accumulates_exactly(emulate):
    big = 2**40
    base = kael.tensor([big, -big, 5], dtype=kael.int64)
    g = base.to("cuda")
    idx = kael.tensor([0, 0, 2, 1, 1])
    src = kael.tensor([big, 3, -7, -big, 1], dtype=kael.int64)
    index_add(base, 0, idx, src)
    index_add(g, 0, idx.to("cuda"), src.to("cuda"))
    assert g.tolist() == base.tolist() == [2 * big + 3, -2 * big + 1, -2]


def test_integer_division_by_zero_is_a_kael_error(emulate):
    a = kael.tensor([4, 5], device="cuda")
    with pytest.raises(kael.KaelError, match="division by zero"):
        kael.remainder(a, kael.tensor([1, 0], device="cuda"))


FUSED = {
    "softmax": lambda x: F.softmax(x, dim=-1),
    "softmax_dim0": lambda x: F.softmax(x, dim=0),
    "log_softmax": lambda x: F.log_softmax(x, dim=-1),
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu": lambda x: F.gelu(x),
    "layer_norm": lambda x: F.layer_norm(x, (x.shape[-1],)),
    "silu": lambda x: F.silu(x * 4.0),
}


@pytest.mark.parametrize("name", sorted(FUSED))
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_fused_forward_and_backward(emulate, name, dtype):
    d = getattr(kael, dtype)
    rng = np.random.default_rng(1)
    base = rng.standard_normal((3, 7)).astype(dtype)
    up = rng.standard_normal((3, 7)).astype(dtype)
    out = {}
    for dev in ("cpu", "cuda"):
        x = kael.tensor(base, dtype=d, device=dev, requires_grad=True)
        y = FUSED[name](x.T.contiguous().T)  # a non-contiguous operand
        (y * kael.tensor(up, dtype=d, device=dev)).sum().backward()
        out[dev] = (y.detach(), x.grad)
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == "float32" else dict(rtol=1e-12, atol=1e-12)
    _close(out["cuda"][0], out["cpu"][0], **tol)
    _close(out["cuda"][1], out["cpu"][1], **tol)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_silu_runs_the_cuda_kernel_and_matches_torch(emulate, dtype):
    """silu on cuda is the backend's own kernel (its ElementwiseKernel source, emulated), not the decomposition."""
    torch = pytest.importorskip("torch")
    assert "silu" in emulate.supported_ops()
    seen: list[str] = []
    kael.backends.dispatch.set_kernel_wrapper(lambda dev, op, b, k: (seen.append(op), k)[1])
    try:
        x = np.array([[-30.0, -2.5, -0.5, 0.0], [0.25, 1.0, 3.0, 40.0]], np.float32)
        got = kael.silu(kael.tensor(x, dtype=getattr(kael, dtype), device="cuda").T).float().cpu().numpy()
    finally:
        kael.backends.dispatch.set_kernel_wrapper(None)
    assert "silu" in seen and "sigmoid" not in seen, seen
    want = torch.nn.functional.silu(torch.tensor(x).to(getattr(torch, dtype)).T).float().numpy()
    tol = {"float32": 1e-6, "float16": 1e-3, "bfloat16": 8e-3}[dtype]
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def test_cross_entropy_with_ignore_and_smoothing(emulate):
    rng = np.random.default_rng(2)
    logits = rng.standard_normal((6, 9)).astype(np.float32)
    target = [1, 8, -100, 0, 3, -100]
    out = {}
    for dev in ("cpu", "cuda"):
        z = kael.tensor(logits, device=dev, requires_grad=True)
        loss = F.cross_entropy(z, kael.tensor(target, device=dev), label_smoothing=0.1)
        loss.backward()
        out[dev] = (loss.detach(), z.grad)
    _close(out["cuda"][0], out["cpu"][0])
    _close(out["cuda"][1], out["cpu"][1])


def test_attention_over_a_kv_cache(emulate):
    rng = np.random.default_rng(3)
    q = rng.standard_normal((2, 3, 2, 4)).astype(np.float32)
    kv = rng.standard_normal((2, 2, 3, 8, 4)).astype(np.float32)  # [B, k/v, H, P, D] like model.new_cache()'s blocks
    lengths = [5, 2]
    res = {}
    for dev in ("cpu", "cuda"):
        cache = kael.tensor(kv, device=dev)
        k = cache.select(1, 0).narrow(2, 0, 6)  # strided views of the cache
        v = cache.select(1, 1).narrow(2, 0, 6)
        res[dev] = kael.attention(
            kael.tensor(q, device=dev), k, v, causal=True, lengths=kael.tensor(lengths, device=dev)
        )
    _close(res["cuda"], res["cpu"])


def test_topk(emulate):
    x = kael.tensor([[3.0, 1.0, 3.0, 2.0, 0.5], [0.0, 0.0, -1.0, 4.0, 0.0]])
    vc, ic = kael.topk(x, 3)
    vg, ig = kael.topk(x.to("cuda"), 3)
    _close(vg, vc)
    assert ig.tolist() == ic.tolist() == [[0, 2, 3], [3, 0, 1]]


def test_training_step_matches_cpu(emulate):
    models = {}
    for dev in ("cpu", "cuda"):
        kael.manual_seed(0)
        net = kael.nn.Sequential(
            kael.nn.Linear(6, 8), kael.nn.GELU(approximate="tanh"), kael.nn.LayerNorm(8), kael.nn.Linear(8, 4)
        ).to(dev)
        opt = kael.optim.AdamW(net.parameters(), lr=1e-2, weight_decay=0.1)
        rng = np.random.default_rng(4)
        for _ in range(3):
            x = kael.tensor(rng.standard_normal((5, 6)).astype(np.float32), device=dev)
            y = kael.tensor(rng.integers(0, 4, size=5), device=dev)
            opt.zero_grad()
            loss = F.cross_entropy(net(x), y)
            loss.backward()
            opt.step()
        models[dev] = (net, loss.item())
    assert models["cuda"][1] == pytest.approx(models["cpu"][1], rel=1e-5)
    for (n1, p1), (n2, p2) in zip(models["cpu"][0].named_parameters(), models["cuda"][0].named_parameters()):
        assert n1 == n2 and p2.device.type == "cuda"
        np.testing.assert_allclose(p2.detach().cpu().numpy(), p1.detach().numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(not (DATA / "model.safetensors").exists(), reason="tiny GPT-2 test checkpoint missing")
def test_gpt2_logits_and_greedy_tokens_match_the_reference(emulate):
    from kael.models import GPT

    ref = json.loads((DATA / "reference.json").read_text())
    case = next(c for c in ref["cases"] if len(c["ids"]) <= 60)
    model = GPT.from_pretrained(DATA, device="cuda")
    assert model.device.type == "cuda"
    ids = kael.tensor([case["ids"]], device="cuda")
    with kael.no_grad():
        logits = model(ids).cpu().numpy()[0]
    want = kael.load_safetensors(DATA / "reference.safetensors")[case["logits_key"]].numpy()
    assert np.abs(logits - want).max() < 1e-4
    assert model.generate(case["ids"], 8) == case["greedy_20"][:8]
