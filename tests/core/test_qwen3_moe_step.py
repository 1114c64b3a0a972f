"""The Qwen3-MoE direct decode step (kael/models/qwen3_moe/_step.py): ``Qwen3MoeDecodeStep`` gives the generic
step's logits bit for bit (NOTE [moe step = forward]) for one row and several, with the prefix cache, on every
layer pattern (every layer sparse, every second one, dense layers listed in ``mlp_only_layers``) and in
bfloat16; its rows decoded together equal each alone bit for bit; its greedy tokens are transformers'; and
where it cannot run (a backend without ``moe_route`` / ``expert_linear``, quantized or memory-mapped experts)
``decode_step`` gives the generic step.

Oracles: the generic step over the model's own forward (``GenericStep``), each row alone, transformers'
``Qwen3MoeForCausalLM`` greedy generate on the same weights.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import family_parity as fp
import kael
import numpy as np
import pytest
from kael import _dispatch
from kael.models import BatchDecoder, GenericStep, decode_step, from_pretrained
from kael.models._steps import step_kernels
from kael.models.qwen3_moe import Qwen3MoeDecodeStep, Qwen3MoeForCausalLM, Qwen3MoeSparseMoeBlock
from qwen3_moe_checkpoints import SHAPES, build

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

pair = fp.pair_fixture(SHAPES, build, Qwen3MoeForCausalLM)
MOE_OPS = ("moe_route", "expert_linear")


@pytest.fixture
def reference() -> Iterator[None]:
    """The CPU device on the NumPy reference backend (it has the step's kernels)."""
    kael.backends.use("cpu", "reference")
    try:
        yield
    finally:
        kael.backends.use("cpu", None)


def _direct(model: Any, backend: str) -> bool:
    """Whether ``backend`` runs the direct step; where it lacks a mixture-of-experts kernel, that the generic one
    runs instead (and ``direct=True`` is refused)."""
    if all(_dispatch.fused_kernel("cpu", op) is not None for op in MOE_OPS):
        return True
    assert backend != "reference"
    cache = model.new_cache()
    assert model.decode_step(cache) is None and isinstance(decode_step(model, cache), GenericStep)
    with pytest.raises(kael.KaelError, match="no fast decode step"):
        decode_step(model, cache, True)
    return False


def _run(model: Any, direct: bool, prompts: list[list[int]], plan: list[list[int]], **kw: Any) -> list[np.ndarray]:
    """Each prompt prefilled in its row, then a decode step of the rows ``plan[s]`` per step s (each fed its greedy
    token): the prefill logits and every step's logits."""
    engine = BatchDecoder(model, len(prompts), direct=direct, **kw)  # direct=True: the direct step or a KaelError
    firsts = engine.prefill_many(list(range(len(prompts))), prompts)
    out = [firsts.float().numpy().copy()]
    last = engine.greedy(firsts)
    for rows in plan:
        logits = engine.decode(rows, [last[r] for r in rows])
        out.append(logits.float().numpy().copy())
        for r, t in zip(rows, engine.greedy(logits), strict=True):
            last[r] = t
    return out


PROMPTS = [[(3 * i + r) % 200 for i in range(2 + 5 * r)] for r in range(4)]
# all rows, then rows alone and in other subsets and orders (n = 1 .. 4)
PLAN = [[0, 1, 2, 3]] * 4 + [[2], [3, 0], [1, 2, 3], [0], [3, 2, 1, 0]]


def test_step_runs_the_experts_of_the_sparse_layers(pair: fp.Pair, reference: None) -> None:
    """The step's sparse layers are the config's (every layer, every second, all but mlp_only_layers); each holds its
    router and the block's stacks themselves, and its Llama layer record no MLP."""
    model = pair[2]
    step = model.decode_step(model.new_cache(2))
    assert isinstance(step, Qwen3MoeDecodeStep)
    cfg = model.config
    assert [e is not None for e in step.experts] == [cfg.is_sparse(i) for i in range(cfg.num_hidden_layers)]
    for layer, lay, ex in zip(model.model.layers, step.layers, step.experts, strict=True):
        if ex is None:
            assert lay.down is not None and lay.gate_up is not None  # the dense SwiGLU, fused on load
            continue
        block = layer.mlp
        assert isinstance(block, Qwen3MoeSparseMoeBlock)
        gate_up, down = block.stacks() or (None, None)
        assert ex.router is block.gate.weight and ex.gate_up is gate_up and ex.down is down
        assert lay.gate is lay.up is lay.down is lay.gate_up is None
    assert (step.top_k, step.normalize) == (cfg.num_experts_per_tok, cfg.norm_topk_prob)


def test_direct_step_equals_the_generic_step(pair: fp.Pair, backend: str) -> None:
    """One to four rows a step, in any order: the direct step's logits are the generic step's, bit for bit."""
    model = pair[2]
    if not _direct(model, backend):
        return
    got, want = (_run(model, direct, PROMPTS, PLAN) for direct in (True, False))
    assert len(got) == len(want) == len(PLAN) + 1
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)


