"""BlockPool (kael/models/_kv_blocks.py): the block manager of the paged KV cache with prefix caching.

Oracles: exact block tables, ``cached_tokens`` and counters worked out by hand for small
scenarios; and, for random operation sequences (a hypothesis state machine), a simulated
KV store: every block slot holds the token prefix its K/V would be computed from, written
exactly where the pool's answers tell a caller to write and copy. A position whose slot
does not hold its own sequence's prefix means the pool shared, reused or copied a block
wrongly. The machine also keeps its own copy of every block table (from the returned
values only), counts references itself, and runs with a digest that always collides.
"""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from kael import KaelError, ShapeError
from kael.models._kv_blocks import Allocation, AppendResult, BlockPool, block_keys, default_digest


def snapshot(pool: BlockPool) -> tuple[Any, ...]:
    seqs = pool.sequences()
    return (
        seqs,
        [pool.block_table(s) for s in seqs],
        [pool.length(s) for s in seqs],
        [pool.refcount(b) for b in range(pool.num_blocks)],
        [pool.key_of(b) for b in range(pool.num_blocks)],
        pool.cached_order(),
        pool.free_blocks,
        pool.queries_tokens,
        pool.hit_tokens,
        pool.evictions,
    )


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


def test_prompt_of_whole_blocks_recomputes_its_last_block() -> None:
    pool = BlockPool(8, 16)
    k0, k1 = block_keys(list(range(32)), 16)
    assert pool.allocate("a", list(range(32))) == Allocation((0, 1), 0)
    pool.free("a")
    assert pool.cached_order() == (1, 0)
    # At most len - 1 tokens come from the cache, rounded down to a block: 16 of 32. Block 0 is
    # revived; the second block is recomputed into the lowest free block, 2. When 2 fills it is a
    # twin of the cached block 1, so 2 adopts the registration and 1 goes back to the free list
    # (NOTE [twins]): nothing is left cached, and that is not an eviction.
    b = pool.allocate("b", list(range(32)))
    assert b == Allocation((0, 2), 16)
    assert pool.cached_order() == () and pool.evictions == 0
    assert (pool.key_of(0), pool.key_of(2), pool.key_of(1)) == (k0, k1, None)
    assert pool.free_blocks == 6  # blocks 1, 3, 4, 5, 6, 7
    # The lowest free block is now 1 again, then 3.
    assert pool.allocate("c", list(range(16))) == Allocation((1,), 0)  # one block: nothing can be cached
    assert pool.allocate("d", [5]) == Allocation((3,), 0)
    # The content b's block 2 holds is found there (in use): reusing it costs nothing.
    assert pool.allocate("e", [*range(32), 1]) == Allocation((0, 2, 4), 32)
    assert pool.hit_tokens == 48
    pool.check()


def test_a_live_twin_adopts_the_registration_of_its_cached_twin() -> None:
    # (Was: the twin takes over when the registered block is evicted. With adoption at fill time
    # the registered block is never left cached while a twin is in use, so nothing is evicted.)
    pool = BlockPool(3, 16)
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
    pool = BlockPool(3, 16)
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
    pool = BlockPool(4, 4)
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
    pool = BlockPool(4, 4)
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


