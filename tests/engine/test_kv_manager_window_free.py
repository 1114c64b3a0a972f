"""The engine's block accounting on a model whose every layer slides (NOTE [sliding-window blocks] in
kael/models/_paged_cache.py): ``KVManager.grow`` gives back the blocks behind the window before it counts, so
long generations fit a pool that could not hold them whole.

Oracle: ``model.generate`` on each prompt alone (its one-block cache keeps every position), and the same engine
with the cache keeping every block, which must preempt where the freeing one does not.
"""

from __future__ import annotations

from typing import Any

import kael
import numpy as np
import pytest
from kael.engine import EngineCore, NgramProposer, Request, SamplingParams, Speculator
from kael.models import BatchDecoder, LlamaConfig, LlamaForCausalLM
from kael.models._kv_blocks import RELEASED

WINDOW, BLOCK, CTX = 12, 8, 128
MOST = -(-(WINDOW - 1) // BLOCK) + 1  # blocks 12 positions (p-11..p) can span: 3 of 8
PARAMS = SamplingParams(max_tokens=90, temperature=0.0)


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    cfg = LlamaConfig(vocab_size=97, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
                      intermediate_size=64, max_position_embeddings=CTX, model_type="mistral",
                      layer_windows=(WINDOW, WINDOW))  # fmt: skip
    return LlamaForCausalLM(cfg, generator=kael.Generator().manual_seed(0), initializer_range=0.3)


def _prompts() -> list[list[int]]:
    rng = np.random.default_rng(7)
    return [rng.integers(0, 97, size=k).tolist() for k in (20, 14, 25)]


def _run(model: Any, *, free: bool, speculator: Speculator | None = None) -> tuple[list[list[int]], EngineCore]:
    # 16 blocks of 8: one context. Each request reaches 104..115 positions, 13..15 blocks when kept whole.
    decoder = BatchDecoder(model, rows=3, block_size=BLOCK, kv_cache_tokens=CTX)
    if not free:
        decoder.cache.window = None
    core = EngineCore.on(decoder, max_num_batched_tokens=32, speculator=speculator)
    reqs = [Request(p, PARAMS) for p in _prompts()]
    for r in reqs:
        core.add(r)
    steps = 0
    while core.has_unfinished:
        for e in core.step():
            assert e.error is None, e.error
        decoder.cache.pool.check()
        for r in reqs:  # a row that decoded holds the blocks its last query read (and its drafts'): 3 at most
            if free and r.row is not None and len(r.output_ids) > 1:
                assert sum(b != RELEASED for b in decoder.cache.tables[r.row]) <= MOST
        steps += 1
        assert steps < 3000, "the engine makes no progress"
    return [r.output_ids for r in reqs], core


def test_long_generations_fit_without_preemption_and_equal_alone(model: LlamaForCausalLM) -> None:
    assert model.kv_window == WINDOW
    alone = [model.generate(p, PARAMS.max_tokens) for p in _prompts()]
    out, core = _run(model, free=True)
    assert out == alone and core.scheduler.preemptions == 0
    kept, core = _run(model, free=False)  # the same pool keeping every block must preempt
    assert kept == alone and core.scheduler.preemptions > 0


def test_speculative_drafts_and_their_truncation_keep_the_tokens(model: LlamaForCausalLM) -> None:
    # drafts are grown, verified and truncated after the blocks behind the window went back
    alone = [model.generate(p, PARAMS.max_tokens) for p in _prompts()]
    spec = Speculator(NgramProposer(n_max=3, k=4))
    out, core = _run(model, free=True, speculator=spec)
    assert out == alone and core.scheduler.preemptions == 0


def test_a_grow_counts_the_block_its_window_gives_back(model: LlamaForCausalLM) -> None:
    # Blocks of 11 positions: the query at 22 starts block 2 while block 0 (positions 0..10) leaves its window
    # (11..22), so with no free block the grow still fits: the block goes back before the blocks are counted.
    decoder = BatchDecoder(model, rows=2, block_size=11, kv_cache_tokens=CTX)  # 12 blocks
    core = EngineCore.on(decoder)
    prompt = _prompts()[0] + [1, 2]  # 22 positions: two whole blocks
    a = Request(prompt, SamplingParams(max_tokens=5, temperature=0.0))
    core.add(a)
    core.step()  # a's prefill
    assert a.num_computed == 22 and decoder.cache.pool.free_blocks == 10
    filler = Request(np.random.default_rng(8).integers(0, 97, size=110).tolist(), PARAMS)
    assert core.kv.start(filler, 110) and core.kv.free_blocks == 0  # (outside the scheduler: it only holds blocks)
    core.step()
    assert core.last_plan is not None and not core.last_plan.preempted and a.row is not None
    assert decoder.cache.tables[a.row][0] == RELEASED and core.kv.free_blocks == 0
    while core.has_unfinished:
        core.step()
    assert a.output_ids == model.generate(prompt, 5) and core.scheduler.preemptions == 0
    core.kv.free(filler, keep=False)  # its keys and values were never computed
    decoder.cache.pool.check()
