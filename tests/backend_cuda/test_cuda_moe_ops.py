"""The mixture-of-experts ops on emulated cuda: the backend's own ``moe_route`` and ``expert_linear`` kernels run
(no softmax/topk, no per-expert matmul), with the right values (NumPy float64 oracles written here), strides
(a transposed logits view, x broadcast over K, strided and transposed weights), ties and non-finite logits,
16-bit weights read in their storage, gradients, and batched rows equal to rows alone.

Each value test runs twice: with the kernels' NumPy twins (``twin``, the emulation) and with the CUDA C
itself compiled for the host by ``cuda_on_host`` (``cuda_c``: the launchers' GPU path, their tile tables,
grid and arguments, checked against the kernels' parameter types; skipped without g++), which also runs the
conformance kit's rows for both ops.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from typing import Any

import kael
import numpy as np
import pytest
from cuda_on_host import HostModule, available
from cuda_ops_helpers import ops_called, to_cuda, to_host
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kael.testing.conformance import check_kernel, fused_op_cases

from kael_backend_cuda import _moe, _moe_source

TOL = {"float32": 2e-5, "float64": 1e-12, "float16": 2e-3, "bfloat16": 1.6e-2}
SETTINGS = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def host_module(tmp_path_factory: pytest.TempPathFactory) -> HostModule:
    why = available()
    if why:
        pytest.skip(f"the CUDA C cannot run on this host: {why}")
    return HostModule(
        _moe_source.MOE_KERNELS_SOURCE, _moe_source.MOE_KERNEL_NAMES, tmp_path_factory.mktemp("moe_kernels")
    )


def _run_cuda_c(module: HostModule, monkeypatch: pytest.MonkeyPatch) -> None:
    """The launchers take their GPU path over NumPy arrays, running the CUDA C on the host (the rest of the
    backend stays emulated)."""
    monkeypatch.setattr(_moe, "X", types.SimpleNamespace(xp=np, emulated=False))
    monkeypatch.setattr(_moe, "_kernel", module.get_function)


@pytest.fixture(params=["twin", "cuda_c"])
def kernels(request: pytest.FixtureRequest, emulate: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The emulated backend with its NumPy twins, then with the CUDA C run on the host."""
    if request.param == "cuda_c":
        _run_cuda_c(request.getfixturevalue("host_module"), monkeypatch)
    yield request.param


def _route(logits: np.ndarray, k: int, normalize: bool) -> tuple[np.ndarray, np.ndarray]:
    """NumPy's routing in float64: softmax, the k largest (equal ones in index order, NaN last), renormalised."""
    with np.errstate(all="ignore"):
        z = np.exp(logits - logits.max(-1, keepdims=True))
        p = z / z.sum(-1, keepdims=True)
        idx = np.argsort(-p, axis=-1, kind="stable")[:, :k]
        w = np.take_along_axis(p, idx, -1)
        return (w / w.sum(-1, keepdims=True) if normalize else w), idx


def _expert_linear(x: np.ndarray, w: np.ndarray, ex: np.ndarray) -> np.ndarray:
    """out[t, j] = w[ex[t, j]] @ x[t, j] (x [T, C]: x[t] for every j), in float64."""
    xs = x if x.ndim == 3 else np.broadcast_to(x[:, None], ex.shape + x.shape[-1:])
    return np.einsum("tknc,tkc->tkn", w[ex], xs)


# -- moe_route ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_moe_route_kernel(kernels, dtype, normalize):
    assert {"moe_route", "expert_linear"} <= set(kael.backends.current("cuda").supported_ops())
    rng = np.random.default_rng(1)
    e, t, k = 9, 6, 3
    logits = np.stack([rng.permutation(e) * 0.5 + rng.integers(-4, 4) for _ in range(t)])  # distinct per row
    lt = to_cuda(logits.T.copy(), dtype)
    (w, ex), seen = ops_called(lambda: kael.moe_route(lt.T, k, normalize))  # a transposed view
    assert "moe_route" in seen and not {"softmax", "topk", "exp"} & set(seen), seen
    assert w.device.type == "cuda" and w.dtype is (kael.float64 if dtype == "float64" else kael.float32)
    want_w, want_ex = _route(logits, k, normalize)
    np.testing.assert_array_equal(to_host(ex), want_ex)
    np.testing.assert_allclose(to_host(w), want_w, rtol=2e-6 if dtype != "float64" else 1e-13, atol=1e-7)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_moe_route_ties_and_non_finite_logits(kernels, dtype):
    """Equal probabilities in index order; -inf logits get 0 and rank last among numbers; a row with NaN (or
    two +inf) is all NaN, its experts in index order: as a stable sort of -p, the reference's definition."""
    inf, nan = np.inf, np.nan
    logits = np.array(
        [
            [1, 3, 3, 0, 3, -1],
            [2, 2, 2, 2, 2, 2],
            [-inf, 0, -inf, 1, -inf, 0],
            [0, 1, nan, 2, 3, 4],
            [inf, 1, inf, 0, 0, 0],
            [-inf, -inf, 5, -inf, -inf, -inf],
        ]
    )
    for k, normalize in [(2, False), (4, True), (6, False)]:
        w, ex = kael.moe_route(to_cuda(logits, dtype), k, normalize)
        want_w, want_ex = _route(logits, k, normalize)
        np.testing.assert_array_equal(to_host(ex), want_ex)
        np.testing.assert_allclose(to_host(w), want_w, rtol=1e-6, atol=1e-7)  # NaN where the oracle has NaN
    assert to_host(ex)[0].tolist() == [1, 2, 4, 0, 3, 5] and to_host(ex)[3].tolist() == [0, 1, 2, 3, 4, 5]


