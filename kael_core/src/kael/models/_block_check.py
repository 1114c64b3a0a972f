"""BlockPool.check: every invariant of the pool's bookkeeping (NOTE [block states] in _kv_blocks.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._errors import KaelError
from ._block_records import RELEASED

if TYPE_CHECKING:
    from ._kv_blocks import BlockPool

__all__ = ["check_pool"]


def check_pool(self: BlockPool) -> None:
    """Raise KaelError naming the first violated invariant of the pool (NOTE [block states])."""

    def fail(what: str) -> None:
        raise KaelError(f"BlockPool.check: {what}")

    n, bs = self.num_blocks, self.block_size
    free = set(self._free)
    if len(free) != len(self._free):
        fail(f"a block is twice in the free list {sorted(self._free)}")
    counts = [0] * n
    for sid, seq in self._seqs.items():
        if len(seq.table) != -(-len(seq.tokens) // bs) or not seq.tokens:
            fail(f"sequence {sid!r}: {len(seq.table)} blocks for {len(seq.tokens)} tokens")
        gone = next((i for i, b in enumerate(seq.table) if b != RELEASED), len(seq.table))
        held = seq.table[gone:]
        if RELEASED in held or gone > len(seq.tokens) // bs:
            fail(f"sequence {sid!r}'s released blocks are not a leading run of full blocks: {seq.table}")
        if len(set(held)) != len(held):
            fail(f"sequence {sid!r} holds a block twice: {seq.table}")
        for b in held:
            if not 0 <= b < n:
                fail(f"sequence {sid!r} holds block {b}, out of range")
            counts[b] += 1
    for b in range(n):
        states = [b in free, b in self._cached, self._ref[b] > 0]
        if self._ref[b] < 0:
            fail(f"block {b} has a negative reference count {self._ref[b]}")
        if self._ref[b] != counts[b]:
            fail(f"block {b} has reference count {self._ref[b]} but {counts[b]} tables hold it")
        if sum(states) != 1:
            fail(f"block {b} is not exactly one of free/cached/in use: {states}")
        if b in self._cached and not self._registered(b):
            fail(f"cached block {b} is not registered")
        if b in self._cached and self._holders.get(self._cid[b]) != {b}:
            others = sorted(self._holders.get(self._cid[b], set()) - {b})
            fail(f"cached block {b} has a twin in use (blocks {others} hold its content)")
        if b in free and (self._key[b] is not None or self._cid[b]):
            fail(f"free block {b} still carries content (cid {self._cid[b]})")
    holders: dict[int, set[int]] = {}
    for b in range(n):
        if self._cid[b]:
            holders.setdefault(self._cid[b], set()).add(b)
    if holders != {c: s for c, s in self._holders.items() if s}:
        fail(f"the content holders {self._holders} disagree with the blocks' cids {holders}")
    children: dict[int, set[int]] = {}
    registered = {self._cid[b] for b in self._index.values() if 0 <= b < n}
    for key, b in self._index.items():
        if not 0 <= b < n or self._key[b] != key:
            fail(f"the index maps key {key.hex()} to block {b}, whose key is another")
        if len(self._btokens[b]) != bs or not self._cid[b]:
            fail(f"registered block {b} is not a full block with content")
        if self._parent[b] and self._parent[b] not in registered:  # NOTE [released blocks]: all reachable
            fail(f"registered block {b}'s parent content {self._parent[b]} is not registered")
        children.setdefault(self._parent[b], set()).add(b)
    if children != {c: s for c, s in self._children.items() if s}:
        fail(f"the children map {self._children} disagrees with the index {children}")
    starts: dict[tuple[int, int], set[int]] = {}
    for b in self._index.values():
        starts.setdefault((self._parent[b], self._btokens[b][0]), set()).add(b)
    if starts != self._starts:
        fail(f"the first-token index {self._starts} disagrees with the index {starts}")
    cids = [self._cid[b] for b in self._index.values()]
    if len(set(cids)) != len(cids):
        fail("two registered blocks have the same content")
    if self.prefix_caching:
        _check_contents(self)
    elif self._index or self._cached or any(self._cid):
        fail("prefix caching is off but blocks are registered")


def _check_contents(self: BlockPool) -> None:
    # Every full block of a live sequence carries that sequence's own chained key and tokens,
    # and every block shared by sequences holds the same tokens for each of them.
    bs = self.block_size
    seen: dict[int, tuple[int, tuple[int, ...]]] = {}
    for sid, seq in self._seqs.items():
        key = b""
        cid: int | None = 0  # None after a released block: its content id went with it
        for i, b in enumerate(seq.table):
            own = tuple(seq.tokens[i * bs : (i + 1) * bs])
            if b == RELEASED:
                key, cid = self._chain(key, own), None
                continue
            if b in seen and seen[b] != (i, own):
                raise KaelError(f"BlockPool.check: block {b} is shared by sequences with different tokens")
            seen[b] = (i, own)
            if len(own) < bs:
                if self._cid[b]:
                    raise KaelError(f"BlockPool.check: sequence {sid!r}'s partial block {b} has content")
                continue
            key = self._chain(key, own)
            parent_ok = cid is None or self._parent[b] == cid
            if self._key[b] != key or self._btokens[b] != own or not parent_ok or not self._cid[b]:
                raise KaelError(f"BlockPool.check: sequence {sid!r}'s block {b} (#{i}) carries another content")
            cid = self._cid[b]
        if key != seq.last_key or cid not in (None, seq.last_cid):
            raise KaelError(f"BlockPool.check: sequence {sid!r}'s chain state is stale")
