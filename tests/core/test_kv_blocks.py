"""BlockPool (kael/models/_kv_blocks.py), the block manager of the paged KV cache: prefix caching.

Hand-made scenarios of sharing a prompt's prefix with live and cached blocks, twins (a block
recomputed with the content of a registered one) adopting the registration, least-recently-used
eviction tail first, children dropped with an unreachable parent, chained and namespaced block
keys, a digest that collides, prefix caching turned off, resetting the cache, and the pool's
sizing and bookkeeping. Oracles: exact block tables, ``cached_tokens`` and counters worked out
by hand. Decode-time growth is in test_kv_blocks_decode.py, bad input and broken invariants in
test_kv_blocks_errors.py, random operation sequences in test_kv_blocks_state_machine.py.
"""

from __future__ import annotations

import hashlib

from kael.models._kv_blocks import Allocation, AppendResult, BlockPool, block_keys, default_digest

# --- hand-made scenarios ---------------------------------------------------------------------


def test_shared_prefix_is_reused() -> None:
    pool = BlockPool(64, 16)
    a = pool.allocate("a", list(range(40)))
    assert a == Allocation((0, 1, 2), 0)
    b = pool.allocate("b", list(range(32)) + [1000] * 8)
    assert b == Allocation((0, 1, 3), 32)
    assert [pool.refcount(i) for i in range(5)] == [2, 2, 1, 1, 0]
    assert (pool.queries_tokens, pool.hit_tokens, pool.evictions) == (80, 32, 0)
    assert (pool.used_blocks, pool.free_blocks, pool.cached_blocks) == (4, 60, 0)
    keys = block_keys(list(range(40)), 16)
    assert [pool.key_of(i) for i in range(4)] == [keys[0], keys[1], None, None]  # partial blocks have no key
    pool.check()
    # Freed, the full blocks stay cached (last block first in the eviction order); partial ones are free.
    pool.free("a")
    assert pool.cached_order() == () and pool.free_blocks == 61  # 0 and 1 are still b's
    pool.free("b")
    assert pool.cached_order() == (1, 0) and pool.free_blocks == 64 and pool.used_blocks == 0
    c = pool.allocate("c", list(range(33)))
    assert c == Allocation((0, 1, 2), 32)
    assert pool.cached_order() == () and pool.hit_tokens == 64
    pool.check()


def test_prompt_of_whole_blocks_copies_all_but_its_last_token() -> None:
    pool = BlockPool(8, 16)
    k0, k1 = block_keys(list(range(32)), 16)
    assert pool.allocate("a", list(range(32))) == Allocation((0, 1), 0)
    pool.free("a")
    assert pool.cached_order() == (1, 0)
    # At most len - 1 tokens come from the cache: block 0 whole (revived), then 15 slots of the
    # cached block 1 copied into the lowest free block, 2 (NOTE [partial block]), whose last slot
    # is computed. When 2 fills it is a twin of the cached block 1, so 2 adopts the registration
    # and 1 goes back to the free list (NOTE [twins]; its slots stay as they are until the caller
    # copies them, before its next call): nothing is left cached, and that is not an eviction.
    b = pool.allocate("b", list(range(32)))
    assert b == Allocation((0, 2), 31, 1)
    assert pool.cached_order() == () and pool.evictions == 0
    assert (pool.key_of(0), pool.key_of(2), pool.key_of(1)) == (k0, k1, None)
    assert pool.free_blocks == 6  # blocks 1, 3, 4, 5, 6, 7
    # The lowest free block is now 1 again, then 3. A one-block prompt copies 15 slots of b's block 0.
    assert pool.allocate("c", list(range(16))) == Allocation((1,), 15, 0)
    assert pool.allocate("d", [5]) == Allocation((3,), 0)  # nothing to reuse: its only token is computed
    # The content b's block 2 holds is found there (in use): reusing it costs nothing.
    assert pool.allocate("e", [*range(32), 1]) == Allocation((0, 2, 4), 32)
    assert pool.hit_tokens == 31 + 15 + 32
    pool.check()


