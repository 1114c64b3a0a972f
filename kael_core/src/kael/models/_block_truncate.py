"""BlockPool.truncate: drop a sequence's unverified tail (rejected draft tokens), never a full block.

NOTE [draft tail]: speculative decoding appends draft tokens whose keys and values are written
by the verifying pass but which the target may reject. Because a block is registered in the
prefix index the moment it fills (NOTE [when blocks are registered] in _kv_blocks.py), the
engine only ever appends drafts that leave the last block not full (``kael.engine``'s
``KVManager.draft_room``), so no unverified token is ever part of a registered block; this
truncation then only drops positions of the not-full last block (and that block itself when
it becomes empty: it was never registered, so it goes straight back to the free list).
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable
from typing import TYPE_CHECKING

from .._errors import KaelError

if TYPE_CHECKING:
    from ._kv_blocks import BlockPool

__all__ = ["truncate_seq"]


def truncate_seq(pool: BlockPool, seq_id: Hashable, length: int) -> None:
    """Keep the first ``length`` tokens of ``seq_id`` (NOTE [draft tail]); KaelError, changing
    nothing, if that would cut into a full block or ``length`` is not a valid count."""
    seq = pool._seq("truncate", seq_id)
    n, bs = len(seq.tokens), pool.block_size
    lo = max(1, (n // bs) * bs)
    if isinstance(length, bool) or not isinstance(length, int) or not lo <= length <= n:
        raise KaelError(
            f"BlockPool.truncate: sequence {seq_id!r} holds {n} tokens; length must be an int in {lo}..{n} "
            f"(only the not-full last block's positions can be dropped: full blocks are registered), got {length!r}"
        )
    keep = -(-length // bs)
    for b in reversed(seq.table[keep:]):  # never full, so never registered: free, not cached
        pool._ref[b] -= 1
        if not pool._ref[b]:
            heapq.heappush(pool._free, b)
    del seq.table[keep:]
    del seq.tokens[length:]