def test_blocks_needed() -> None:
    pool = BlockPool(16, 4)
    pool.allocate("a", [1, 2, 3, 4])  # full: its next position starts a block
    pool.allocate("b", [1, 2, 3, 4, 5])  # shares a's block 0; position 4 in its own partial block 1
    pool.allocate("c", [7, 7])  # partial block 2, alone
    assert pool.blocks_needed([]) == 0
    assert pool.blocks_needed(["a"]) == 1
    assert pool.blocks_needed(["b", "c"]) == 0  # both write in place
    assert pool.blocks_needed(["c", "a", "b"]) == 1
    pool.fork("b", "b2")
    pool.fork("b", "b3")  # block 1 (partial) now has three holders
    # k appenders of a shared partial block with r holders copy min(k, r - 1) times: the last
    # holder left is alone and writes in place.
    assert [pool.blocks_needed(r) for r in (["b"], ["b", "b2"], ["b", "b2", "b3"])] == [1, 2, 2]
    assert pool.blocks_needed(["a", "b3", "c", "b"]) == 3
    free = pool.free_blocks
    before = snapshot(pool)
    pool.blocks_needed(["a", "b", "b2", "b3", "c"])
    assert snapshot(pool) == before  # changes nothing
    results = [pool.append(s, 9) for s in ("b3", "b", "b2", "a", "c")]
    assert [r is not None and (r.slot == 0 or r.copied_from is not None) for r in results] == [
        True,  # b3: a copy of block 1
        True,  # b: another copy
        False,  # b2: alone in block 1 now
        True,  # a: position 4 starts a block
        False,  # c: in place
    ]
    assert pool.free_blocks == free - 3
    pool.fork("a", "a2")  # a's last block (position 4 alone in it) is partial and shared now
    assert pool.blocks_needed(["a"]) == 1 and pool.blocks_needed(["a", "a2"]) == 1
    pool.check()


def test_blocks_needed_decides_whether_a_decode_step_fits() -> None:
    pool = BlockPool(3, 2)
    pool.allocate("a", [1, 2, 3])  # blocks 0, 1
    pool.fork("a", "b")  # shares 1 (partial)
    pool.allocate("c", [4, 5])  # block 2, full
    assert pool.free_blocks == 0
    assert pool.blocks_needed(["a"]) == 1 and pool.blocks_needed(["c"]) == 1
    assert pool.append("a", 0) is None and pool.append("c", 0) is None
    pool.free("c")  # block 2 cached
    assert pool.blocks_needed(["a", "b"]) == 1 == pool.free_blocks
    assert pool.append("a", 0) == AppendResult(2, 1, copied_from=1)  # evicts the cached block 2
    assert pool.append("b", 0) == AppendResult(1, 1)
    assert pool.evictions == 1 and pool.free_blocks == 0
    pool.check()


def test_blocks_needed_errors() -> None:
    pool = BlockPool(4, 4)
    pool.allocate("a", [1, 2])
    with pytest.raises(KaelError, match=r"BlockPool.blocks_needed: no live sequence 'zz'"):
        pool.blocks_needed(["a", "zz"])
    with pytest.raises(KaelError, match=r"BlockPool.blocks_needed: no live sequence \['a'\]"):
        pool.blocks_needed([["a"]])  # type: ignore[list-item]
    with pytest.raises(KaelError, match=r"BlockPool.blocks_needed: sequence 'a' is named twice in seq_ids"):
        pool.blocks_needed(["a", "a"])
    with pytest.raises(
        ShapeError, match=r"BlockPool.blocks_needed: seq_ids must be a sequence of sequence ids, got str"
    ):
        pool.blocks_needed("a")
    with pytest.raises(ShapeError, match=r"seq_ids must be a sequence of sequence ids, got set"):
        pool.blocks_needed({"a"})  # type: ignore[arg-type]


def test_none_when_the_prompt_does_not_fit_changes_nothing() -> None:
    pool = BlockPool(3, 4)
    pool.allocate("a", list(range(8)))
    pool.free("a")  # cached (1, 0), free {2}
    before = snapshot(pool)
    # 13 tokens = 4 blocks > 3 in the pool.
    assert pool.allocate("b", list(range(13))) is None
    # 4 blocks, one of them cached (block 0): 3 fresh needed, but reviving 0 leaves 2.
    assert pool.allocate("b", [0, 1, 2, 3, 9, 9, 9, 9, 9, 9, 9, 9, 9]) is None
    assert snapshot(pool) == before and "b" not in pool
    pool.check()
    # 3 blocks with block 0 reused fit exactly: 2 fresh (free 2, then the evicted 1).
    assert pool.allocate("b", [0, 1, 2, 3, 9, 9, 9, 9, 9]) == Allocation((0, 2, 1), 4)
    assert pool.free_blocks == 0
    before = snapshot(pool)
    assert pool.allocate("c", [1]) is None
    for t in range(3):  # fills the last block in place
        assert pool.append("b", t) == AppendResult(1, 1 + t)
    before = snapshot(pool)
    assert pool.append("b", 5) is None  # position 12 needs a fourth block
    assert snapshot(pool) == before
    pool.check()