def test_partial_block_takes_the_longest_match_and_only_written_blocks() -> None:
    pool = BlockPool(8, 4)
    pool.allocate("a", [1, 2, 3, 4, 9])  # block 0 = (1, 2, 3, 4), registered
    pool.allocate("b", [1, 2, 7, 7, 9])  # block 2 = (1, 2, 7, 7)
    # A prompt (1, 2, 3, 5, x): block 0 matches 3 tokens, block 2 only 2.
    assert pool.cached_prefix([1, 2, 3, 5, 0]) == 3
    assert pool.allocate("c", [1, 2, 3, 5, 0]) == Allocation((4, 5), 3, 0)
    # A block in use whose K/V is not written yet is no source (the caller says which are).
    assert pool.cached_prefix([1, 2, 7, 0], copyable=lambda b: 0 if b == 2 else 4) == 2  # block 0's (1, 2)
    got = pool.allocate("d", [1, 2, 7, 0], copyable=lambda b: 0 if b in (0, 2, 4) else 4)
    assert got == Allocation((6,), 0)
    # Never the last token, and never a whole block (that is a hit).
    assert pool.cached_prefix([1, 2, 3]) == 2 and pool.cached_prefix([1, 2, 3, 4]) == 3
    assert pool.cached_prefix([1, 2, 3, 4, 5]) == 4
    pool.check()


def test_a_block_in_use_is_a_source_for_its_written_slots_only() -> None:
    pool = BlockPool(8, 4)
    pool.allocate("a", [1, 2, 3, 4, 9])  # block 0 = (1, 2, 3, 4), in use; its K/V written as far as the caller says
    assert pool.cached_prefix([1, 2, 3, 5, 0], copyable=lambda b: 4) == 3
    assert pool.cached_prefix([1, 2, 3, 5, 0], copyable=lambda b: 2) == 2  # two slots written: two copied
    assert pool.cached_prefix([1, 2, 3, 5, 0], copyable=lambda b: 0) == 0
    assert pool.allocate("b", [1, 2, 3, 5, 0], copyable=lambda b: 2) == Allocation((2, 3), 2, 0)
    pool.check()


def test_a_live_twin_adopts_the_registration_of_its_cached_twin() -> None:
    # (Was: the twin takes over when the registered block is evicted. With adoption at fill time
    # the registered block is never left cached while a twin is in use, so nothing is evicted.)
    # Whole blocks only (NOTE [partial block]): a whole-block prompt recomputes its last block, a twin.
    pool = BlockPool(3, 16, partial_blocks=False)
    pool.allocate("a", list(range(32)))
    pool.free("a")  # cached (1, 0), free {2}
    # Block 0 is revived and 2 recomputes the second block: 2 adopts the registration of the
    # cached twin 1, which goes back to the free list. Cached (), free {1}, no eviction.
    assert pool.allocate("b", list(range(32))) == Allocation((0, 2), 16)
    assert (pool.cached_order(), pool.free_blocks, pool.evictions) == ((), 1, 0)
    # d takes the free block 1: no cached block had to go.
    assert pool.allocate("d", [7] * 16) == Allocation((1,), 0)
    assert pool.evictions == 0
    pool.free("d")  # 1 is full and registered with no twin: cached (1,)
    assert pool.cached_order() == (1,)
    # c's first two blocks are b's 0 and 2 (both in use, found in the index); its third (a
    # partial block) needs the one block left: the cached 1 is evicted for it, the first eviction.
    c = pool.allocate("c", [*range(32), 9])
    assert c == Allocation((0, 2, 1), 32)
    assert pool.evictions == 1 and pool.free_blocks == 0
    pool.check()


def test_a_full_pool_reuses_the_live_twin_not_the_cached_one() -> None:
    # The state machine's complete-reuse check (CI): b's recomputed second block 2 is a twin of
    # the cached block 1. Reviving 1 for c would leave no block for c's third one, although b's
    # blocks in use hold c's whole prefix: 2 adopted the registration, so c reuses 0 and 2 and
    # gets the free block 1.
    # Whole blocks only (NOTE [partial block]): a whole-block prompt recomputes its last block, a twin.
    pool = BlockPool(3, 16, partial_blocks=False)
    pool.allocate("a", list(range(32)))
    pool.free("a")
    assert pool.allocate("b", list(range(32))) == Allocation((0, 2), 16)
    assert pool.allocate("c", [*range(32), 9]) == Allocation((0, 2, 1), 32)
    assert pool.evictions == 0
    pool.check()


