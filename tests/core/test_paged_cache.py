"""PagedKVCache and BatchDecoder on it (kael/models/_paged_cache.py, _batched.py): issue #20.

Oracles: ``model.generate`` alone on a one-row ``model.new_cache()`` (token for token, and the
first logits), an engine without prefix caching (the same tokens and, within float rounding,
the same logits, with fewer positions computed), an unpreempted run (a preempted sequence
recomputed from its prompt and tokens so far continues with the same tokens), and the pool's
own counters. GPT-2 and a Llama-family model with grouped-query attention.
"""

from __future__ import annotations

from collections.abc import Sequence

import kael
import numpy as np
import pytest
from kael.models import GPT, BatchDecoder, KVCacheFull, LlamaConfig, LlamaForCausalLM, PagedKVCache


def _gpt2(seed: int = 0, ctx: int = 96) -> GPT:
    return GPT(97, ctx, 2, 4, 32, generator=kael.Generator().manual_seed(seed))


def _llama(seed: int = 0, ctx: int = 96) -> LlamaForCausalLM:
    cfg = LlamaConfig(
        vocab_size=101,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=ctx,
    )
    return LlamaForCausalLM(cfg, generator=kael.Generator().manual_seed(seed), initializer_range=0.3)


MODELS = {"gpt2": _gpt2, "llama": _llama}


def _prompt(rng: np.random.Generator, n: int, vocab: int) -> list[int]:
    return [int(t) for t in rng.integers(0, vocab, n)]


def _continue(engine: BatchDecoder, rows: Sequence[int], prompts: Sequence[list[int]], n: int) -> list[list[int]]:
    """Greedy: prefill every prompt (one call), then n - 1 decode steps of all rows together."""
    firsts = engine.prefill_many(list(rows), list(prompts))
    out = [[t] for t in engine.greedy(firsts)]
    for _ in range(n - 1):
        logits = engine.decode(list(rows), [o[-1] for o in out])
        for o, t in zip(out, engine.greedy(logits)):
            o.append(t)
    return out


@pytest.mark.parametrize("family", sorted(MODELS))
def test_paged_batches_equal_generate_alone_token_for_token(family: str) -> None:
    model = MODELS[family]()
    rng = np.random.default_rng(1)
    prompts = [_prompt(rng, n, model.vocab_size) for n in (5, 17, 33, 16)]
    want = [model.generate(p, 12) for p in prompts]
    engine = BatchDecoder(model, 4, block_size=16)
    assert engine.paged and isinstance(engine.cache, PagedKVCache)
    assert _continue(engine, range(4), prompts, 12) == want
    for r in range(4):
        engine.release(r)
    assert engine.cache.pool.used_blocks == 0
    engine.cache.pool.check()


@pytest.mark.parametrize("family", sorted(MODELS))
def test_prefix_cache_hit_gives_the_same_tokens_and_computes_only_the_suffix(family: str) -> None:
    model = MODELS[family]()
    rng = np.random.default_rng(2)
    shared = _prompt(rng, 40, model.vocab_size)  # two full blocks of 16 and 8 more tokens
    tails = [_prompt(rng, n, model.vocab_size) for n in (3, 9, 1)]
    prompts = [shared + t for t in tails]
    cold = BatchDecoder(model, 1, prefix_caching=False)
    warm = BatchDecoder(model, 1)
    for p in prompts:
        a = _continue(cold, [0], [p], 10)
        cold_first = cold.cache.cached[0]
        cold.release(0)
        b = _continue(warm, [0], [p], 10)
        hit = warm.cached_tokens(0)
        warm.release(0)
        assert a == b
        assert cold_first == 0
        assert a == [model.generate(p, 10)]
        if p is prompts[0]:
            assert hit == 0
        else:  # the shared 40 tokens: two whole blocks and 8 slots of the third (NOTE [partial block])
            assert 40 <= hit < len(p)
    stats = warm.kv_stats()
    assert stats["prefix_query_tokens"] == sum(len(p) for p in prompts)
    assert stats["prefix_hit_tokens"] >= 64
    assert cold.kv_stats()["prefix_hit_tokens"] == 0