def test_fork_and_copy_on_write() -> None:
    pool = BlockPool(8, 4)
    a_tokens = [1, 2, 3, 4, 5, 6]
    pool.allocate("a", a_tokens)
    assert pool.fork("a", "b") == Allocation((0, 1), 6)
    assert [pool.refcount(i) for i in range(3)] == [2, 2, 0]
    # b writes into the shared, not-full block 1: it gets a private copy of slots [0, 2) first.
    assert pool.append("b", 70) == AppendResult(2, 2, copied_from=1)
    assert pool.block_table("b") == (0, 2) and pool.block_table("a") == (0, 1)
    assert [pool.refcount(i) for i in range(3)] == [2, 1, 1]
    # a is now alone in block 1: it writes in place.
    assert pool.append("a", 80) == AppendResult(1, 2)
    assert pool.append("b", 71) == AppendResult(2, 3)  # fills b's block 2: registered under b's tokens
    assert pool.key_of(2) == block_keys([*a_tokens, 70, 71], 4)[1]
    assert pool.key_of(1) is None
    assert pool.append("b", 72) == AppendResult(3, 0)
    assert (pool.length("a"), pool.length("b")) == (7, 9)
    pool.check()
    # A fork whose last block is full shares only full blocks: appends take new blocks, never copies.
    pool.fork("b", "c")  # b's blocks (0, 2, 3); 3 is partial, so shared
    assert pool.append("c", 1) == AppendResult(4, 1, copied_from=3)
    assert pool.append("b", 2) == AppendResult(3, 1)
    pool.free("a")
    pool.free("b")
    pool.fork("c", "d")
    pool.free("c")
    assert pool.block_table("d") == (0, 2, 4)
    assert pool.append("d", 3) == AppendResult(4, 2)  # d is the only holder left: in place
    pool.check()
    pool.allocate("e", [1, 2, 3, 4])
    assert pool.fork("e", "f").block_table == (1,)
    assert pool.append("f", 9) == AppendResult(3, 0)  # position 4 starts a block: nothing to copy
    pool.check()


