"""KVManager: rows and KV blocks for the engine's requests, on a BatchDecoder's paged cache.

NOTE [kv allocation]: the scheduler asks for exactly the slots a step needs, before the step
runs (vLLM v1's ``allocate_slots``): a request's first chunk ``start``s its row with the ids
up to the chunk's end (the pool reuses their longest cached prefix of whole blocks), and every
later chunk, decode token or draft ``grow``s it token by token. A block is registered in the
prefix index as it fills, before its keys and values are written, so every slot handed out
must be written by the very next forward pass, before another ``start`` may reuse it: the
engine runs each plan before it schedules the next one, and within a pass the rows run in
plan order, layer by layer (NOTE [batched prefill] in kael.models._batched). That is why a
long prompt is allocated chunk by chunk, never all at once: another prompt sharing its
prefix must not find blocks that a later chunk has yet to fill.

On a model whose every layer slides (NOTE [sliding-window blocks] in kael.models._paged_cache)
``grow`` first gives back the blocks behind the row's window, then counts, so a long
generation needs about window / block_size + 1 blocks, and admitting, growing and
preempting all see the blocks it gave back.

When a step cannot have its blocks, the scheduler preempts: ``free`` gives the newest
request's row back, its full blocks staying cached for its recomputation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from .._errors import KaelError
from .request import Request

if TYPE_CHECKING:
    from ..models import BatchDecoder

__all__ = ["KVBackend", "KVManager"]


class KVBackend(Protocol):
    """What the scheduler and ``EngineCore`` ask of a KV manager (``KVManager`` is kael's; a test
    may bring its own): rows and blocks for requests, allocated before each step runs."""

    @property
    def rows(self) -> int:
        """Rows in all."""

    @property
    def free_rows(self) -> int:
        """Rows no request holds."""

    @property
    def free_blocks(self) -> int:
        """Blocks that can be handed out now."""

    @property
    def max_positions(self) -> int:
        """Tokens one row holds at most."""

    def cached_prefix(self, ids: Sequence[int]) -> int:
        """Leading tokens of ``ids`` the prefix cache holds now."""

    def start(self, request: Request, end: int, *, spare: int = 0) -> bool:
        """Gives ``request`` a row holding ``all_ids[:end]``; sets its ``row`` and ``num_computed``."""

    def grow(self, request: Request, tokens: Sequence[int], *, spare: int = 0) -> bool:
        """Slots for ``tokens`` after ``request``'s current ones; False, changing nothing, if they do not fit."""

    def draft_room(self, request: Request) -> int:
        """Draft tokens that may follow ``request``'s next token without filling a KV block."""

    def truncate(self, request: Request, length: int) -> None:
        """Keeps ``request``'s first ``length`` positions (rejected drafts go)."""

    def fork(self, parent: Request, child: Request) -> bool:
        """Starts ``child`` as a copy of ``parent``'s row; False when no row is free."""

    def free(self, request: Request, *, keep: bool = True) -> None:
        """Gives ``request``'s row and blocks back."""

    def preempt(self, request: Request) -> None:
        """Gives a running ``request``'s row and blocks back to make room (its full blocks stay cached)."""

    def stats(self) -> dict[str, int]:
        """Counters for metrics."""