def test_prefix_cache_hit_logits_match_a_full_prefill() -> None:
    model = _gpt2(3)
    rng = np.random.default_rng(3)
    shared = _prompt(rng, 48, model.vocab_size)
    warm = BatchDecoder(model, 2)
    warm.prefill(0, shared + [1, 2])
    hit = warm.prefill(1, shared + [5, 6, 7])
    assert warm.cached_tokens(1) == 48
    cold = BatchDecoder(model, 1, prefix_caching=False)
    full = cold.prefill(0, shared + [5, 6, 7])
    np.testing.assert_allclose(hit.numpy(), full.numpy(), rtol=1e-5, atol=1e-5)


def test_seeded_sampling_is_the_same_with_and_without_the_prefix_cache_and_batched() -> None:
    model = _llama(4)
    rng = np.random.default_rng(4)
    shared = _prompt(rng, 32, model.vocab_size)
    prompts = [shared + _prompt(rng, 4, model.vocab_size) for _ in range(3)]

    def run(engine: BatchDecoder, together: bool) -> list[list[int]]:
        gens = [kael.Generator().manual_seed(10 + i) for i in range(3)]
        if together:
            firsts = engine.prefill_many([0, 1, 2], prompts)
            out = [[engine.sample(kael.select(firsts, 0, i), 0.9, 20, gens[i])] for i in range(3)]
        else:
            out = [[engine.sample(engine.prefill(i, p), 0.9, 20, gens[i])] for i, p in enumerate(prompts)]
        for _ in range(8):
            logits = engine.decode([0, 1, 2], [o[-1] for o in out])
            for i in range(3):
                out[i].append(engine.sample(kael.select(logits, 0, i), 0.9, 20, gens[i]))
        return out

    alone = [
        model.generate(p, 9, 0.9, 20, generator=kael.Generator().manual_seed(10 + i)) for i, p in enumerate(prompts)
    ]
    assert run(BatchDecoder(model, 3), together=False) == alone
    assert run(BatchDecoder(model, 3), together=True) == alone
    assert run(BatchDecoder(model, 3, prefix_caching=False), together=True) == alone


def test_many_short_sequences_fit_in_the_memory_of_few_full_rows() -> None:
    model = _gpt2(5, ctx=128)
    # Memory of 2 rows of the full context: 256 tokens = 16 blocks; sequences of 8 + 8 tokens take one each.
    engine = BatchDecoder(model, 16, kv_cache_tokens=2 * 128)
    assert engine.cache.num_blocks == 16
    rng = np.random.default_rng(5)
    prompts = [_prompt(rng, 8, model.vocab_size) for _ in range(16)]
    got = _continue(engine, range(16), prompts, 8)
    assert got == [model.generate(p, 8) for p in prompts]
    assert engine.kv_stats()["blocks_used"] == 16


def test_a_full_pool_refuses_before_changing_anything_and_preemption_recomputes_the_same_tokens() -> None:
    model = _gpt2(6, ctx=64)
    rng = np.random.default_rng(6)
    prompts = [_prompt(rng, 14, model.vocab_size) for _ in range(3)]
    want = [model.generate(p, 20) for p in prompts]
    # 64 positions = 4 blocks of 16: one sequence of the full context, or three of up to 16 + ...
    engine = BatchDecoder(model, 3, kv_cache_tokens=64, prefix_caching=False)
    firsts = engine.prefill_many([0, 1, 2], prompts)
    out = [[t] for t in engine.greedy(firsts)]
    live = [0, 1, 2]
    preempted: list[int] = []
    while any(len(o) < 20 for o in out):
        for r in [r for r in live if len(out[r]) >= 20]:
            live.remove(r)
            engine.release(r)
        while preempted and engine.free_blocks * 16 >= len(prompts[preempted[0]]) + len(out[preempted[0]]) + 16:
            r = preempted.pop(0)  # recompute: the prompt and every token so far, in one prefill
            logits = engine.prefill(r, prompts[r] + out[r])
            out[r].append(engine.greedy(kael.reshape(logits, (1, -1)))[0])
            live.append(r)
        live = [r for r in live if len(out[r]) < 20]
        if not live:
            continue
        while engine.blocks_needed(live) > engine.free_blocks:
            newest = live.pop()  # the newest sequence gives its blocks back
            before = (engine.cache.pool.used_blocks, engine.length(live[0]) if live else 0)
            with pytest.raises(KVCacheFull):
                engine.decode(live + [newest], [out[r][-1] for r in live + [newest]])
            assert (engine.cache.pool.used_blocks, engine.length(live[0]) if live else 0) == before
            engine.preempt(newest)
            preempted.append(newest)
        logits = engine.decode(live, [out[r][-1] for r in live])
        for i, t in enumerate(engine.greedy(logits)):
            out[live[i]].append(t)
    assert engine.preemptions >= 1
    assert out == want


