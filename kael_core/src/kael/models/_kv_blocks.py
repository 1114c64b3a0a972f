"""BlockPool: the bookkeeping of a paged KV cache with automatic prefix caching (no tensors).

The pool owns ``num_blocks`` blocks of ``block_size`` token positions each. A sequence's
keys and values live in the blocks of its *block table*: position ``p`` is slot
``p % block_size`` of block ``block_table[p // block_size]``. Blocks are reference
counted, so sequences share the blocks of a common prefix (a cached prompt prefix, or
a ``fork``). This module only decides which block holds what; the caller owns the K/V
tensors (one ``[num_blocks, block_size, ...]`` buffer per layer) and writes and copies
them as the pool's answers tell it to.

NOTE [block states]: every block is in exactly one state:

* *free*: never used, or released with nothing worth keeping; handed out lowest id first;
* *cached*: reference count 0 but registered in the prefix index (a full block whose K/V
  is valid), kept for reuse in least-recently-used order and evicted (oldest first) only
  when no free block is left;
* *in use*: referenced by ``refcount(b) > 0`` live sequences' tables.

``free_blocks`` counts free and cached blocks (both can be handed out now). ``check()``
verifies every invariant below and is cheap enough to call after each operation in tests.

NOTE [prefix keys] (how full blocks are named and matched): see _block_keys.py.

NOTE [twins]: at most one block per cid is registered, and a registered content that a block
in use holds is registered to a block in use, so a lookup never revives a cached block whose
content a live block already holds (that would cost a block for nothing). An identical block
computed again (a prompt prefilled while its twin was in use or cached, or the recomputed last
block of a fully cached prompt) is a *twin*: it gets the registered block's cid when it fills;

* if the registered twin is in use, the new block stays out of the index;
* if the registered twin is only cached, the new block *adopts* the registration and the
  cached twin goes back to the free list: its content stays reachable through the new block,
  and its registered children keep their parent cid, which the new block now holds, so they
  stay reachable too (adopting is not an eviction).

When the registered block leaves while a twin is still in use (freed, or freed with
``cache=False``), the twin takes over the registration and the registered block goes back to
the free list, not to the cache. So a cached block's cid has no other holder (``check()``
verifies it). When the last block of a cid leaves, its registered children can never be
reached again (lookups walk from the first block), so they leave the index with it: cached
ones are evicted (and counted), instead of lingering; one still in use (NOTE [released
blocks]) stays with its sequence.

Counters: ``queries_tokens`` and ``hit_tokens`` add up the prompt tokens of successful
``allocate`` calls and their ``cached_tokens``; ``evictions`` counts cached blocks dropped
to make room, or because no block holds their parent's content any more; adopting a twin and
``reset_prefix_cache`` count as neither.

NOTE [when blocks are registered]: as in vLLM, a block is registered when it becomes
full, i.e. when ``allocate`` or ``append`` hands out its last position, before the caller
has written its K/V. So the caller writes the K/V of every position that ``allocate``
(positions ``cached_tokens`` onwards) or ``append`` handed out before the next
``allocate``, which may reuse them; a sequence whose K/V is not written after all (a
preemption before its prefill ran) is released with ``free(seq_id, cache=False)``.

NOTE [partial block]: a prompt reuses its cached whole blocks and then, token by token, the
start of one more: among the registered blocks below the last hit's content (``_starts``
indexes them by their first token), the one whose first tokens repeat the most of the prompt's
next ones (the lowest id among equals), at most ``block_size - 1`` of them and never the
prompt's last token. ``allocate`` hands the sequence a fresh block there and names the source
in ``Allocation.copied_from``; the caller copies those slots (every layer) before it computes
the rest. So a repeated prompt computes one token whatever its length, as llama.cpp's slots
and SGLang's radix cache do, where whole blocks alone (vLLM's) would recompute the last block
of a prompt that is a whole number of them. The source's K/V must be written when the caller
copies it, which the pool cannot know for a block in use (a prompt of the same step registers
its blocks before its pass runs, NOTE [kv allocation] in kael/engine/kv_manager.py): a caller
that allocates ahead of the writes passes ``copyable`` to say how many leading slots of a block
in use are written (a cached block's all are), and a source gives at most those. So prompts of
one step that repeat a cached prompt all copy: the first one's fresh block adopts the cached
twin's registration (NOTE [twins]), but the slots copied into it are written, so the next ones
copy from it (a yes/no for whole blocks made each of them recompute the block). A cached source
is kept out of the blocks this ``allocate`` may evict (if that leaves too few, it does without
the copy).

NOTE [copy-on-write]: only ``fork`` shares a block that is not full (the source's last
one). Full blocks are never written again, so sharing them is safe. An ``append`` whose
position falls in a shared, not-full last block first moves the appending sequence to a
fresh private block; its ``AppendResult.copied_from`` names the shared block, and the
caller copies slots ``[0, slot)`` of ``copied_from`` into ``block`` (every layer) before
writing the new token's K/V at ``(block, slot)``. The other holders keep the original.

NOTE [released blocks]: ``release_before(seq_id, position)`` gives back a sequence's blocks
that lie wholly before ``position``, keys that no later query of it reads (a sliding-window
model's: NOTE [sliding-window blocks] in _paged_cache.py). Their table entries become
``RELEASED`` (-1), always a leading run of full blocks, and each block goes where a freed
sequence's would (cached if registered, else free) once no other table holds it; the
sequence keeps its tokens and chain state, so its later blocks are keyed as before. A lookup
walks a prompt from its first block, so it reuses a prefix only while every block of it is
still present (in use or cached), and the index keeps that true: *a registered block's parent
content is registered too*. Releasing breaks "a block in use has its parent in use", so when
a released parent is evicted, its children still in use leave the index (with their own
registered descendants; cached ones are evicted) and stay in their sequences, and a block
that fills after its parent left the index is not registered.

Preemption is the caller's: ``allocate`` and ``append`` return None, changing nothing,
when no block can be had; the caller then frees the newest sequence (``sequences()`` is
in start order) and recomputes it later.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence

from .._errors import KaelError, ShapeError
from ._block_check import check_pool
from ._block_keys import Digest, block_keys, count_arg, default_digest, encode_block, token_ids
from ._block_records import RELEASED, Allocation, AppendResult, SeqState
from ._block_truncate import truncate_seq

__all__ = ["RELEASED", "AppendResult", "Allocation", "BlockPool", "block_keys", "default_digest"]


class BlockPool:
    """``num_blocks`` KV blocks of ``block_size`` positions, shared by sequences, with prefix caching.

    >>> pool = BlockPool(64, 16, namespace="gpt2:abc123")
    >>> a = pool.allocate("a", list(range(40)))      # blocks for 40 tokens, nothing cached yet
    >>> b = pool.allocate("b", list(range(32)) + [7] * 8)
    >>> b.cached_tokens, b.block_table[:2] == a.block_table[:2]
    (32, True)
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int = 16,
        *,
        namespace: str = "",
        prefix_caching: bool = True,
        partial_blocks: bool = True,
        _digest: Digest = default_digest,
    ) -> None:
        self.num_blocks = count_arg("", "num_blocks", num_blocks, 1)
        self.block_size = count_arg("", "block_size", block_size, 1)
        if not isinstance(namespace, str):
            raise ShapeError(f"BlockPool: namespace must be a str, got {namespace!r}")
        if not isinstance(prefix_caching, bool):
            raise ShapeError(f"BlockPool: prefix_caching must be a bool, got {prefix_caching!r}")
        if not isinstance(partial_blocks, bool):
            raise ShapeError(f"BlockPool: partial_blocks must be a bool, got {partial_blocks!r}")
        if not callable(_digest):
            raise ShapeError(f"BlockPool: _digest must be a callable bytes -> bytes, got {_digest!r}")
        self.namespace = namespace
        self.prefix_caching = prefix_caching
        self.partial_blocks = partial_blocks
        """Whether a prompt also reuses part of one more block (NOTE [partial block]); False: whole blocks only."""
        self._digest = _digest
        n = num_blocks
        self._ref = [0] * n
        self._key: list[bytes | None] = [None] * n  # chained key of a full block
        self._cid = [0] * n  # content id of a full block (0: not full, or caching off)
        self._parent = [0] * n  # content id of its parent (0: the empty prefix)
        self._btokens: list[tuple[int, ...]] = [()] * n  # a full block's own token ids
        self._free = list(range(n))  # a heap: lowest id first
        self._cached: OrderedDict[int, None] = OrderedDict()  # LRU order, oldest first
        self._index: dict[bytes, int] = {}  # key -> the registered block
        self._holders: dict[int, set[int]] = {}  # cid -> every block with that content
        self._children: dict[int, set[int]] = {}  # cid -> registered blocks whose parent it is
        self._starts: dict[tuple[int, int], set[int]] = {}  # (parent cid, first token) -> registered blocks
        self._next_cid = 1
        self._seqs: dict[Hashable, SeqState] = {}
        self.queries_tokens = 0
        self.hit_tokens = 0
        self.evictions = 0

    @classmethod
    def for_tokens(
        cls, tokens: int, block_size: int = 16, *, namespace: str = "", prefix_caching: bool = True
    ) -> BlockPool:
        """A pool whose blocks hold ``tokens`` positions in all (rounded up to whole blocks)."""
        count_arg(".for_tokens", "tokens", tokens, 1)
        count_arg(".for_tokens", "block_size", block_size, 1)
        return cls(-(-tokens // block_size), block_size, namespace=namespace, prefix_caching=prefix_caching)

    # -- state ------------------------------------------------------------------------------------
    @property
    def free_blocks(self) -> int:
        """Blocks that can be handed out now: never used (or released) plus cached-but-unreferenced."""
        return len(self._free) + len(self._cached)

    @property
    def used_blocks(self) -> int:
        """Blocks referenced by at least one live sequence."""
        return self.num_blocks - self.free_blocks

    @property
    def cached_blocks(self) -> int:
        """Unreferenced full blocks kept for reuse."""
        return len(self._cached)

    def refcount(self, block: int) -> int:
        """How many live sequences' tables hold ``block``."""
        return self._ref[self._block("refcount", block)]

    def key_of(self, block: int) -> bytes | None:
        """The chained key of a full ``block`` (None if it is not full or prefix caching is off)."""
        return self._key[self._block("key_of", block)]

    def cached_order(self) -> tuple[int, ...]:
        """The cached blocks, the next to be evicted first."""
        return tuple(self._cached)

    def __contains__(self, seq_id: object) -> bool:
        try:
            return seq_id in self._seqs
        except TypeError:
            return False

    def sequences(self) -> tuple[Hashable, ...]:
        """The live sequences' ids, oldest first (the last is the one to preempt)."""
        return tuple(self._seqs)

    def block_table(self, seq_id: Hashable) -> tuple[int, ...]:
        """The sequence's block ids in position order (``RELEASED`` for blocks it gave back)."""
        return tuple(self._seq("block_table", seq_id).table)

    def length(self, seq_id: Hashable) -> int:
        """Tokens of the sequence (prompt and appended), each with a slot in its blocks."""
        return len(self._seq("length", seq_id).tokens)

    def blocks_needed(self, seq_ids: Sequence[Hashable]) -> int:
        """How many blocks appending one token to each of ``seq_ids`` would take from the pool.

        A position that starts a new block takes one; a position in a shared, not-full last
        block takes one for its copy (NOTE [copy-on-write]), except that when every holder of
        that block appends, the last to do so is alone in it by then and writes in place (so
        ``k`` of a block's ``r`` holders take ``min(k, r - 1)``). Whatever order the appends come
        in, they all succeed exactly when ``blocks_needed(seq_ids) <= free_blocks`` (adopting a
        twin as a block fills moves a cached block to the free list, which leaves
        ``free_blocks`` as it is), and they take that many. Changes nothing.
        """
        if isinstance(seq_ids, (str, bytes)) or not isinstance(seq_ids, Sequence):
            raise ShapeError(
                f"BlockPool.blocks_needed: seq_ids must be a sequence of sequence ids, got {type(seq_ids).__name__}"
            )
        seqs = [self._seq("blocks_needed", s) for s in seq_ids]
        seen: set[Hashable] = set()
        for s in seq_ids:
            if s in seen:
                raise KaelError(f"BlockPool.blocks_needed: sequence {s!r} is named twice in seq_ids")
            seen.add(s)
        bs, needed = self.block_size, 0
        appenders: dict[int, int] = {}  # a shared, not-full last block -> how many of seq_ids hold it
        for seq in seqs:
            if len(seq.tokens) % bs == 0:
                needed += 1
            elif self._ref[seq.table[-1]] > 1:
                appenders[seq.table[-1]] = appenders.get(seq.table[-1], 0) + 1
        return needed + sum(min(k, self._ref[b] - 1) for b, k in appenders.items())

    # -- sequences --------------------------------------------------------------------------------
    def allocate(
        self, seq_id: Hashable, tokens: Sequence[int], *, copyable: Callable[[int], int] | None = None
    ) -> Allocation | None:
        """Start ``seq_id`` with prompt ``tokens``: reuse its longest cached prefix, fresh blocks for the rest.

        Returns None, changing nothing, when the prompt does not fit even after evicting every
        cached block. The caller writes the K/V of positions ``cached_tokens`` onwards before
        the next ``allocate`` (NOTE [when blocks are registered]), after copying the slots that
        ``copied_from`` names (NOTE [partial block]; ``copyable(b)`` says how many leading slots of a
        block in use have their K/V written already: None, every block's all).
        """
        self._new_id("allocate", seq_id)
        ids = token_ids("BlockPool.allocate", tokens)
        bs, n = self.block_size, len(ids)
        hits, key, cid, missed = self._lookup(ids)
        source, more = self._partial(ids, hits, cid, copyable)
        need = -(-n // bs) - len(hits)
        revived = sum(1 for b in hits if self._ref[b] == 0)
        if need > self.free_blocks - revived:
            return None
        pinned = source if source is not None and self._ref[source] == 0 else None  # no _take may evict it
        if pinned is not None and need > self.free_blocks - revived - 1:  # a block in use, or no copy at all
            source, more = self._partial(ids, hits, cid, copyable, cached=False)
            pinned = None
        for b in hits:
            if self._ref[b] == 0:
                del self._cached[b]
            self._ref[b] += 1
        if pinned is not None:
            del self._cached[pinned]
        table = hits + [self._take() for _ in range(need)]
        if pinned is not None:
            self._cached[pinned] = None  # back, the most recently used
        seq = SeqState(ids, table, key, cid)
        for i in range(len(hits), n // bs):
            self._filled(seq, i, missed if i == len(hits) else None)
        self._seqs[seq_id] = seq
        cached = len(hits) * bs + more
        self.queries_tokens += n
        self.hit_tokens += cached
        return Allocation(tuple(table), cached, source if more else None)

    def cached_prefix(self, tokens: Sequence[int], *, copyable: Callable[[int], int] | None = None) -> int:
        """Leading tokens of ``tokens`` that ``allocate`` (with the same ``copyable``) would find cached
        now: whole blocks, then part of the next (NOTE [partial block]), never the last token. Changes
        nothing: a scheduler sizes a prompt's first chunk with it."""
        ids = token_ids("BlockPool.cached_prefix", tokens)
        hits, _, cid, _ = self._lookup(ids)
        return len(hits) * self.block_size + self._partial(ids, hits, cid, copyable)[1]

    def _lookup(self, ids: list[int]) -> tuple[list[int], bytes, int, bytes | None]:
        """The cached blocks of ``ids``' longest prefix, the last one's key and cid, and the key of
        the first block not found (None if none was looked up in vain)."""
        bs, key, cid = self.block_size, b"", 0
        hits: list[int] = []
        if self.prefix_caching:
            for i in range((len(ids) - 1) // bs):  # at least the last token is always computed
                own = tuple(ids[i * bs : (i + 1) * bs])
                k = self._chain(key, own)
                b = self._index.get(k)
                if b is None or self._parent[b] != cid or self._btokens[b] != own:
                    return hits, key, cid, k  # a miss, or a digest collision with different contents
                hits.append(b)
                key, cid = k, self._cid[b]
        return hits, key, cid, None

    def _partial(
        self,
        ids: list[int],
        hits: list[int],
        cid: int,
        copyable: Callable[[int], int] | None,
        *,
        cached: bool = True,
    ) -> tuple[int | None, int]:
        """The registered block below content ``cid`` whose first tokens repeat the most of ``ids`` after
        its ``hits``, and how many (NOTE [partial block]); (None, 0) when none does."""
        bs, p = self.block_size, len(hits) * self.block_size
        rest = ids[p : min(len(ids) - 1, p + bs - 1)]  # never the last token; a whole block would be a hit
        if not (self.prefix_caching and self.partial_blocks) or not rest:
            return None, 0
        best, most = None, 0
        for b in sorted(self._starts.get((cid, rest[0]), ())):
            limit = len(rest)
            if self._ref[b] and copyable is not None:
                limit = min(limit, copyable(b))  # in use: only its written slots (a prompt of this very step)
                if limit < 1:
                    continue
            if not self._ref[b] and not cached:
                continue
            own, k = self._btokens[b], 1
            while k < limit and own[k] == rest[k]:
                k += 1
            if k > most:
                best, most = b, k
        return best, most

    def append(self, seq_id: Hashable, token: int) -> AppendResult | None:
        """Grow ``seq_id`` by ``token`` (whose K/V the caller is about to write); where it goes.

        A new block is taken when the position starts one, and a private copy when it falls in
        a block shared through ``fork`` (NOTE [copy-on-write]). Returns None, changing nothing,
        when that needs a block and none can be had (the caller preempts).
        """
        seq = self._seq("append", seq_id)
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise ShapeError(f"BlockPool.append: token must be a non-negative int, got {token!r}")
        p = len(seq.tokens)
        slot = p % self.block_size
        copied: int | None = None
        if slot == 0:
            if not self.free_blocks:
                return None
            block = self._take()
            seq.table.append(block)
        else:
            block = seq.table[-1]
            if self._ref[block] > 1:
                if not self.free_blocks:
                    return None
                copied, block = block, self._take()
                self._ref[copied] -= 1  # still >= 1: the other holders keep it
                seq.table[-1] = block
        seq.tokens.append(token)
        if slot == self.block_size - 1:
            self._filled(seq, p // self.block_size)
        return AppendResult(block, slot, copied)

    def fork(self, src_id: Hashable, dst_id: Hashable) -> Allocation:
        """Start ``dst_id`` as a copy of ``src_id``, sharing every block (nothing to compute or copy now)."""
        src = self._seq("fork", src_id)
        self._new_id("fork", dst_id)
        for b in src.table:
            if b != RELEASED:
                self._ref[b] += 1
        self._seqs[dst_id] = SeqState(list(src.tokens), list(src.table), src.last_key, src.last_cid)
        return Allocation(tuple(src.table), len(src.tokens))

    def free(self, seq_id: Hashable, *, cache: bool = True) -> None:
        """End ``seq_id``: drop its references; its blocks no longer referenced become cached or free.

        Its blocks are released last first, so a chain's tail is evicted before its head.
        ``cache=False`` keeps none of them (their K/V was never written, or is not to be trusted).
        """
        seq = self._seq("free", seq_id)
        del self._seqs[seq_id]
        for b in reversed(seq.table):
            if b != RELEASED:
                self._release(b, cache)

    def release_before(self, seq_id: Hashable, position: int) -> int:
        """Give back ``seq_id``'s blocks that lie wholly before ``position`` (NOTE [released blocks]): their
        entries become ``RELEASED``, and each is cached or freed as ``free`` would once no other table holds
        it. Returns how many entries this call released (those released already stay so)."""
        seq = self._seq("release_before", seq_id)
        n = len(seq.tokens)
        if isinstance(position, bool) or not isinstance(position, int) or not 0 <= position <= n:
            raise ShapeError(
                f"BlockPool.release_before: position must be an int in 0..{n} (sequence {seq_id!r}'s length), "
                f"got {position!r}"
            )
        end = i = position // self.block_size
        while i and seq.table[i - 1] != RELEASED:  # the tail first, as free() releases a chain
            i -= 1
            self._release(seq.table[i], True)
            seq.table[i] = RELEASED
        return end - i

    def truncate(self, seq_id: Hashable, length: int) -> None:
        """Keep ``seq_id``'s first ``length`` tokens: rejected draft tokens of its not-full last block
        go (NOTE [draft tail] in _block_truncate.py); a full block is never cut."""
        truncate_seq(self, seq_id, length)

    def reset_prefix_cache(self) -> None:
        """Forget every cached block (each becomes free); blocks in use are left as they are."""
        evictions = self.evictions  # a reset is not an eviction, nor what it drops with it
        while self._cached:
            b, _ = self._cached.popitem(last=False)
            self._forget(b)
            heapq.heappush(self._free, b)
        self.evictions = evictions

    # -- invariants -------------------------------------------------------------------------------
    def check(self) -> None:
        """Raise KaelError naming the first violated invariant of the pool (NOTE [block states])."""
        check_pool(self)

    # -- internals --------------------------------------------------------------------------------
    def _chain(self, parent: bytes, own: Sequence[int]) -> bytes:
        return self._digest(encode_block(self.namespace, parent, own))

    def _release(self, b: int, cache: bool) -> None:
        """Drop one reference to ``b``; unreferenced, it becomes cached (registered, no twin in use) or free."""
        self._ref[b] -= 1
        if self._ref[b]:
            return
        if cache and self._registered(b) and not self._live_twin(b):
            self._cached[b] = None  # the most recently used
        else:  # (a twin in use takes over the registration: keeping b too would cost a block for nothing)
            self._forget(b)
            heapq.heappush(self._free, b)

    def _registered(self, b: int) -> bool:
        key = self._key[b]
        return key is not None and self._index.get(key) == b

    def _take(self) -> int:
        """A block with no content and reference count 1: a free one, else the LRU cached one."""
        if self._free:
            b = heapq.heappop(self._free)
        else:
            b, _ = self._cached.popitem(last=False)
            self.evictions += 1
            self._forget(b)
        self._ref[b] = 1
        return b

    def _filled(self, seq: SeqState, i: int, key: bytes | None = None) -> None:
        """Block ``i`` of ``seq`` has just become full: give it its key and content, register it if new.

        A registered twin that is only cached hands its registration to this block and goes back
        to the free list (NOTE [twins]).
        """
        if not self.prefix_caching:
            return
        bs, b = self.block_size, seq.table[i]
        own = tuple(seq.tokens[i * bs : (i + 1) * bs])
        if key is None:
            key = self._chain(seq.last_key, own)
        other = self._index.get(key)
        adopt: int | None = None
        if other is not None and self._parent[other] == seq.last_cid and self._btokens[other] == own:
            cid = self._cid[other]  # the same content is registered already: a twin
            if not self._ref[other]:  # only cached: b takes its place (keeping both costs a block)
                adopt = other
        else:
            cid, self._next_cid = self._next_cid, self._next_cid + 1
            # Else a collision with other contents, or a parent no lookup reaches (NOTE [released blocks]):
            # it stays unregistered.
            if other is None and self._reachable(seq):
                self._index[key] = b
                self._link(seq.last_cid, b, own[0])
        self._key[b], self._cid[b], self._parent[b], self._btokens[b] = key, cid, seq.last_cid, own
        self._holders.setdefault(cid, set()).add(b)
        seq.last_key, seq.last_cid = key, cid
        if adopt is not None:
            # A cached block's cid has no other holder, so b is now its only other one: _forget
            # hands the registration (and the children's parent, the cid) to b, evicting nothing.
            del self._cached[adopt]
            self._forget(adopt)
            heapq.heappush(self._free, adopt)

    def _link(self, parent: int, b: int, first: int) -> None:
        """Registered block ``b`` (whose first token is ``first``) is a child of content ``parent``."""
        self._children.setdefault(parent, set()).add(b)
        self._starts.setdefault((parent, first), set()).add(b)

    def _unlink(self, parent: int, b: int) -> None:
        """``b`` is no longer a registered child of ``parent`` (its tokens are still set)."""
        children = self._children.get(parent)
        if children is not None:
            children.discard(b)
        start = (parent, self._btokens[b][0])
        starts = self._starts.get(start)
        if starts is not None:
            starts.discard(b)
            if not starts:
                del self._starts[start]

    def _live_twin(self, b: int) -> bool:
        """Whether another block with ``b``'s content is in use (every other holder of a cid is)."""
        return any(h != b for h in self._holders.get(self._cid[b], ()))

    def _forget(self, b: int) -> None:
        """Clear the content of unreferenced block ``b`` (no longer cached), and what depended on it."""
        stack = [b]
        while stack:
            b = stack.pop()
            key, cid, parent = self._key[b], self._cid[b], self._parent[b]
            if not cid:
                continue
            holders = self._holders[cid]
            holders.discard(b)
            if key is not None and self._index.get(key) == b:
                del self._index[key]
                self._unlink(parent, b)
                if holders:  # a twin still in use takes over the registration
                    twin = min(holders)
                    self._index[key] = twin
                    self._link(parent, twin, self._btokens[b][0])
            if not holders:  # nobody holds this content: its registered children are unreachable
                del self._holders[cid]
                stack.extend(self._unreachable(cid))
            self._key[b], self._cid[b], self._parent[b], self._btokens[b] = None, 0, 0, ()

    def _unreachable(self, cid: int) -> list[int]:
        """Take the registered blocks below content ``cid``, which no lookup reaches any more, out of the index.

        A cached one is evicted to the free list (returned, for ``_forget`` to clear); one in use stays with
        its sequence, which released its parent (NOTE [released blocks]), and its own children follow it.
        """
        evicted: list[int] = []
        parents = [cid]
        while parents:
            parent = parents.pop()
            for child in sorted(self._children.pop(parent, ())):
                self._unlink(parent, child)
                if self._ref[child]:
                    key = self._key[child]
                    assert key is not None  # registered
                    del self._index[key]
                    parents.append(self._cid[child])
                else:
                    del self._cached[child]
                    self.evictions += 1
                    heapq.heappush(self._free, child)
                    evicted.append(child)
        return evicted

    def _reachable(self, seq: SeqState) -> bool:
        """Whether a lookup reaches the content of ``seq``'s last full block (the empty prefix: always)."""
        b = self._index.get(seq.last_key)
        return not seq.last_cid or (b is not None and self._cid[b] == seq.last_cid)

    def _block(self, method: str, block: object) -> int:
        if isinstance(block, bool) or not isinstance(block, int) or not 0 <= block < self.num_blocks:
            raise ShapeError(f"BlockPool.{method}: block must be an int in [0, {self.num_blocks}), got {block!r}")
        return block

    def _seq(self, method: str, seq_id: Hashable) -> SeqState:
        try:
            seq = self._seqs.get(seq_id)
        except TypeError:  # an unhashable id names no sequence
            seq = None
        if seq is None:
            raise KaelError(f"BlockPool.{method}: no live sequence {seq_id!r}")
        return seq

    def _new_id(self, method: str, seq_id: Hashable) -> None:
        try:
            hash(seq_id)
        except TypeError:
            raise KaelError(f"BlockPool.{method}: a sequence id must be hashable, got {seq_id!r}") from None
        if seq_id in self._seqs:
            raise KaelError(f"BlockPool.{method}: sequence {seq_id!r} is live already; free it first")

    def __repr__(self) -> str:
        return (
            f"BlockPool(num_blocks={self.num_blocks}, block_size={self.block_size}, "
            f"prefix_caching={self.prefix_caching}, used={self.used_blocks}, cached={self.cached_blocks}, "
            f"sequences={len(self._seqs)})"
        )
