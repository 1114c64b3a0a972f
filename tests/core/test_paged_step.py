"""PagedStep and the one KV cache behind ``model(ids, cache)`` (kael/models/_paged_step.py, issue #27).

``model.new_cache`` is the paged cache with one block per row and no prefix caching; a forward
pass reserves each row's slots itself. Oracles: the same model without a cache (NumPy
comparison of logits), and a cache of several small blocks per row (``paged_attention``) against
one block per row (``attention``) on the same tokens.
"""

from __future__ import annotations

import kael
import numpy as np
import pytest
from kael.models import PagedKVCache, decode_step
from tiny_causal_lms import tiny_causal_lm


def _no_cache(model: object, ids: list[int]) -> np.ndarray:
    with kael.no_grad():
        return model(kael.tensor([ids])).numpy()[0]  # type: ignore[operator]


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_new_cache_is_one_block_per_row_without_prefix_caching(family: str) -> None:
    model = tiny_causal_lm(family)
    cache = model.new_cache(batch=3, max_positions=20)
    assert isinstance(cache, PagedKVCache)
    assert (cache.num_blocks, cache.block_size, cache.table_width) == (3, 20, 1)
    assert not cache.prefix_caching
    assert cache.data[0].shape == (3, 2, model.num_kv_heads, 20, model.head_dim)
    with kael.no_grad():
        model(kael.tensor([[1, 2], [3, 4], [5, 6]]), cache, lengths=[2, 1, 0])
    assert cache.lengths == [2, 1, 0]
    assert cache.tables == [[0], [1], [2]]  # a fresh cache's rows hold consecutive blocks


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_rows_at_different_positions_match_the_model_without_a_cache(family: str) -> None:
    model = tiny_causal_lm(family)
    rng = np.random.default_rng(0)
    a, b = [int(t) for t in rng.integers(0, 60, 9)], [int(t) for t in rng.integers(0, 60, 9)]
    cache = model.new_cache(batch=2, max_positions=24)
    with kael.no_grad():
        first = model(kael.tensor([a[:5], b[:2] + [0, 0, 0]]), cache, lengths=[5, 2]).numpy()
        # rows now at 5 and 2: three more tokens each (the per-row path), then one each (lengths mask)
        second = model(kael.tensor([a[5:8], b[2:5]]), cache).numpy()
        third = model(kael.tensor([[a[8]], [b[5]]]), cache).numpy()
    want_a, want_b = _no_cache(model, a), _no_cache(model, b[:6])
    np.testing.assert_allclose(first[0], want_a[:5], atol=2e-5, rtol=0)
    np.testing.assert_allclose(first[1, :2], want_b[:2], atol=2e-5, rtol=0)
    np.testing.assert_allclose(second[0], want_a[5:8], atol=2e-5, rtol=0)
    np.testing.assert_allclose(second[1], want_b[2:5], atol=2e-5, rtol=0)
    np.testing.assert_allclose(third[0, 0], want_a[8], atol=2e-5, rtol=0)
    np.testing.assert_allclose(third[1, 0], want_b[5], atol=2e-5, rtol=0)
    assert cache.lengths == [9, 6]


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_small_blocks_give_the_bits_of_one_block_per_row(family: str) -> None:
    """Several blocks per row attend with paged_attention; up to 16 new tokens it computes exactly
    what attention over one block computes (NOTE [paged attention tasks])."""
    model = tiny_causal_lm(family)
    ids = [int(t) for t in np.random.default_rng(1).integers(0, 60, 19)]
    one = model.new_cache(max_positions=24)
    paged = PagedKVCache(
        model.num_layers, 1, model.num_kv_heads, model.head_dim, 24, block_size=4, prefix_caching=False
    )
    got = []
    with kael.no_grad():
        for cache in (one, paged):
            out = [model(kael.tensor([ids[:7]]), cache).numpy()[0]]
            step = decode_step(model, cache)
            for t in ids[7:]:
                out.append(step([0], [t]).numpy().copy())
                cache.lengths[0] += 1
            got.append(np.concatenate(out))
    assert paged.tables[0] == [0, 1, 2, 3, 4]  # 19 positions in blocks of 4
    np.testing.assert_array_equal(got[0], got[1])
    np.testing.assert_allclose(got[0], _no_cache(model, ids), atol=2e-5, rtol=0)


def test_right_padding_needs_one_block_per_row() -> None:
    model = tiny_causal_lm("gpt2")
    paged = PagedKVCache(
        model.num_layers, 2, model.num_kv_heads, model.head_dim, 24, block_size=4, prefix_caching=False
    )
    with kael.no_grad(), pytest.raises(kael.ShapeError, match="right-padded rows need one block per row"):
        model(kael.tensor([[1, 2, 3], [4, 5, 6]]), paged, lengths=[3, 1])
    assert paged.lengths == [0, 0] and paged.pool.used_blocks == 0  # nothing reserved


def test_a_cache_with_prefix_caching_is_not_reserved_with_made_up_ids() -> None:
    model = tiny_causal_lm("gpt2")
    shared = PagedKVCache(model.num_layers, 1, model.num_kv_heads, model.head_dim, 24, block_size=4)
    with kael.no_grad(), pytest.raises(kael.KaelError, match="with prefix caching on, start"):
        model(kael.tensor([[1, 2, 3]]), shared)
    assert shared.pool.used_blocks == 0
    shared.start(0, [1, 2, 3])  # with the prompt's ids it runs
    with kael.no_grad():
        got = model(kael.tensor([[1, 2, 3]]), shared).numpy()[0]
    np.testing.assert_allclose(got, _no_cache(model, [1, 2, 3]), atol=2e-5, rtol=0)


def test_a_full_cache_refuses_before_writing() -> None:
    model = tiny_causal_lm("gpt2")
    cache = model.new_cache(batch=1, max_positions=6)
    with kael.no_grad():
        model(kael.tensor([[1, 2, 3, 4]]), cache)
        with pytest.raises(kael.ShapeError, match="3 new token\\(s\\) after 4 cached ones exceed the cache's 6"):
            model(kael.tensor([[5, 6, 7]]), cache)
    assert cache.lengths == [4] and cache.pool.length(0) == 4


def test_reset_frees_a_row_and_it_starts_again_in_its_block() -> None:
    model = tiny_causal_lm("gpt2")
    cache = model.new_cache(batch=2, max_positions=10)
    with kael.no_grad():
        model(kael.tensor([[1, 2], [3, 4]]), cache)
        cache.reset(1)
        assert cache.lengths == [2, 0] and 1 not in cache.pool
        out = model(kael.tensor([[5], [6]]), cache).numpy()
    assert cache.tables == [[0], [1]] and cache.lengths == [3, 1]
    np.testing.assert_allclose(out[1, 0], _no_cache(model, [6])[0], atol=2e-5, rtol=0)
    np.testing.assert_allclose(out[0, 0], _no_cache(model, [1, 2, 5])[2], atol=2e-5, rtol=0)