def test_fork_shares_blocks_and_copies_on_write() -> None:
    model = _llama(7)
    rng = np.random.default_rng(7)
    prompt = _prompt(rng, 21, model.vocab_size)  # the last block is shared half full after the fork
    engine = BatchDecoder(model, 3)
    first = engine.greedy(kael.reshape(engine.prefill(0, prompt), (1, -1)))[0]
    used = engine.cache.pool.used_blocks
    engine.fork(0, 1)
    engine.fork(0, 2)
    assert engine.cache.pool.used_blocks == used  # nothing copied yet
    out = [[first], [first], [first]]
    for _ in range(6):
        logits = engine.decode([0, 1, 2], [o[-1] for o in out])
        for o, t in zip(out, engine.greedy(logits)):
            o.append(t)
    want = model.generate(prompt, 7)
    assert out == [want, want, want]
    assert engine.cache.pool.used_blocks == used + 2  # two private copies of the shared last block
    engine.cache.pool.check()


def test_bad_arguments_are_named() -> None:
    model = _gpt2(8, ctx=64)
    with pytest.raises(kael.ShapeError, match="kv_cache_tokens"):
        BatchDecoder(model, 2, kv_cache_tokens=32)
    with pytest.raises(kael.ShapeError, match="block_size"):
        BatchDecoder(model, 2, block_size=0)
    engine = BatchDecoder(model, 2, kv_cache_tokens=64)
    engine.prefill(0, list(range(40)))
    with pytest.raises(KVCacheFull, match="free"):
        engine.prefill(1, list(range(50, 90)))
    assert not engine.active[1] and engine.length(1) == 0
    engine.cache.pool.check()


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("n", [1, 3, 9])
def test_extend_is_grow_one_position_at_a_time(shared: bool, n: int) -> None:
    # a row whose last block is half full, shared with a fork or not (copy-on-write), grown by n positions
    model = _llama(9)
    prompt = _prompt(np.random.default_rng(9), 21, model.vocab_size)
    one, many = BatchDecoder(model, 2, block_size=8), BatchDecoder(model, 2, block_size=8)
    for engine in (one, many):
        engine.prefill(0, prompt)
        if shared:
            engine.fork(0, 1)
    tokens = list(range(5, 5 + n))
    for t in tokens:
        one.cache.grow([0], [t])
    many.cache.extend([0], [tokens])
    assert many.cache.tables == one.cache.tables
    assert many.cache.pool.block_table(0) == one.cache.pool.block_table(0)
    assert many.cache.pool.free_blocks == one.cache.pool.free_blocks
    many.cache.pool.check()


def test_extend_refuses_before_changing_anything() -> None:
    model = _llama(10)
    engine = BatchDecoder(model, 2, block_size=8, kv_cache_tokens=96)  # 12 blocks
    rng = np.random.default_rng(10)
    engine.prefill_many([0, 1], [_prompt(rng, 40, model.vocab_size), _prompt(rng, 40, model.vocab_size)])
    tables, free = [list(t) for t in engine.cache.tables], engine.cache.pool.free_blocks
    assert free == 2
    with pytest.raises(KVCacheFull, match="need 3 new block"):
        engine.cache.extend([0], [[1] * 20])
    with pytest.raises(kael.ShapeError, match="would reach 136 positions, more than 96"):
        engine.cache.extend([0], [[1] * 96])
    with pytest.raises(KVCacheFull, match="2 row.s. need 3 new block"):  # each fits alone, not both
        engine.cache.extend([0, 1], [[1] * 16, [1] * 8])
    with pytest.raises(kael.ShapeError, match="row 2 is out of range"):
        engine.cache.extend([2], [[1]])
    assert engine.cache.tables == tables and engine.cache.pool.free_blocks == free
    engine.cache.extend([0], [[1] * 16])  # exactly the two free blocks
    assert engine.cache.pool.free_blocks == 0
    engine.cache.pool.check()
