"""The Llama family's decode paths (kael/models/llama/_step.py and the generic pieces): the direct-kernel
``LlamaDecodeStep`` equals the general forward pass, batched rows of different lengths (BatchDecoder)
give exactly what each gives alone, a backend without the fused kernels falls back to the generic
step, and kael.models.generate / BatchDecoder / from_pretrained work unchanged for every family.

Oracles: the model's own full-sequence forward pass (no cache), generate on each prompt alone, and
transformers' greedy generate.
"""

from __future__ import annotations

from pathlib import Path

import kael
import numpy as np
import pytest
from kael import _dispatch
from kael.models import BatchDecoder, GenericStep, LlamaForCausalLM, decode_step, from_pretrained
from kael.models._generate import _prefill
from kael.models.llama import LlamaDecodeStep
from llama_checkpoints import build

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")


@pytest.fixture(scope="module", params=["llama", "qwen2", "mistral"])
def model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> LlamaForCausalLM:
    d = tmp_path_factory.mktemp(request.param)
    build(d, request.param, num_key_value_heads=1 if request.param == "mistral" else 2, seed=3)
    m = from_pretrained(d)
    assert isinstance(m, LlamaForCausalLM)
    return m


def _logits(m: LlamaForCausalLM, ids: list[int]) -> np.ndarray:
    with kael.no_grad():
        out: np.ndarray = m(kael.tensor([ids])).numpy()[0].copy()
    return out


def _fused_available() -> bool:
    return all(_dispatch.fused_kernel("cpu", op) is not None for op in ("rms_norm", "rope", "silu_mul"))


@pytest.mark.parametrize("direct", [True, False])
def test_decode_step_equals_the_general_forward_pass(model: LlamaForCausalLM, backend: str, direct: bool) -> None:
    if direct and not _fused_available():
        pytest.fail(f"the {backend!r} backend lacks rms_norm/rope/silu_mul kernels: no direct step to test")
    ids = [(7 * i + 3) % 320 for i in range(30)]
    cache = model.new_cache(max_positions=30)
    with kael.no_grad():
        model(kael.tensor([ids[:10]]), cache)
        decoder = decode_step(model, cache, direct)
        assert isinstance(decoder, LlamaDecodeStep) == direct and isinstance(decoder, GenericStep) != direct
        steps = []
        for t in ids[10:]:
            steps.append(decoder([0], [t]).numpy()[0].copy())
            cache.lengths[0] += 1
    assert cache.lengths == [30]
    np.testing.assert_allclose(np.stack(steps), _logits(model, ids)[10:], atol=2e-5, rtol=0)
    with pytest.raises(kael.ShapeError, match="past the cache"):
        decoder([0], [1])


def test_batched_rows_of_different_lengths_equal_each_alone(model: LlamaForCausalLM, backend: str) -> None:
    prompts = [[1, 2, 3], [5] * 9, [7, 8], [9, 4] * 10, [11]]
    steps = {0: 10, 1: 3, 2: 10, 3: 6, 4: 8}  # rows 1 and 3 leave early
    fed = {i: [(i * 7 + k) % 320 for k in range(steps[i])] for i in steps}
    joins, rows = {0: 0, 1: 0, 2: 3, 3: 5, 4: 5}, {0: 4, 1: 0, 2: 2, 3: 1, 4: 3}
    engine = BatchDecoder(model, rows=5)
    got: dict[int, list[np.ndarray]] = {i: [] for i in steps}
    done = dict.fromkeys(steps, 0)
    for step in range(16):
        for i in steps:
            if joins[i] == step:
                got[i].append(engine.prefill(rows[i], prompts[i]).numpy().copy())
        live = [i for i in steps if joins[i] <= step and done[i] < steps[i]]
        for i in steps:
            if joins[i] <= step and done[i] == steps[i] and engine.length(rows[i]):
                engine.release(rows[i])
        if live:
            logits = engine.decode([rows[i] for i in live], [fed[i][done[i]] for i in live]).numpy()
            for j, i in enumerate(live):
                got[i].append(logits[j].copy())
                done[i] += 1
    for i in steps:
        cache = model.new_cache(1, len(prompts[i]) + steps[i] + 1)
        with kael.no_grad():
            want = [_prefill(model, prompts[i], cache).numpy().copy()]
            decoder = decode_step(model, cache)  # the one-row step generate runs
            for t in fed[i]:
                want.append(decoder([0], [t]).numpy()[0].copy())
                cache.lengths[0] += 1
        assert len(got[i]) == len(want) == steps[i] + 1
        for a, b in zip(got[i], want):
            if backend == "reference":
                np.testing.assert_array_equal(a, b)  # one gemv per row: bit for bit
            else:
                np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
        # and the sequence's logits are those of the full forward pass
        full = _logits(model, prompts[i] + fed[i])
        np.testing.assert_allclose(np.stack(got[i]), full[len(prompts[i]) - 1 :], atol=2e-5, rtol=0)