def test_twin_filled_by_append_adopts_too() -> None:
    pool = BlockPool(4, 2)
    pool.allocate("a", [1, 2, 3, 4])
    pool.free("a")  # cached (1, 0), free {2, 3}
    # [1, 2] is revived, position 2 goes into the fresh block 2; appending 4 fills it with the
    # content of the cached block 1, which 2 adopts: 1 goes back to the free list.
    assert pool.allocate("b", [1, 2, 3]) == Allocation((0, 2), 2)
    assert pool.append("b", 4) == AppendResult(2, 1)
    assert pool.cached_order() == () and pool.key_of(1) is None
    assert pool.key_of(2) == block_keys([1, 2, 3, 4], 2)[1] and pool.evictions == 0
    assert pool.allocate("c", [1, 2, 3, 4, 5]) == Allocation((0, 2, 1), 4)
    pool.check()


def test_twin_takes_over_when_the_registered_block_is_freed() -> None:
    # found by the state machine: the freed original must not hold a block the live twin already covers
    pool = BlockPool(10, 1)
    assert pool.allocate("a", [0]) == Allocation((0,), 0)
    assert pool.allocate("b", [0]) == Allocation((1,), 0)  # the last token is always computed: a twin
    pool.free("a")  # b's block takes over the registration; 0 goes back to the free list
    assert (pool.free_blocks, pool.cached_blocks, pool.used_blocks) == (9, 0, 1)
    got = pool.allocate("c", [0, 1, 2, 0, 1, 2, 0, 1, 0, 0])
    assert got == Allocation((1, 0, 2, 3, 4, 5, 6, 7, 8, 9), 1)  # b's block shared, nine fresh ones
    pool.check()


def test_eviction_is_least_recently_used_and_tail_first() -> None:
    pool = BlockPool(6, 4)
    x, y, z = [1, 2, 3, 4, 5, 6, 7, 8], [9, 9, 9, 9, 8, 8, 8, 8], [7, 7, 7, 7, 6, 6, 6, 6]
    assert pool.allocate("a", x) == Allocation((0, 1), 0)
    assert pool.allocate("b", y) == Allocation((2, 3), 0)
    assert pool.allocate("c", z) == Allocation((4, 5), 0)
    pool.free("b")
    pool.free("a")
    pool.free("c")
    assert pool.cached_order() == (3, 2, 1, 0, 5, 4)
    assert pool.free_blocks == 6 and pool.used_blocks == 0
    d = pool.allocate("d", [0] * 9)  # three fresh blocks: the three least recently used go
    assert d == Allocation((3, 2, 1), 0)
    assert pool.evictions == 3 and pool.cached_order() == (0, 5, 4)
    pool.check()
    # x's first block survived, its second did not; reviving block 0 leaves (5, 4) to evict.
    e = pool.allocate("e", [*x, 1])
    assert e == Allocation((0, 5, 4), 4)
    assert pool.evictions == 5 and pool.cached_order() == ()
    pool.free("d")  # d's blocks: 2 full (registered), 1 partial (free)
    pool.free("e")
    assert pool.cached_order() == (2, 3, 5, 0)  # d's tail first, then e's (its partial 4 is free)
    pool.check()


def test_a_hit_makes_a_block_most_recently_used() -> None:
    pool = BlockPool(4, 4)
    pool.allocate("a", [1, 1, 1, 1, 0])
    pool.allocate("b", [2, 2, 2, 2, 0])
    pool.free("a")
    pool.free("b")
    assert pool.cached_order() == (0, 2)
    pool.allocate("a2", [1, 1, 1, 1, 5])  # revives 0
    pool.free("a2")
    assert pool.cached_order() == (2, 0)
    pool.allocate("big", [3] * 16)  # all four blocks: 1, 3 free, then 2, then 0
    assert pool.block_table("big") == (1, 3, 2, 0)
    assert pool.evictions == 2
    pool.check()