def test_copy_on_write_returns_none_without_a_block() -> None:
    pool = BlockPool(2, 4)
    pool.allocate("a", [1, 2, 3, 4, 5])
    pool.fork("a", "b")
    before = snapshot(pool)
    assert pool.append("b", 6) is None
    assert snapshot(pool) == before
    pool.free("a")
    assert pool.append("b", 6) == AppendResult(1, 1)  # alone now: in place
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


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: BlockPool(0), ShapeError, r"BlockPool: num_blocks must be an int >= 1, got 0"),
        (lambda: BlockPool(4, True), ShapeError, r"block_size must be an int >= 1, got True"),
        (
            lambda: BlockPool(4, 2.0),  # type: ignore[arg-type]
            ShapeError,
            r"block_size must be an int >= 1, got 2.0",
        ),
        (
            lambda: BlockPool(4, namespace=1),  # type: ignore[arg-type]
            ShapeError,
            r"namespace must be a str, got 1",
        ),
        (
            lambda: BlockPool(4, prefix_caching=1),  # type: ignore[arg-type]
            ShapeError,
            r"prefix_caching must be a bool, got 1",
        ),
        (
            lambda: BlockPool(4, _digest=b"x"),  # type: ignore[arg-type]
            ShapeError,
            r"_digest must be a callable",
        ),
        (lambda: BlockPool.for_tokens(0), ShapeError, r"BlockPool.for_tokens: tokens must be an int >= 1, got 0"),
        (lambda: block_keys([], 4), ShapeError, r"block_keys: tokens must hold at least one token id"),
        (lambda: block_keys([1], 0), ShapeError, r"BlockPool.block_keys: block_size must be an int >= 1, got 0"),
    ],
)
def test_construction_errors(call: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        call()


def test_operation_errors() -> None:
    pool = BlockPool(4, 4)
    pool.allocate("a", [1, 2])
    cases: list[tuple[Any, type[Exception], str]] = [
        (
            lambda: pool.allocate("a", [1]),
            KaelError,
            r"BlockPool.allocate: sequence 'a' is live already; free it first",
        ),
        (
            lambda: pool.allocate("b", []),
            ShapeError,
            r"BlockPool.allocate: tokens must hold at least one token id, got an empty",
        ),
        (
            lambda: pool.allocate("b", [1, -2]),
            ShapeError,
            r"BlockPool.allocate: token 1 must be a non-negative int, got -2",
        ),
        (lambda: pool.allocate("b", [True]), ShapeError, r"token 0 must be a non-negative int, got True"),
        (
            lambda: pool.allocate("b", [1.0]),  # type: ignore[list-item]
            ShapeError,
            r"token 0 must be a non-negative int, got 1.0",
        ),
        (
            lambda: pool.allocate("b", 5),  # type: ignore[arg-type]
            ShapeError,
            r"BlockPool.allocate: tokens must be a sequence of token ids, got int",
        ),
        (
            lambda: pool.allocate("b", "ab"),  # type: ignore[arg-type]
            ShapeError,
            r"tokens must be a sequence of token ids, got str",
        ),
        (
            lambda: pool.allocate(["b"], [1]),  # type: ignore[arg-type]
            KaelError,
            r"BlockPool.allocate: a sequence id must be hashable, got \['b'\]",
        ),
        (lambda: pool.append("a", -1), ShapeError, r"BlockPool.append: token must be a non-negative int, got -1"),
        (
            lambda: pool.append("a", "x"),  # type: ignore[arg-type]
            ShapeError,
            r"BlockPool.append: token must be a non-negative int, got 'x'",
        ),
        (lambda: pool.append("zz", 1), KaelError, r"BlockPool.append: no live sequence 'zz'"),
        (lambda: pool.free("zz"), KaelError, r"BlockPool.free: no live sequence 'zz'"),
        (
            lambda: pool.free(["a"]),  # type: ignore[arg-type]
            KaelError,
            r"BlockPool.free: no live sequence \['a'\]",
        ),
        (lambda: pool.fork("zz", "b"), KaelError, r"BlockPool.fork: no live sequence 'zz'"),
        (lambda: pool.fork("a", "a"), KaelError, r"BlockPool.fork: sequence 'a' is live already"),
        (lambda: pool.block_table(7), KaelError, r"BlockPool.block_table: no live sequence 7"),
        (lambda: pool.length(7), KaelError, r"BlockPool.length: no live sequence 7"),
        (lambda: pool.refcount(4), ShapeError, r"BlockPool.refcount: block must be an int in \[0, 4\), got 4"),
        (lambda: pool.key_of(-1), ShapeError, r"BlockPool.key_of: block must be an int in \[0, 4\), got -1"),
    ]
    before = snapshot(pool)
    for call, error, message in cases:
        with pytest.raises(error, match=message):
            call()
    assert snapshot(pool) == before  # bad input changes nothing
    pool.check()


def _corrupted(how: str) -> BlockPool:
    pool = BlockPool(4, 2)
    pool.allocate("a", [1, 2, 3])
    pool.allocate("b", [1, 2, 4])  # shares block 0
    pool.allocate("c", [5, 6])
    pool.free("c")  # block 3 cached
    if how == "negative":
        pool._ref[2] = -1
    elif how == "refcount":
        pool._ref[0] = 3
    elif how == "free and used":
        pool._free.append(0)
    elif how == "cached and used":
        pool._cached[0] = None
    elif how == "index":
        pool._index[b"bogus"] = 0
    elif how == "contents":
        pool._seqs["b"].tokens[0] = 9
    elif how == "length":
        pool._seqs["a"].tokens.extend([7, 7])
    elif how == "cached twin":  # the state the pool kept before twins adopted at fill time
        pool = BlockPool(4, 2)
        pool.allocate("d", [5, 6])
        pool.allocate("e", [5, 6])  # block 1: an unregistered twin of d's registered block 0
        del pool._seqs["d"]  # d leaves without the twin taking over: 0 cached, 1 still in use
        pool._ref[0] = 0
        pool._cached[0] = None
    return pool


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("negative", r"negative reference count -1"),
        ("refcount", r"block 0 has reference count 3 but 2 tables hold it"),
        ("free and used", r"block 0 is not exactly one of free/cached/in use"),
        ("cached and used", r"block 0 is not exactly one of free/cached/in use"),
        ("index", r"the index maps key 626f677573 to block 0, whose key is another"),
        ("contents", r"block 0 is shared by sequences with different tokens"),
        ("length", r"sequence 'a': 2 blocks for 5 tokens"),
        ("cached twin", r"cached block 0 has a twin in use \(blocks \[1\] hold its content\)"),
    ],
)
def test_check_reports_a_broken_invariant(how: str, message: str) -> None:
    _corrupted("none").check()
    with pytest.raises(KaelError, match=message) as caught:
        _corrupted(how).check()
    assert str(caught.value).startswith("BlockPool.check: ")