@given(
    t=st.integers(1, 4),
    e=st.sampled_from([1, 5, 33, 130, 1100]),  # one warp, several, a block of 256, several experts per thread
    data=st.data(),
    normalize=st.booleans(),
    seed=st.integers(0, 2**16),
)
@SETTINGS
def test_moe_route_shapes(kernels, t, e, data, normalize, seed):
    """Small-integer logits: equal ones tie exactly, distinct ones are far apart (no near-ties to round)."""
    k = data.draw(st.integers(1, min(e, 9)))
    logits = np.random.default_rng(seed).integers(-3, 4, size=(t, e)).astype(np.float64)
    w, ex = kael.moe_route(to_cuda(logits), k, normalize)
    want_w, want_ex = _route(logits, k, normalize)
    np.testing.assert_array_equal(to_host(ex), want_ex)
    np.testing.assert_allclose(to_host(w), want_w, rtol=2e-6, atol=1e-7)


# -- expert_linear -----------------------------------------------------------------------------------
@pytest.mark.parametrize("per_slot", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_expert_linear_kernel(kernels, dtype, per_slot):
    rng = np.random.default_rng(2)
    t, kk, e, n, c = 7, 2, 5, 6, 20  # C: a full and a partial step of the kernel's reduction
    x = rng.standard_normal((kk, t, c) if per_slot else (t, c))
    big = rng.standard_normal((e, 2 * n, c))
    ex = rng.choice([0, 1, 2, 4], size=(t, kk))  # expert 3 is never hit
    xt = to_cuda(x, dtype)
    wt = to_cuda(big, dtype)[:, ::2]  # strided weights [E, N, C]
    et = kael.tensor(ex, device="cuda")
    xv = kael.transpose(xt, 0, 1) if per_slot else xt  # [T, K, C] a permuted view; [T, C] broadcast over K
    y, seen = ops_called(lambda: kael.expert_linear(xv, wt, et))
    assert "expert_linear" in seen and not {"matmul", "index_select", "index_add"} & set(seen), seen
    assert y.shape == (t, kk, n) and y.dtype is getattr(kael, dtype) and y.device.type == "cuda"
    want = _expert_linear(to_host(xv), to_host(wt), ex)
    np.testing.assert_allclose(to_host(y), want, rtol=TOL[dtype], atol=TOL[dtype] * 4)


@pytest.mark.parametrize("max_grid_y", [65535, 1])
def test_expert_linear_tiles(kernels, monkeypatch, max_grid_y):
    """An expert with more rows than a tile (three tiles), N over two column tiles (one block row walking both
    when the grid's y is capped), and a weight transposed in memory (read along n)."""
    monkeypatch.setattr(_moe, "_MAX_GRID_Y", max_grid_y)
    rng = np.random.default_rng(3)
    t, kk, e, n, c = 75, 2, 4, 70, 33
    ex = np.where(rng.random((t, kk)) < 0.9, 1, rng.integers(0, e, size=(t, kk)))  # expert 1: ~135 rows
    x = rng.standard_normal((t, kk, c))
    w = rng.standard_normal((e, c, n))
    wt = kael.transpose(to_cuda(w), 1, 2)  # [E, N, C], strides (C*N, 1, N)
    y = kael.expert_linear(to_cuda(x), wt, kael.tensor(ex, device="cuda"))
    np.testing.assert_allclose(to_host(y), _expert_linear(x, w.transpose(0, 2, 1), ex), rtol=1e-5, atol=1e-5)


@given(
    t=st.integers(1, 9),
    kk=st.integers(1, 3),
    e=st.integers(1, 6),
    n=st.integers(1, 9),
    c=st.integers(0, 18),
    per_slot=st.booleans(),
    seed=st.integers(0, 2**16),
)
@SETTINGS
def test_expert_linear_shapes(kernels, t, kk, e, n, c, per_slot, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((t, kk, c) if per_slot else (t, c))
    w = rng.standard_normal((e, n, c))
    ex = rng.integers(0, e, size=(t, kk))
    y = kael.expert_linear(to_cuda(x, "float64"), to_cuda(w, "float64"), kael.tensor(ex, device="cuda"))
    np.testing.assert_allclose(to_host(y), _expert_linear(x, w, ex), rtol=1e-12, atol=1e-12)


def test_gradients_on_cuda(kernels):
    """dx = W[e].T @ g through the kernel again (the weight's transposed view, read in place), summed over the
    slots for x [T, C]; dW[e] = sum of g x^T over e's rows (0 for experts never hit)."""
    rng = np.random.default_rng(4)
    t, kk, e, n, c = 6, 2, 4, 5, 7
    x, w, g = rng.standard_normal((t, c)), rng.standard_normal((e, n, c)), rng.standard_normal((t, kk, n))
    ex = rng.choice([0, 1, 3], size=(t, kk))
    xt, wt = to_cuda(x, "float64", True), to_cuda(w, "float64", True)
    _, seen = ops_called(
        lambda: (kael.expert_linear(xt, wt, kael.tensor(ex, device="cuda")) * to_cuda(g, "float64")).sum().backward()
    )
    assert seen.count("expert_linear") == 2, seen  # forward, and dx
    dx = np.einsum("tknc,tkn->tc", w[ex], g)
    dw = np.zeros_like(w)
    np.add.at(dw, ex.reshape(-1), np.einsum("rn,rc->rnc", g.reshape(-1, n), np.repeat(x, kk, axis=0)))
    np.testing.assert_allclose(to_host(xt.grad), dx, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(to_host(wt.grad), dw, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_batched_rows_equal_rows_alone(emulate, monkeypatch, host_module, dtype):
    """The CUDA C: each output is its C products summed in index order, whatever else is in the call, so a
    token's rows are bit for bit those it gets alone (and so are its routing weights). The twins make no such
    promise (NumPy's products may block differently for different row counts)."""
    _run_cuda_c(host_module, monkeypatch)
    rng = np.random.default_rng(5)
    t, kk, e, n, c = 40, 2, 3, 9, 37
    x, w = to_cuda(rng.standard_normal((t, c)), dtype), to_cuda(rng.standard_normal((e, n, c)), dtype)
    logits = to_cuda(rng.standard_normal((t, e)))
    weights, ex = kael.moe_route(logits, kk, True)
    y = to_host(kael.expert_linear(x, w, ex))
    for i in (0, 17, t - 1):
        alone_w, alone_ex = kael.moe_route(logits[i : i + 1], kk, True)
        np.testing.assert_array_equal(to_host(alone_w), to_host(weights)[i : i + 1])
        np.testing.assert_array_equal(to_host(kael.expert_linear(x[i : i + 1], w, alone_ex)), y[i : i + 1])


@pytest.mark.parametrize("case", [c for c in fused_op_cases() if c.op in _moe.KERNELS], ids=lambda c: c.id)
def test_conformance_rows_through_the_cuda_c(emulate, monkeypatch, host_module, case):
    """The conformance kit's rows for both ops (every float dtype, empty, strided and broadcast operands, outputs
    guarded against stray writes), against the reference, with the CUDA C doing the work."""
    _run_cuda_c(host_module, monkeypatch)
    check_kernel(case, emulate, kael.device("cuda:0"))


def test_tiny_qwen3_moe_on_cuda_matches_cpu(kernels):
    """A random 2-layer Qwen3-MoE (8 experts, top 2 renormalised), its experts stacked: cuda's logits, through
    both kernels, are cpu's (the C++ backend, which runs the ops' decompositions)."""
    from kael.models.qwen3_moe import Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = Qwen3MoeConfig(
        vocab_size=61,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=32,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        norm_topk_prob=True,
    )
    cpu = Qwen3MoeForCausalLM(cfg, generator=kael.Generator().manual_seed(3), initializer_range=0.2)
    gpu = Qwen3MoeForCausalLM(cfg, generator=kael.Generator().manual_seed(3), initializer_range=0.2).to("cuda")
    gpu.fuse_experts()  # the experts' weights stacked again on the device (NOTE [stacked experts])
    ids = [[5, 17, 3, 59, 42, 7], [1, 2, 3, 4, 5, 6]]
    with kael.no_grad():
        want = cpu(kael.tensor(ids)).numpy()
        got, seen = ops_called(lambda: gpu(kael.tensor(ids, device="cuda")))
    assert seen.count("moe_route") == 2 and seen.count("expert_linear") == 4, seen  # [gate|up], then down
    np.testing.assert_allclose(to_host(got), want, rtol=1e-4, atol=1e-4)