def test_appending_after_adopting_a_twin() -> None:
    # Whole blocks only (NOTE [partial block]): a whole-block prompt recomputes its last block, a twin.
    pool = BlockPool(4, 4, partial_blocks=False)
    x, y, z = [1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]
    pool.allocate("a", x + y)
    pool.free("a")  # cached (1, 0), free {2, 3}
    # x is revived (block 0); y is recomputed into 2, which adopts the cached twin 1's
    # registration: 1 goes back to the free list. Cached (), free {1, 3}.
    assert pool.allocate("b", x + y) == Allocation((0, 2), 4)
    assert pool.cached_order() == () and pool.key_of(1) is None
    # Position 8 starts a block: the lowest free one, 1, which z fills and registers.
    assert [pool.append("b", t) for t in z] == [
        AppendResult(1, 0),
        AppendResult(1, 1),
        AppendResult(1, 2),
        AppendResult(1, 3),
    ]
    assert pool.key_of(1) == block_keys(x + y + z, 4)[2]
    # b's table (0, 2, 1) is released last first; each block is registered with no twin: cached.
    pool.free("b")
    assert pool.cached_order() == (1, 2, 0) and pool.free_blocks == 4
    # Two fresh blocks: the free 3, then the least recently used cached block, 1 (the tail z,
    # which has no children). x and y (blocks 0 and 2) stay cached.
    assert pool.allocate("c", [0] * 8) == Allocation((3, 1), 0)
    assert pool.evictions == 1 and pool.cached_order() == (2, 0) and pool.free_blocks == 2
    pool.free("c")  # (3, 1) released last first: cached (2, 0, 1, 3)
    assert pool.cached_order() == (2, 0, 1, 3)
    # x and y are found (0 and 2, revived); z is gone, so z and the last token need two fresh
    # blocks: 1, then 3 (the least recently used), two more evictions.
    assert pool.allocate("d", [*x, *y, *z, 1]) == Allocation((0, 2, 1, 3), 8)
    assert pool.evictions == 3 and pool.free_blocks == 0
    pool.check()


def test_adopting_a_twin_keeps_its_cached_children_reachable() -> None:
    # Whole blocks only (NOTE [partial block]): a whole-block prompt recomputes its last block, a twin.
    pool = BlockPool(4, 4, partial_blocks=False)
    x, y, z = [1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]
    pool.allocate("a", x + y + z)
    pool.free("a")  # cached (2, 1, 0), free {3}
    # x revived (0); y recomputed into 3, which adopts 1's registration (1: free). z (block 2)
    # stays cached: its parent content y is now held by 3.
    assert pool.allocate("b", x + y) == Allocation((0, 3), 4)
    assert pool.cached_order() == (2,) and pool.free_blocks == 2
    # x and y in use (0, 3), z cached (2, revived), and the last token in the free block 1.
    assert pool.allocate("c", [*x, *y, *z, 5]) == Allocation((0, 3, 2, 1), 12)
    assert pool.evictions == 0 and pool.free_blocks == 0
    pool.check()


def test_unreachable_children_are_dropped_with_their_parent() -> None:
    pool = BlockPool(4, 4)
    x, y, z = [1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]
    assert pool.allocate("a", x + y + z) == Allocation((0, 1, 2), 0)
    assert pool.allocate("b", [*x, 0]) == Allocation((0, 3), 4)  # shares x's block 0
    pool.free("a")  # 2 and 1 cached (tail first); 0 is still b's
    assert pool.cached_order() == (2, 1)
    # b's K/V is not to be trusted: block 3 (partial) and block 0 go back to the free list. Nobody
    # holds x's content any more, so its registered child 1 can never be found again, nor 1's
    # child 2: both are dropped from the cache, and counted as evictions.
    pool.free("b", cache=False)
    assert pool.cached_order() == () and pool.free_blocks == 4 and pool.evictions == 2
    assert [pool.key_of(i) for i in range(4)] == [None] * 4
    assert pool.allocate("d", [*x, *y, *z, 1]) == Allocation((0, 1, 2, 3), 0)  # nothing left to reuse
    pool.check()


def test_namespaces_give_different_keys() -> None:
    tokens = list(range(16))
    m1, m2 = BlockPool(4, 16, namespace="model-1"), BlockPool(4, 16, namespace="model-2")
    m1.allocate("a", tokens)
    m2.allocate("a", tokens)
    k1, k2 = block_keys(tokens, 16, "model-1")[0], block_keys(tokens, 16, "model-2")[0]
    assert m1.key_of(0) == k1 and m2.key_of(0) == k2 and k1 != k2
    assert block_keys(tokens, 16)[0] not in (k1, k2)
    seen: list[bytes] = []

    def spy(data: bytes) -> bytes:
        seen.append(data)
        return default_digest(data)

    BlockPool(4, 4, namespace="gpt2:deadbeef", _digest=spy).allocate("a", [1, 2, 3, 4, 5])
    assert len(seen) == 1 and b"gpt2:deadbeef" in seen[0] and b"1,2,3,4" in seen[0]