# --- random operation sequences against a simulated KV store ----------------------------------

# Prompts are a prefix of one of a few stems (which share prefixes of their own) plus a random
# tail from a small alphabet, so block-aligned prefixes repeat often.
STEMS = ([0, 1, 2, 0, 1, 2, 0, 1], [0, 1, 2, 0, 2, 2, 1, 0], [1, 1, 1, 1, 1, 1, 1, 1])
PROMPTS = st.builds(
    lambda stem, k, tail: (stem[:k] + tail) or [0],
    st.sampled_from(STEMS),
    st.integers(0, 8),
    st.lists(st.sampled_from([0, 1, 2]), max_size=4),
)


class PoolMachine(RuleBasedStateMachine):
    """Random allocate/append/fork/free/reset over a small pool, checked against a simulated KV store."""

    digest: Any = staticmethod(default_digest)
    exact_digest = True  # different contents never collide: every live full block is findable
    prefix_caching = True

    @initialize(num_blocks=st.integers(3, 12), block_size=st.integers(1, 4))
    def start(self, num_blocks: int, block_size: int) -> None:
        self.pool = BlockPool(num_blocks, block_size, prefix_caching=self.prefix_caching, _digest=self.digest)
        self.bs = block_size
        self.tokens: dict[int, list[int]] = {}  # each live sequence's tokens
        self.tables: dict[int, list[int]] = {}  # its block table, from the pool's answers only
        self.kv: dict[int, dict[int, tuple[int, ...]]] = {}  # block -> slot -> the prefix its K/V encodes
        self.next_id = 0
        self.hits = 0

    def write(self, block: int, slot: int, prefix: tuple[int, ...]) -> None:
        self.kv.setdefault(block, {})[slot] = prefix

    def others_hold(self, block: int, sid: int) -> bool:
        return any(block in t for s, t in self.tables.items() if s != sid)

    @precondition(lambda self: bool(self.tokens))
    @rule(data=st.data(), tail=st.lists(st.sampled_from([0, 1, 2]), max_size=3))
    def allocate_like(self, data: st.DataObject, tail: list[int]) -> None:
        """A prompt that starts like a live sequence (a twin of its blocks when it is all of them)."""
        toks = self.tokens[data.draw(st.sampled_from(sorted(self.tokens)))]
        self.allocate(toks[: data.draw(st.integers(1, len(toks)))] + tail)

    @rule(prompt=PROMPTS)
    def allocate(self, prompt: list[int]) -> None:
        pool, bs, n = self.pool, self.bs, len(prompt)
        sid, self.next_id = self.next_id, self.next_id + 1
        # What any live sequence's full blocks share with the prompt must be found (exact digest).
        common = 0
        for toks in self.tokens.values():
            k = 0
            while k + bs <= min(len(toks), n - 1) and toks[k : k + bs] == prompt[k : k + bs]:
                k += bs
            common = max(common, k)
        before = snapshot(pool)
        free_before = pool.free_blocks
        got = pool.allocate(sid, prompt)
        if got is None:
            event("allocate: None")
            assert snapshot(pool) == before
            assert -(-n // bs) > free_before  # it would have fitted in the free and cached blocks
            if self.prefix_caching and self.exact_digest:  # it would have fitted, reusing what live blocks hold
                assert -(-n // bs) - common // bs > free_before
            return
        c, table = got.cached_tokens, list(got.block_table)
        assert c % bs == 0 and 0 <= c <= n - 1 and len(table) == -(-n // bs) == len(set(table))
        if not self.prefix_caching:
            assert c == 0
        elif self.exact_digest:
            assert c >= common
        for p in range(c):  # the reused K/V is this prompt's own
            assert self.kv[table[p // bs]][p % bs] == tuple(prompt[: p + 1])
        for b in table[c // bs :]:  # what the caller writes is nobody else's
            assert not self.others_hold(b, sid)
        for p in range(c, n):
            self.write(table[p // bs], p % bs, tuple(prompt[: p + 1]))
        self.tokens[sid], self.tables[sid] = list(prompt), table
        self.hits += c
        assert pool.hit_tokens == self.hits
        event(f"allocate: {'hit' if c else 'miss'}")

    @precondition(lambda self: bool(self.tokens))
    @rule(data=st.data(), token=st.sampled_from([0, 1, 2]))
    def append(self, data: st.DataObject, token: int) -> None:
        self.append_to(data.draw(st.sampled_from(sorted(self.tokens))), token)

    def append_to(self, sid: int, token: int) -> bool | None:
        """Append ``token`` to ``sid`` and check the answer; whether it took a block (None: it failed)."""
        pool, bs = self.pool, self.bs
        toks, table = self.tokens[sid], self.tables[sid]
        p = len(toks)
        slot = p % bs
        shared = slot > 0 and self.others_hold(table[-1], sid)
        before = snapshot(pool)
        got = pool.append(sid, token)
        if got is None:
            event("append: None")
            assert snapshot(pool) == before
            assert (slot == 0 or shared) and pool.free_blocks == 0
            return None
        assert got.slot == slot
        if slot == 0:
            assert got.copied_from is None and got.block not in table
            table.append(got.block)
        elif shared:
            event("append: copy-on-write")
            assert got.copied_from == table[-1] and got.block not in table
            for s in range(slot):  # the caller's copy
                self.write(got.block, s, self.kv[got.copied_from][s])
            table[-1] = got.block
        else:
            assert got.copied_from is None and got.block == table[-1]
        assert not self.others_hold(got.block, sid)
        toks.append(token)
        self.write(got.block, slot, tuple(toks))
        return slot == 0 or shared

    @precondition(lambda self: bool(self.tokens))
    @rule(data=st.data(), token=st.sampled_from([0, 1, 2]))
    def decode_step(self, data: st.DataObject, token: int) -> None:
        """One token for each of some live sequences, checked first with ``blocks_needed``."""
        rows = data.draw(st.lists(st.sampled_from(sorted(self.tokens)), unique=True, min_size=1))
        pool = self.pool
        # The model's own count, from its tables alone: a row whose next position starts a block
        # takes one; a row in a not-full last block that another table still holds takes a copy,
        # and leaves that block to the others (so the last of them writes in place).
        holders = {b: sum(b in t for t in self.tables.values()) for t in self.tables.values() for b in t}
        expected = 0
        for sid in rows:
            last = self.tables[sid][-1]
            if len(self.tokens[sid]) % self.bs == 0:
                expected += 1
            elif holders[last] > 1:
                expected += 1
                holders[last] -= 1
        before = snapshot(pool)
        needed = pool.blocks_needed(rows)
        assert snapshot(pool) == before and needed == expected
        free_before = pool.free_blocks
        took = [self.append_to(sid, token) for sid in rows]
        if needed <= free_before:  # the decode step fits: every append succeeds and takes that many
            event("decode step: fits")
            assert None not in took and sum(bool(t) for t in took) == needed
            assert pool.free_blocks == free_before - needed
        else:  # it does not: some append finds no block (the caller would preempt first)
            event("decode step: preempt")
            assert None in took and pool.free_blocks == 0

    @precondition(lambda self: bool(self.tokens))
    @rule(data=st.data())
    def fork(self, data: st.DataObject) -> None:
        src = data.draw(st.sampled_from(sorted(self.tokens)))
        dst, self.next_id = self.next_id, self.next_id + 1
        got = self.pool.fork(src, dst)
        assert got == Allocation(tuple(self.tables[src]), len(self.tokens[src]))
        self.tokens[dst], self.tables[dst] = list(self.tokens[src]), list(self.tables[src])

    @precondition(lambda self: bool(self.tokens))
    @rule(data=st.data(), cache=st.sampled_from([True, True, True, False]))
    def free(self, data: st.DataObject, cache: bool) -> None:
        sid = data.draw(st.sampled_from(sorted(self.tokens)))
        self.pool.free(sid, cache=cache)
        del self.tokens[sid], self.tables[sid]
        assert sid not in self.pool

    @rule()
    def reset(self) -> None:
        self.pool.reset_prefix_cache()
        assert self.pool.cached_blocks == 0

    @invariant()
    def consistent(self) -> None:
        if not hasattr(self, "pool"):
            return
        pool, bs = self.pool, self.bs
        pool.check()
        assert set(pool.sequences()) == set(self.tokens)
        held = [0] * pool.num_blocks
        for sid, toks in self.tokens.items():
            table = self.tables[sid]
            assert pool.block_table(sid) == tuple(table) and pool.length(sid) == len(toks)
            for b in table:
                held[b] += 1
            for p in range(len(toks)):  # every position's K/V is its own sequence's
                assert self.kv[table[p // bs]][p % bs] == tuple(toks[: p + 1])
        assert [pool.refcount(b) for b in range(pool.num_blocks)] == held
        assert min(held) >= 0
        assert pool.used_blocks == sum(1 for h in held if h) and pool.free_blocks + pool.used_blocks == pool.num_blocks
        assert 0 <= pool.cached_blocks <= pool.free_blocks
        assert 0 <= pool.hit_tokens <= pool.queries_tokens and pool.evictions >= 0
        # A block held by two live sequences holds the same tokens for both.
        for s1, t1 in self.tables.items():
            for s2, t2 in self.tables.items():
                for i, b in enumerate(t1):
                    if s1 < s2 and b in t2:
                        j = t2.index(b)
                        assert (
                            i == j and self.tokens[s1][i * bs : (i + 1) * bs] == self.tokens[s2][j * bs : (j + 1) * bs]
                        )
        if not self.prefix_caching:
            assert pool.cached_blocks == 0 and all(pool.key_of(b) is None for b in range(pool.num_blocks))


SETTINGS = settings(
    max_examples=150, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


class CollidingMachine(PoolMachine):
    digest = staticmethod(lambda data: b"\0")  # every key equal
    exact_digest = False


class WeakDigestMachine(PoolMachine):
    digest = staticmethod(lambda data: bytes([hashlib.sha256(data).digest()[0] % 3]))  # 3 keys in all
    exact_digest = False


class NoCachingMachine(PoolMachine):
    prefix_caching = False


TestPool = PoolMachine.TestCase
TestPool.settings = SETTINGS
TestPoolCollidingDigest = CollidingMachine.TestCase
TestPoolCollidingDigest.settings = SETTINGS
TestPoolWeakDigest = WeakDigestMachine.TestCase
TestPoolWeakDigest.settings = SETTINGS
TestPoolNoCaching = NoCachingMachine.TestCase
TestPoolNoCaching.settings = settings(SETTINGS, max_examples=50)