def test_greedy_batched_equals_alone(model: LlamaForCausalLM, backend: str) -> None:
    rng = np.random.default_rng(0)
    prompts = [[int(t) for t in rng.integers(0, 320, size=k)] for k in (1, 6, 11, 3)]
    alone = [model.generate(p, 16) for p in prompts]
    engine = BatchDecoder(model, rows=4)
    firsts = engine.prefill_many([0, 1, 2, 3], prompts)
    out = [[t] for t in engine.greedy(firsts)]
    for _ in range(15):
        nxt = engine.greedy(engine.decode([0, 1, 2, 3], [o[-1] for o in out]))
        for o, t in zip(out, nxt):
            o.append(t)
    assert out == alone


def test_generate_without_fused_kernels(model: LlamaForCausalLM, backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A backend without the Llama kernels: the generic step over the decompositions, same tokens."""
    want = model.generate([4, 8, 15, 16, 23, 42], 20)
    real = _dispatch.fused_kernel
    missing = ("rms_norm", "rope", "silu_mul", "attention", "linear", "embedding")
    monkeypatch.setattr(_dispatch, "fused_kernel", lambda dev, op: None if op in missing else real(dev, op))
    assert model.decode_step(model.new_cache(1, 8)) is None
    assert isinstance(decode_step(model, model.new_cache(1, 8)), GenericStep)
    assert model.generate([4, 8, 15, 16, 23, 42], 20) == want


def test_step_positions(model: LlamaForCausalLM) -> None:
    """Evenly spaced positions are a view of the step's arange table; others a small int64 tensor."""
    kael.backends.use("cpu", "reference")
    try:
        step = decode_step(model, model.new_cache(4, 32))
        assert isinstance(step, LlamaDecodeStep)
        for pos in ([5], [4, 6, 8], [3, 3, 3], [2, 3, 7], [9, 1]):
            got = step.positions(pos)
            assert got.dtype is kael.int64 and got.tolist() == [[p] for p in pos]
        even = step.positions([4, 6, 8])
        assert even._storage is step.arange._storage  # no allocation
    finally:
        kael.backends.use("cpu", None)


def test_forward_errors_and_the_gradient_guard(model: LlamaForCausalLM) -> None:
    with pytest.raises(kael.DTypeError):
        model(kael.tensor([[1.0, 2.0]]))
    with pytest.raises(kael.ShapeError, match="context"):
        model(kael.zeros((1, 129), dtype=kael.int64))
    other = model.new_cache(1, 8)
    other.heads = 4  # a cache of another shape is refused
    with pytest.raises(kael.ShapeError, match="does not fit"):
        model(kael.tensor([[1]]), other)
    with pytest.raises(kael.KaelError, match="320"):
        model.generate([320], 2)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_fused_projections_equal_separate_ones(tmp_path: Path, backend: str, family: str) -> None:
    """A copy-mode load puts q/k/v and gate/up in one buffer each (the step runs one product for
    each); a mapped load keeps the file's tensors (separate products); both give the same logits."""
    build(tmp_path, family, seed=7, mlp_bias=family == "llama", attention_bias=family == "llama")
    fused, mapped = LlamaForCausalLM.from_pretrained(tmp_path), LlamaForCausalLM.from_pretrained(tmp_path, mmap=True)
    a = fused.model.layers[1].self_attn
    assert a.q_proj.weight._storage is a.k_proj.weight._storage is a.v_proj.weight._storage
    assert a.v_proj.weight.shape == (32, 64) and a.v_proj.weight.is_contiguous()
    assert a.k_proj.bias is not None and a.k_proj.bias._storage is a.v_proj.bias._storage
    assert (
        mapped.model.layers[1].self_attn.q_proj.weight._storage
        is not mapped.model.layers[1].self_attn.k_proj.weight._storage
    )
    for name, p in fused.named_parameters():  # the same values, names and shapes
        np.testing.assert_array_equal(p.detach().numpy(), dict(mapped.named_parameters())[name].detach().numpy())
    ids = [(5 * i + 1) % 320 for i in range(20)]
    got = {}
    for label, m in (("fused", fused), ("mapped", mapped)):
        cache = m.new_cache(max_positions=20)
        with kael.no_grad():
            m(kael.tensor([ids[:8]]), cache)
            step = decode_step(m, cache)
            if _fused_available():
                assert isinstance(step, LlamaDecodeStep)
                assert all((lay.qkv is not None) == (label == "fused") for lay in step.layers)
                assert all((lay.gate_up is not None) == (label == "fused") for lay in step.layers)
            rows = []
            for t in ids[8:]:
                rows.append(step([0], [t]).numpy()[0].copy())
                cache.lengths[0] += 1
        got[label] = np.stack(rows)
        np.testing.assert_allclose(got[label], _logits(m, ids)[8:], atol=2e-5, rtol=0)
    np.testing.assert_allclose(got["fused"], got["mapped"], atol=1e-5, rtol=0)
