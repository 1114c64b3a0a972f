"""BlockPool (kael/models/_kv_blocks.py): bad input and broken invariants.

Bad arguments to the constructor, ``for_tokens``, ``block_keys`` and every operation raise a
``kael.KaelError`` subclass naming the call and the offending value, and change nothing (the
pool's ``snapshot`` is the same after); ``check`` names each invariant broken by corrupting a
pool's internals by hand.
"""

from __future__ import annotations

from typing import Any

import pytest
from block_pool_state import snapshot
from kael import KaelError, ShapeError
from kael.models._kv_blocks import BlockPool, block_keys


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
