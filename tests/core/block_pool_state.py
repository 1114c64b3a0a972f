"""The observable state of a BlockPool (kael/models/_kv_blocks.py), for the tests/core/test_kv_blocks*.py files.

``snapshot`` gathers everything a caller can see of a pool (its sequences, their block tables and
lengths, every block's reference count and key, the cached order, the free count and the
counters), so a test can assert that a call which failed or only queried changed nothing.
"""

from __future__ import annotations

from typing import Any

from kael.models._kv_blocks import BlockPool

__all__ = ["snapshot"]


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