def test_keys_are_chained_and_unambiguous() -> None:
    # The key of block 1 depends on block 0; [1, 23] and [12, 3] encode differently.
    assert block_keys([1, 2, 3, 4], 2)[1] != block_keys([9, 9, 3, 4], 2)[1]
    assert block_keys([1, 23], 2) != block_keys([12, 3], 2)
    assert block_keys([5, 6], 2, digest=lambda d: hashlib.sha256(d).digest()) == [
        hashlib.sha256(b"kael-kv-block\x00" + b"0:" + b"0:" + b"3:5,6").digest()
    ]
    assert block_keys([1, 2, 3], 2, "ns") == [block_keys([1, 2], 2, "ns")[0]]


def test_prefix_caching_off() -> None:
    pool = BlockPool(8, 4, prefix_caching=False)
    assert pool.allocate("a", list(range(9))) == Allocation((0, 1, 2), 0)
    assert pool.allocate("b", list(range(9))) == Allocation((3, 4, 5), 0)
    assert all(pool.key_of(b) is None for b in range(8))
    for t in range(3):
        pool.append("a", t)
    pool.free("a")
    pool.free("b")
    assert pool.cached_blocks == 0 and pool.free_blocks == 8
    assert pool.allocate("c", list(range(9))) == Allocation((0, 1, 2), 0)
    assert (pool.queries_tokens, pool.hit_tokens, pool.evictions) == (27, 0, 0)
    pool.check()


def test_colliding_digest_never_shares_different_contents() -> None:
    pool = BlockPool(16, 4, _digest=lambda data: b"same")
    pool.allocate("a", [1, 1, 1, 1, 1, 1, 1, 1])  # two blocks with the same tokens and (here) the same key
    assert pool.key_of(0) == pool.key_of(1) == b"same"
    # Block 1 matches neither at depth 0 (block 0 holds that key) nor is block 0 reused at depth 1.
    assert pool.allocate("b", [1] * 9) == Allocation((0, 2, 3), 4)
    assert pool.allocate("c", [2, 2, 2, 2, 0]) == Allocation((4, 5), 0)
    assert pool.allocate("d", [1, 1, 1, 1, 0]) == Allocation((0, 6), 4)
    pool.check()


def test_reset_prefix_cache_forgets_cached_blocks_only() -> None:
    pool = BlockPool(6, 4)
    pool.allocate("a", list(range(8)))
    pool.allocate("b", [9] * 5)
    pool.free("a")
    assert pool.cached_order() == (1, 0)
    pool.reset_prefix_cache()
    assert pool.cached_blocks == 0 and pool.free_blocks == 4 and pool.evictions == 0
    assert pool.allocate("c", list(range(9))) == Allocation((0, 1, 4), 0)  # b holds 2 and 3
    assert pool.allocate("d", [9] * 5) == Allocation((2, 5), 4)  # b's block is in use: still registered
    pool.check()


def test_free_without_caching() -> None:
    pool = BlockPool(4, 4)
    pool.allocate("a", list(range(8)))
    pool.free("a", cache=False)  # its K/V was never written
    assert pool.cached_blocks == 0 and pool.free_blocks == 4
    assert pool.allocate("b", list(range(9))) == Allocation((0, 1, 2), 0)
    pool.check()


def test_sequences_lengths_and_sizing() -> None:
    pool = BlockPool.for_tokens(100, 16)
    assert (pool.num_blocks, pool.block_size, pool.prefix_caching) == (7, 16, True)
    pool.allocate(3, [1, 2])
    pool.allocate("x", [1])
    pool.fork(3, ("n", 1))
    assert pool.sequences() == (3, "x", ("n", 1))
    assert 3 in pool and ("n", 1) in pool and 4 not in pool and [1] not in pool
    pool.append("x", 5)
    assert (pool.length(3), pool.length("x")) == (2, 2)
    pool.free("x")
    assert pool.sequences() == (3, ("n", 1))
    assert repr(pool) == "BlockPool(num_blocks=7, block_size=16, prefix_caching=True, used=1, cached=0, sequences=2)"
