"""BlockPool (kael/models/_kv_blocks.py): growing sequences while decoding.

``blocks_needed`` (the blocks a decode step over some sequences takes, and whether it fits),
appends that find no block, prompts that do not fit, and forks with copy-on-write of a shared,
not-full last block. Oracles: exact block tables, append results and counters worked out by
hand for small scenarios, and ``snapshot`` of the pool before and after a call that must change
nothing.
"""

from __future__ import annotations

import pytest
from block_pool_state import snapshot
from kael import KaelError, ShapeError
from kael.models._kv_blocks import Allocation, AppendResult, BlockPool, block_keys


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