def test_direct_step_equals_the_generic_step_with_the_prefix_cache(pair: fp.Pair, backend: str) -> None:
    """Prompts that share cached blocks (blocks of 8): the same logits and hits through either step."""
    model = pair[2]
    if not _direct(model, backend):
        return
    shared = [(5 * i + 2) % 200 for i in range(20)]
    prompts = [shared + [7, 8], shared + [9], shared[:17] + [11, 12, 13]]
    plan = [[0, 1, 2]] * 5 + [[1], [2, 0]]
    got, want = (_run(model, direct, prompts, plan, block_size=8, prefix_caching=True) for direct in (True, False))
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)
    fp.check_prefix_cache(pair, hit_tokens=32)  # the direct step's rows together give each one's tokens alone


def test_batched_rows_equal_each_alone(pair: fp.Pair, backend: str) -> None:
    """Rows decoded together give each row's logits alone (bit for bit on the reference backend, whose
    expert_linear runs one product per row; within float rounding elsewhere)."""
    model = pair[2]
    if not _direct(model, backend):
        return
    together = _run(model, True, PROMPTS, [[0, 1, 2, 3]] * 6)
    for r, p in enumerate(PROMPTS):
        alone = _run(model, True, [p], [[0]] * 6)
        for a, b in zip(together, alone, strict=True):
            if backend == "reference":
                np.testing.assert_array_equal(a[r], b[0])
            else:
                np.testing.assert_allclose(a[r], b[0], rtol=0, atol=1e-5)


def test_greedy_with_the_direct_step_matches_transformers(pair: fp.Pair, backend: str) -> None:
    """32 greedy tokens through the KV cache and the direct step are transformers' greedy tokens."""
    _, hf, model = pair
    if not _direct(model, backend):
        return
    assert isinstance(decode_step(model, model.new_cache()), Qwen3MoeDecodeStep)
    ids = fp.PROMPTS[0]
    assert model.generate(ids, 32) == fp.hf_greedy(hf, ids, 32)


def test_a_bfloat16_model_casts_the_routing_weights_as_its_forward(pair: fp.Pair, reference: None) -> None:
    """bfloat16 weights: the routing weights (float32) are cast to bfloat16 before the weighted sum, as the
    forward's ``to`` does: the direct step's logits are still the generic step's, bit for bit."""
    model = from_pretrained(pair[0], dtype="bfloat16")
    assert model.dtype is kael.bfloat16
    step = model.decode_step(model.new_cache())
    assert isinstance(step, Qwen3MoeDecodeStep) and step.cast_weights
    got, want = (_run(model, direct, PROMPTS[:3], [[0, 1, 2]] * 3 + [[2], [1, 0]]) for direct in (True, False))
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("load", ["q8_0", "q4_0", "mmap"])
def test_unstacked_experts_run_the_generic_step(pair: fp.Pair, reference: None, load: str) -> None:
    """Quantized experts (one QuantizedLinear each) and a memory-mapped load (the file's tensors, not stacked) have
    no expert stacks: ``decode_step`` gives the generic step, and generate runs it to the forward's greedy tokens."""
    d = pair[0]
    model: Any = from_pretrained(d, mmap=True) if load == "mmap" else from_pretrained(d, weights=load)
    blocks = [layer.mlp for layer in model.model.layers if isinstance(layer.mlp, Qwen3MoeSparseMoeBlock)]
    assert blocks and all(b.stacks() is None for b in blocks)
    assert model.decode_step(model.new_cache()) is None
    assert isinstance(decode_step(model, model.new_cache()), GenericStep)
    kernels = step_kernels("cpu", (*Qwen3MoeDecodeStep.fused_ops, "paged_attention", "quantized_linear"))
    assert kernels is not None
    with pytest.raises(kael.KaelError, match="experts are not stacked"):  # made directly, not through create
        Qwen3MoeDecodeStep(model, model.new_cache(), kernels)
    ids = fp.PROMPTS[0]
    out = model.generate(ids, 6)
    seq = ids + out
    want = [int(np.argmax(row)) for row in fp.logits(model, seq[:-1])[len(ids) - 1 :]]
    assert out == want


def test_a_backend_without_a_moe_kernel_runs_the_generic_step(
    pair: fp.Pair, reference: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without either mixture-of-experts kernel the step is not made (the generic step decomposes them), with the
    same greedy tokens."""
    model = pair[2]
    want = model.generate(fp.PROMPTS[0], 8)
    real = _dispatch.fused_kernel
    for op in MOE_OPS:
        monkeypatch.setattr(_dispatch, "fused_kernel", lambda dev, name, op=op: None if name == op else real(dev, name))
        assert Qwen3MoeDecodeStep.create(model, model.new_cache()) is None
        assert isinstance(decode_step(model, model.new_cache()), GenericStep)
        assert model.generate(fp.PROMPTS[0], 8) == want
    monkeypatch.setattr(_dispatch, "fused_kernel", real)