class KVManager:
    """Rows and blocks of ``decoder``'s ``PagedKVCache`` for requests (NOTE [kv allocation])."""

    def __init__(self, decoder: BatchDecoder) -> None:
        self.decoder = decoder
        self.cache = decoder.cache
        self.pool = decoder.cache.pool
        self._free_rows = list(range(decoder.rows - 1, -1, -1))

    @property
    def rows(self) -> int:
        """Rows in all: the most requests that run at once."""
        return self.decoder.rows

    @property
    def free_rows(self) -> int:
        """Rows no request holds."""
        return len(self._free_rows)

    @property
    def block_size(self) -> int:
        """Positions per block."""
        return self.cache.block_size

    @property
    def free_blocks(self) -> int:
        """Blocks that can be handed out now (free or cached)."""
        return self.pool.free_blocks

    @property
    def max_positions(self) -> int:
        """Tokens one row holds at most."""
        return self.cache.max_positions

    def cached_prefix(self, ids: Sequence[int]) -> int:
        """Leading tokens of ``ids`` the prefix cache holds now (whole blocks and part of one more,
        NOTE [partial block] in kael.models._kv_blocks; never the last token)."""
        return self.cache.cached_prefix(ids)

    def blocks_for(self, request: Request, tokens: int) -> int:
        """Blocks that ``grow(request, ...)`` of ``tokens`` more positions takes from the pool."""
        return self.cache.blocks_for(self._row(request, "blocks_for"), tokens)

    def start(self, request: Request, end: int, *, spare: int = 0) -> bool:
        """Gives ``request`` a row holding ``all_ids[:end]`` (its cached prefix reused): sets its
        ``row`` and ``num_computed`` (the cached tokens). False, changing nothing, when no row is
        free or the pool would keep fewer than ``spare`` blocks free afterwards."""
        if request.row is not None:
            raise KaelError(f"KVManager.start: request {request.request_id!r} holds row {request.row} already")
        if not self._free_rows:
            return False
        ids = request.all_ids[:end]
        if spare:  # worst case: every cached block it reuses was counted free
            need = -(-len(ids) // self.block_size)
            if need + spare > self.free_blocks:
                return False
        from ..models import KVCacheFull  # kael.models imports kael.engine: not at import time

        row = self._free_rows.pop()
        try:
            cached = self.cache.start(row, ids)
        except KVCacheFull:
            self._free_rows.append(row)
            return False
        except BaseException:
            self._free_rows.append(row)
            raise
        self.decoder.active[row] = True
        request.row, request.num_computed = row, cached
        return True

    def grow(self, request: Request, tokens: Sequence[int], *, spare: int = 0) -> bool:
        """Slots for ``tokens`` (the ids fed there) after ``request``'s current ones; False,
        changing nothing else, when the pool would keep fewer than ``spare`` blocks free. The blocks
        behind a sliding window go back first (no query reads them), so the count sees them."""
        row = self._row(request, "grow")
        if self.pool.length(row) + len(tokens) > self.max_positions:
            raise KaelError(
                f"KVManager.grow: request {request.request_id!r} would reach {self.pool.length(row) + len(tokens)} "
                f"positions, more than a row's {self.max_positions}"
            )
        self.cache.release_behind_window([row])
        if self.blocks_for(request, len(tokens)) + spare > self.free_blocks:
            return False
        self.cache.extend([row], [tokens])
        return True

    def draft_room(self, request: Request) -> int:
        """Draft tokens that may follow ``request``'s next token (fed at position ``num_computed``)
        without filling a KV block, so no block holding an unverified token is ever registered in
        the prefix cache (NOTE [draft tail] in kael.models._block_truncate); also within the row."""
        bs, p = self.block_size, request.num_computed
        room = bs - 1 if p % bs == bs - 1 else bs - 2 - p % bs
        return max(0, min(room, self.max_positions - p - 1))

    def truncate(self, request: Request, length: int) -> None:
        """Keeps ``request``'s first ``length`` positions: the keys and values of rejected drafts
        go, and a block they alone held goes back to the free list (never cached)."""
        self.cache.truncate(self._row(request, "truncate"), length)

    def fork(self, parent: Request, child: Request) -> bool:
        """Starts ``child`` in a free row as a copy of ``parent``'s (no block is taken or computed:
        the blocks are shared, copy-on-write); False when no row is free."""
        src = self._row(parent, "fork")
        if not self._free_rows:
            return False
        row = self._free_rows.pop()
        self.decoder.fork(src, row)
        child.row, child.num_computed = row, parent.num_computed
        return True

    def free(self, request: Request, *, keep: bool = True) -> None:
        """Gives ``request``'s row and blocks back; its full blocks stay cached unless ``keep`` is
        False (their keys and values may not all be written: a failed forward pass)."""
        row = request.row
        if row is None:
            return
        request.row = None
        self.decoder.active[row] = False
        self.cache.release(row, keep=keep)
        self._free_rows.append(row)

    def preempt(self, request: Request) -> None:
        """Gives ``request``'s row back to make room (``BatchDecoder.preempt``, which counts it):
        every block it holds was written by an earlier step, so its full ones stay cached for
        its recomputation."""
        row = self._row(request, "preempt")
        request.row = None
        self.decoder.preempt(row)
        self._free_rows.append(row)

    def stats(self) -> dict[str, int]:
        """Block and prefix-cache counters (``PagedKVCache.stats``)."""
        return self.cache.stats()

    def _row(self, request: Request, op: str) -> int:
        if request.row is None:
            raise KaelError(f"KVManager.{op}: request {request.request_id!r} holds no row")
        return request.row
