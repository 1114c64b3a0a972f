"""Blocks behind every layer's sliding window go back to the pool (NOTE [sliding-window blocks] in
kael/models/_paged_cache.py, NOTE [released blocks] in _kv_blocks.py).

Oracles: transformers' greedy generation of the same random Mistral checkpoint (a window of 16, shorter than the
prompt and the generation), ``model.generate`` (its one-block cache keeps every position), the same paged decoder
with freeing turned off (logits bit for bit, on both CPU backends, direct and generic steps), each row alone, cold
prefills, and block counts worked out from the window: a row holds at most window / block_size + 1 blocks between
steps. A model with a layer that sees the whole context (Gemma 3's pattern, a mixed Llama) frees nothing.
"""

from __future__ import annotations

from typing import Any

import family_parity as fp
import kael
import llama_checkpoints
import numpy as np
import pytest
from kael.models import BatchDecoder, Gemma3Config, Gemma3ForCausalLM, LlamaConfig, LlamaForCausalLM, from_pretrained
from kael.models._kv_blocks import RELEASED
from kael.models.gemma2 import Gemma2Config, Gemma2ForCausalLM

WINDOW, BLOCK, NEW = 16, 8, 200
HF_NEW = 80  # transformers' greedy tokens to compare with (its generate is the slow part of this file)
MOST = -(-(WINDOW - 1) // BLOCK) + 1  # blocks a row holds between steps: positions p-15..p span 3 of 8 at most
PROMPT = [(37 * i + 11) % 320 for i in range(20)]


@pytest.fixture(scope="module")
def mistral(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, list[int]]:
    """A random Mistral (every layer slides through 16 positions, context 256) and transformers' greedy tokens."""
    pytest.importorskip("transformers")
    pytest.importorskip("torch")
    d = tmp_path_factory.mktemp("mistral-w16")
    hf = llama_checkpoints.build(d, "mistral", seed=3, sliding_window=WINDOW, max_position_embeddings=256)
    return from_pretrained(d), fp.hf_greedy(hf, PROMPT, HF_NEW)


def _held(cache: Any, row: int) -> int:
    return sum(b != RELEASED for b in cache.tables[row])


def _decode(dec: BatchDecoder, rows: list[int], firsts: list[int], new: int) -> tuple[list[list[int]], list[Any]]:
    """``new`` greedy tokens per row (the first given), decoded together; the logits of every step."""
    out, steps = [[t] for t in firsts], []
    for _ in range(new - 1):
        logits = dec.decode(rows, [o[-1] for o in out])
        steps.append(logits.numpy().copy())
        for o, t in zip(out, dec.greedy(logits)):
            o.append(t)
        dec.cache.pool.check()
        assert dec.cache.window is None or all(_held(dec.cache, r) <= MOST for r in rows)
    return out, steps


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "generic"])
def test_greedy_equals_transformers_while_blocks_go_back(mistral: Any, backend: str, direct: bool) -> None:
    model, want = mistral
    assert model.kv_window == WINDOW
    alone = model.generate(PROMPT, NEW)  # model.new_cache: one block per row, every position kept
    assert alone[: len(want)] == want and len(want) > 60  # (transformers would stop at the config's eos)
    runs = []
    for free in (True, False):
        dec = BatchDecoder(model, rows=1, block_size=BLOCK, direct=direct)
        if not free:
            dec.cache.window = None  # the same paged cache keeping every block
        first = dec.prefill(0, PROMPT)
        out, steps = _decode(dec, [0], dec.greedy(kael.reshape(first, 1, model.vocab_size)), NEW)
        runs.append((out[0], np.stack(steps)))
        length = len(PROMPT) + NEW - 1
        if free:  # 28 blocks of 8 hold the row; it keeps the 3 its next query reads, the pool has the rest
            assert dec.cache.lengths[0] == length and dec.cache.pool.used_blocks == _held(dec.cache, 0) <= MOST
            behind = (length - WINDOW + 1) // BLOCK  # blocks wholly before the window of position length - 1
            assert dec.cache.tables[0][:behind] == [RELEASED] * behind
            assert dec.cache.pool.free_blocks == dec.cache.num_blocks - dec.cache.pool.used_blocks
        else:
            assert dec.cache.pool.used_blocks == -(-length // BLOCK)
    assert runs[0][0] == runs[1][0] == alone
    np.testing.assert_array_equal(runs[0][1], runs[1][1])  # a released block changes no bit


def test_batched_rows_equal_each_alone(mistral: Any) -> None:
    model, _ = mistral
    rng = np.random.default_rng(1)
    prompts = [[int(t) for t in rng.integers(0, 320, size=k)] for k in (3, 30, 17)]
    alone = [model.generate(p, 40) for p in prompts]
    dec = BatchDecoder(model, rows=3, block_size=BLOCK)
    firsts = dec.greedy(dec.prefill_many([0, 1, 2], prompts))
    out, _ = _decode(dec, [0, 1, 2], firsts, 40)
    assert out == alone
    # a row of n positions last grew for query n - 1, which reads n - 16..n - 1: the blocks before went back
    want = [-(-n // BLOCK) - (n - WINDOW) // BLOCK for n in (len(p) + 39 for p in prompts)]
    assert [_held(dec.cache, r) for r in range(3)] == want == [3, 3, 2] and dec.cache.pool.used_blocks == sum(want)


def test_prefix_cache_reuses_released_blocks_only_while_all_present(mistral: Any) -> None:
    model, _ = mistral
    shared = PROMPT + [(5 * i + 2) % 320 for i in range(20)]  # 40 tokens: five whole blocks of 8
    p1, p2 = shared + [7], shared + [9, 10]
    alone = [model.generate(p, 24) for p in (p1, p2)]
    dec = BatchDecoder(model, rows=2, block_size=BLOCK)
    # row 0 releases the shared blocks; they stay cached
    out0, _ = _decode(dec, [0], dec.greedy(kael.reshape(dec.prefill(0, p1), 1, model.vocab_size)), 24)
    assert out0[0] == alone[0] and dec.cache.tables[0][:5] == [RELEASED] * 5 and dec.cache.pool.cached_blocks >= 5
    first = dec.prefill(1, p2)
    assert dec.cached_tokens(1) == 40  # all five found, the released ones among them
    np.testing.assert_allclose(first.numpy(), fp.logits(model, p2)[-1], rtol=0, atol=1e-5)
    assert _held(dec.cache, 1) == MOST  # its next query reads positions 25..40: the blocks before go back at once
    out1, _ = _decode(dec, [1], dec.greedy(kael.reshape(first, 1, model.vocab_size)), 24)
    assert out1[0] == alone[1]
    dec.release(1)
    # Evicting the prefix's head leaves its later blocks unreachable: no hit, and still the same tokens.
    dec.cache.pool.reset_prefix_cache()
    dec.cache.pool.check()
    first = dec.prefill(1, p2)
    assert dec.cached_tokens(1) == 0
    out1, _ = _decode(dec, [1], dec.greedy(kael.reshape(first, 1, model.vocab_size)), 24)
    assert out1[0] == alone[1]


def test_soft_capped_gemma2_with_every_layer_sliding_frees_and_keeps_its_tokens() -> None:
    # Gemma 2's soft-capped attention gathers every block of a row itself (cached_keys): a released one reads
    # as the row's first held block, whose keys the window masks.
    cfg = Gemma2Config(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
                       head_dim=8, max_position_embeddings=96, sliding_window=6,
                       layer_types=("sliding_attention",) * 2)  # fmt: skip
    model = Gemma2ForCausalLM(cfg, generator=kael.Generator().manual_seed(4), initializer_range=0.3)
    assert model.kv_window == 6
    prompt = [3, 9, 27, 17, 51, 25, 11, 33, 35, 41, 59]
    alone = model.generate(prompt, 50)
    dec = BatchDecoder(model, rows=1, block_size=4)
    first = dec.greedy(kael.reshape(dec.prefill(0, prompt), 1, 64))
    out = [first[0]]
    for _ in range(49):
        out.append(dec.greedy(dec.decode([0], [out[-1]]))[0])
        assert _held(dec.cache, 0) <= 3  # positions p-5..p span at most 3 blocks of 4
    assert out == alone and dec.cache.tables[0][0] == RELEASED


@pytest.mark.parametrize("kind", ["gemma3", "llama-mixed"])
def test_a_model_with_a_full_attention_layer_keeps_every_block(kind: str) -> None:
    gen = kael.Generator().manual_seed(5)
    if kind == "gemma3":  # every sixth layer full, as Gemma 3's pattern has it
        cfg: Any = Gemma3Config(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=6,
                                num_attention_heads=2, head_dim=8, max_position_embeddings=96, sliding_window=4)  # fmt: skip
        model: Any = Gemma3ForCausalLM(cfg, generator=gen)
    else:
        cfg = LlamaConfig(vocab_size=64, hidden_size=32, num_attention_heads=2, num_hidden_layers=2,
                          intermediate_size=48, max_position_embeddings=96, model_type="qwen2", layer_windows=(4, 0))  # fmt: skip
        model = LlamaForCausalLM(cfg, generator=gen)
    assert model.kv_window is None
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    alone = model.generate(prompt, 40)
    dec = BatchDecoder(model, rows=1, block_size=4)
    assert dec.cache.window is None
    out = dec.greedy(kael.reshape(dec.prefill(0, prompt), 1, 64))
    for _ in range(39):
        out.append(dec.greedy(dec.decode([0], [out[-1]]))[0])
    assert out == alone
    assert RELEASED not in dec.cache.tables[0] and dec.cache.pool.used_blocks == -(-(len(prompt) + 39) // 4)


def test_release_behind_window_counts_and_checks() -> None:
    cache = kael.models.PagedKVCache(1, 1, 1, 2, 32, num_blocks=8, block_size=4, window=5)
    cache.start(0, list(range(21)))  # nothing cached: the prefill's first query is position 0
    assert _held(cache, 0) == 6 and cache.pool.used_blocks == 6
    cache.lengths[0] = 21  # (as a step's commit leaves it)
    cache.grow([0], [1])  # the next query (21) reads 17..21: blocks 0-3 (positions 0..15) go back
    assert cache.tables[0][:4] == [RELEASED] * 4 and _held(cache, 0) == 2 and cache.pool.free_blocks == 6
    assert cache.block_ids(0)[:5] == [cache.tables[0][4]] * 5  # what the kernels read for a released entry
    with pytest.raises(kael.ShapeError, match="window must be an int >= 1"):
        kael.models.PagedKVCache(1, 1, 1, 2, 64, window=0)
    with pytest.raises(kael.ShapeError, match=r"position must be an int in 0\.\.22"):
        cache.pool.release_before(0, 23)
