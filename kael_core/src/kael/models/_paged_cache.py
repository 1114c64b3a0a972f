"""PagedKVCache: every layer's keys and values in a pool of fixed-size blocks, shared by prefix.

NOTE [paged kv cache]: layer ``l`` owns one buffer ``data[l]`` of shape ``[N, 2, Hkv, S, D]``
(blocks, key/value, heads, slots, head dim): block ``n``'s keys are ``data[l][n, 0]`` and its
values ``data[l][n, 1]``. A sequence (a *row*, ``0 <= row < batch``: the rows are the most
sequences decoded at once) holds a *block table*: its position ``p`` lives in block
``table[p // S]`` at slot ``p % S``. Which block holds what is the ``BlockPool``'s business
(``_kv_blocks.py``: reference counts, copy-on-write after ``fork``, automatic prefix caching
with chained block keys, LRU eviction); this class owns the tensors and does what the pool's
answers say: it writes a step's new keys and values at their (block, slot), copies a shared
block's slots when the pool gives a row a private copy, and attends each row to its own
blocks with the ``paged_attention`` op, which reads them in place.

Memory is sized in tokens (``num_blocks * block_size``), not rows times the context: short
sequences take few blocks, so many more of them fit than rows of a full context would
allow, and a prompt whose leading full blocks are cached (same token ids in the same model:
``namespace``) starts with their keys and values and computes only the rest.

The lifecycle of a row: ``start(row, ids)`` (the pool allocates the prompt's blocks and says
how many leading tokens are cached) -> ``step([row], T)`` over the uncached tokens (the
model's layers call ``attend``) -> ``commit``; then per decode step ``grow(rows, tokens)``
(each row's next position) -> one step of one token per row; ``release(row)`` at the end.
``KVCacheFull`` (before anything changes) when the pool cannot give the blocks: the caller
preempts a sequence (releases it and recomputes it later) or waits.

NOTE [sliding-window blocks]: when every layer of the model attends within a sliding window
(``window``, the longest of them: ``model.kv_window``), the query at position p reads no key
before p - window + 1, and a row's queries only move forward: its next one sits at
``lengths[row]`` (rejected draft tokens are truncated back to no earlier than that). So
before a row grows (``grow``; ``start`` for a cached prefix), ``release_behind_window`` gives
back every block of the row lying wholly before ``lengths[row] - window + 1``: its table entry
becomes ``RELEASED`` and the block returns to the pool (cached while the prefix index holds
it, else free) once no other row holds it (NOTE [released blocks] in _kv_blocks.py). Between
steps a row then holds at most ceil(window / S) + 1 blocks, whatever its length, and a KV
manager that releases before it counts (``KVManager.grow``) admits and preempts by that. The
kernels get, for a released entry, the row's first block still held (``block_ids``): the C++
and CUDA paged kernels start each query's products at the block of its first key in the
window, and the paths that gather a row's blocks (the NumPy reference, the decomposition,
the float16 paths, Gemma 2's soft-capped attention) weight the keys before the window by exact
zeros, so such an entry is never read or adds zeros, and it is the row's own block, never
another row's. A model with a layer that attends to the whole context (Gemma 2 and 3: its
``kv_window`` is None) keeps every block. Prefix caching: a released block still registered
stays cached, so a prompt sharing the prefix reuses it; a lookup walks from the first block,
so only a prefix whose blocks are all still present is reused.

It is kael's one KV cache. ``model.new_cache(batch, positions)`` makes one with a block of the
whole context per row and no prefix caching (a contiguous cache as a block table, NOTE [one
block per row] in _paged_step.py); ``model(ids, cache)`` runs ``begin``, which reserves the rows'
slots itself (``reserve``), and a family's direct decode step reserves them in ``decode_context``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, NoReturn

from .. import _dtype as dt
from .._errors import DTypeError, KaelError, ShapeError
from .._tensor import Tensor
from ..autograd import no_grad
from ..ops import narrow, reshape, select, tensor, view, zeros
from ..ops._inplace import copy_
from ..ops._views import make_view
from ._kv_blocks import RELEASED, BlockPool
from ._paged_step import PagedStep

__all__ = ["KVCacheFull", "PagedKVCache", "model_identity"]

DEFAULT_BLOCK_SIZE = 16


class KVCacheFull(KaelError):
    """The paged KV cache has too few free blocks for what was asked; nothing was changed."""

    def __init__(self, message: str, needed: int, free: int) -> None:
        super().__init__(message)
        self.needed = needed
        self.free = free


def _count(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ShapeError(f"PagedKVCache: {name} must be an int >= {minimum}, got {value!r}")
    return value


def model_identity(model: Any) -> str:
    """A short digest naming ``model``'s weights for prefix caching (NOTE [prefix keys] in _block_keys.py).

    Blocks of different models never match: the digest covers the family, its config, the dtype
    and weight format, and the first values of every parameter (cheap; two checkpoints differing
    only deep inside a tensor would share it, but a pool belongs to one model in one process).
    """
    h = hashlib.blake2b(digest_size=16)
    h.update(type(model).__name__.encode())
    h.update(repr(getattr(model, "config", None)).encode())
    h.update(repr(getattr(model, "weights_scheme", None)).encode())
    with no_grad():
        for name, p in model.named_parameters():
            h.update(name.encode())
            h.update(repr((str(p.dtype), tuple(p.shape))).encode())
            flat = reshape(p, (-1,))
            h.update(narrow(flat, 0, 0, min(16, flat.shape[0]))._host().tobytes())  # 16 values, not a copy of all
    return h.hexdigest()


class PagedKVCache:
    """Keys and values of ``layers`` layers in ``num_blocks`` blocks of ``block_size`` positions,
    for up to ``batch`` sequences of up to ``max_positions`` tokens each. ``window``: the longest
    sliding window of the model's layers when every layer has one (``model.kv_window``): blocks
    behind it go back to the pool (NOTE [sliding-window blocks]); None keeps every block.

    >>> cache = PagedKVCache(2, 4, 2, 8, 64, num_blocks=16)   # doctest: +SKIP
    >>> cache.start(0, [5, 6, 7])                             # doctest: +SKIP
    0
    """

    def __init__(
        self,
        layers: int,
        batch: int,
        heads: int,
        head_dim: int,
        max_positions: int,
        *,
        num_blocks: int | None = None,
        block_size: int = DEFAULT_BLOCK_SIZE,
        prefix_caching: bool = True,
        namespace: str = "",
        window: int | None = None,
        dtype: Any = None,
        device: Any = None,
    ) -> None:
        self.layers = _count("layers", layers, 1)
        self.batch = _count("batch", batch, 1)
        self.step_rows = self.batch
        """Query rows a family's direct decode step over this cache is built for (its buffers' rows): the
        batch, or more where verification entries share the step (``BatchDecoder.allow_drafts``)."""
        self.heads = _count("heads", heads, 1)
        self.head_dim = _count("head_dim", head_dim, 1)
        self.max_positions = _count("max_positions", max_positions, 1)
        self.block_size = _count("block_size", block_size, 1)
        self.window = None if window is None else _count("window", window, 1)
        per_row = -(-max_positions // block_size)
        n = batch * per_row if num_blocks is None else _count("num_blocks", num_blocks, 1)
        if n < per_row:
            raise ShapeError(
                f"PagedKVCache: {n} blocks of {block_size} positions ({n * block_size} tokens) cannot hold one "
                f"sequence of {max_positions} positions; give at least {per_row} blocks"
            )
        d = dt.as_dtype(dtype) if dtype is not None else dt.float32
        if not d.is_floating_point:
            raise DTypeError(f"PagedKVCache: dtype must be floating point, got {d!r}")
        self.num_blocks = n
        self.table_width = per_row
        # zeros, not empty: a slot never written is never read, but 0 * NaN would be NaN if it were.
        self.data: list[Tensor] = [
            zeros((n, 2, heads, block_size, head_dim), dtype=d, device=device) for _ in range(layers)
        ]
        self.keys: list[Tensor] = [select(b, 1, 0) for b in self.data]  # [N, Hkv, S, D]: block n's keys
        self.values: list[Tensor] = [select(b, 1, 1) for b in self.data]
        self.pool = BlockPool(n, block_size, namespace=namespace, prefix_caching=prefix_caching)
        self.lengths: list[int] = [0] * batch
        self.tables: list[list[int]] = [[] for _ in range(batch)]
        self.cached: list[int] = [0] * batch

    @property
    def dtype(self) -> dt.DType:
        """The floating-point dtype of the cached keys and values (the model's compute dtype)."""
        return self.data[0].dtype

    @property
    def device(self) -> Any:
        """The ``kael.Device`` the cache's buffers live on (the model's)."""
        return self.data[0].device

    @property
    def prefix_caching(self) -> bool:
        """Whether a prompt's leading full blocks reuse the cached blocks of earlier sequences with the same ids."""
        return self.pool.prefix_caching

    @property
    def capacity_tokens(self) -> int:
        """Positions the pool holds in all (``num_blocks * block_size``)."""
        return self.num_blocks * self.block_size

    def active(self, row: int) -> bool:
        """Whether ``row`` holds a sequence."""
        return row in self.pool

    # -- rows join, grow and leave ------------------------------------------------------------
    def start(self, row: int, ids: Sequence[int]) -> int:
        """Give free ``row`` the blocks of prompt ``ids``; how many leading tokens are cached already.

        The caller then runs ``step([row], len(ids) - cached)`` over ``ids[cached:]`` (at least one
        token) and commits it. ``KVCacheFull`` when the pool cannot hold the prompt.
        """
        self._row(row, "start")
        if row in self.pool:
            raise KaelError(f"PagedKVCache.start: row {row} holds a sequence; release it first")
        if len(ids) > self.max_positions:
            raise ShapeError(
                f"PagedKVCache.start: a prompt of {len(ids)} tokens exceeds the cache's {self.max_positions} positions"
            )
        got = self.pool.allocate(row, ids, copyable=self._written_slots)
        if got is None:
            need = -(-len(ids) // self.block_size)
            raise KVCacheFull(
                f"PagedKVCache.start: a prompt of {len(ids)} tokens needs up to {need} blocks of "
                f"{self.block_size}; {self.pool.free_blocks} of {self.num_blocks} are free",
                need,
                self.pool.free_blocks,
            )
        self.tables[row] = list(got.block_table)
        if got.copied_from is not None:  # NOTE [partial block] in _kv_blocks.py
            bs = self.block_size
            self._copy_slots(got.copied_from, got.block_table[got.cached_tokens // bs], got.cached_tokens % bs)
        self.lengths[row] = got.cached_tokens
        self.cached[row] = got.cached_tokens
        self.release_behind_window([row])
        return got.cached_tokens

    def cached_prefix(self, ids: Sequence[int]) -> int:
        """Leading tokens of ``ids`` that ``start`` would find cached now (``BlockPool.cached_prefix``)."""
        return self.pool.cached_prefix(ids, copyable=self._written_slots)

    def blocks_needed(self, rows: Sequence[int]) -> int:
        """Blocks that ``grow(rows, ...)`` would take from the pool."""
        return self.pool.blocks_needed(list(rows))

    def grow(self, rows: Sequence[int], tokens: Sequence[int]) -> None:
        """Give each row's next position (``tokens[i]`` is fed there) a slot; ``KVCacheFull``, changing
        nothing else, when that needs more blocks than are free. The blocks behind the rows' windows go
        back first (``release_behind_window``: no query reads them any more)."""
        self.release_behind_window(rows)
        need = self.pool.blocks_needed(list(rows))
        if need > self.pool.free_blocks:
            self._full(f"PagedKVCache.grow: {len(rows)} sequence(s) need {need} new block(s)", need)
        for r in rows:  # every check before the first append: an error changes nothing
            if self.pool.length(r) >= self.max_positions:
                raise ShapeError(f"PagedKVCache.grow: row {r} is full ({self.max_positions} positions)")
        for r, t in zip(rows, tokens):
            self._append(r, t, "grow")

    def extend(self, rows: Sequence[int], tokens: Sequence[Sequence[int]]) -> None:
        """``grow([rows[i]], [t])`` for each ``t`` of ``tokens[i]`` in turn (a decode step's token and its
        drafts), every check before the first append: ``KVCacheFull``, changing nothing, when the
        positions need more blocks than are free (counted row by row: rows sharing a block may be
        refused a block early, never granted one too many)."""
        rows, tokens = list(rows), [list(t) for t in tokens]
        if len(rows) != len(tokens) or len(set(rows)) != len(rows):
            raise ShapeError(f"PagedKVCache.extend: give distinct rows one token list each, got rows {rows}")
        for r, ts in zip(rows, tokens):
            self._row(r, "extend")
            if r not in self.pool:
                raise KaelError(f"PagedKVCache.extend: row {r} holds no sequence; start() it first")
            if self.pool.length(r) + len(ts) > self.max_positions:
                raise ShapeError(
                    f"PagedKVCache.extend: row {r} would reach {self.pool.length(r) + len(ts)} positions, more "
                    f"than {self.max_positions}"
                )
        self.release_behind_window(rows)  # (a window moves with lengths[row], which growing leaves)
        need = sum(self.blocks_for(r, len(ts)) for r, ts in zip(rows, tokens))
        if need > self.pool.free_blocks:
            self._full(f"PagedKVCache.extend: {len(rows)} row(s) need {need} new block(s) for their positions", need)
        for r, ts in zip(rows, tokens):
            for t in ts:
                self._append(r, t, "extend")

    def blocks_for(self, row: int, tokens: int) -> int:
        """Blocks that ``extend(row, ...)`` of ``tokens`` more positions takes from the pool."""
        have, bs = self.pool.length(row), self.block_size
        need = -(-(have + tokens) // bs) - -(-have // bs)
        if have % bs and self.pool.refcount(self.pool.block_table(row)[-1]) > 1:
            need += 1  # its shared, not-full last block is copied first (copy-on-write)
        return need

    def _full(self, what: str, need: int) -> NoReturn:
        raise KVCacheFull(f"{what}; {self.pool.free_blocks} of {self.num_blocks} are free", need, self.pool.free_blocks)

    def _append(self, r: int, t: int, op: str) -> None:
        got = self.pool.append(r, t)
        if got is None:  # the count said it fits: a bookkeeping bug, not a full pool
            raise KaelError(f"PagedKVCache.{op}: the pool refused row {r}'s position after promising it")
        table = self.tables[r]
        if got.slot == 0:
            table.append(got.block)
        elif got.copied_from is not None:
            table[-1] = got.block
            self._copy_slots(got.copied_from, got.block, got.slot)

    def release_behind_window(self, rows: Sequence[int]) -> None:
        """Give back each row's blocks that lie wholly before the window of its next query, at position
        ``lengths[row]`` (NOTE [sliding-window blocks]); nothing without a ``window``."""
        if self.window is None:
            return
        for r in rows:
            if r not in self.pool:  # (a row without a sequence: the caller's own check names it)
                continue
            first = self.lengths[r] - self.window + 1  # the first key a query of r will read
            if first >= self.block_size and self.pool.release_before(r, first):
                self.tables[r] = list(self.pool.block_table(r))

    def fork(self, src: int, dst: int) -> None:
        """Start free ``dst`` as a copy of ``src``'s sequence: it shares every block (copy-on-write)."""
        self._row(src, "fork")
        self._row(dst, "fork")
        self.pool.fork(src, dst)
        self.tables[dst] = list(self.tables[src])
        self.lengths[dst] = self.lengths[src]
        self.cached[dst] = self.lengths[src]

    def truncate(self, row: int, length: int) -> None:
        """Keep ``row``'s first ``length`` positions: rejected draft tokens go (``BlockPool.truncate``:
        only positions of the not-full last block)."""
        self._row(row, "truncate")
        self.pool.truncate(row, length)
        del self.tables[row][-(-length // self.block_size) :]
        self.lengths[row] = min(self.lengths[row], length)
        self.cached[row] = min(self.cached[row], length)

    def release(self, row: int, *, keep: bool = True) -> None:
        """End ``row``'s sequence; its full blocks stay cached for reuse unless ``keep`` is False
        (their keys and values were not all written: a failed or interrupted prefill)."""
        self._row(row, "release")
        if row in self.pool:
            self.pool.free(row, cache=keep)
        self.tables[row] = []
        self.lengths[row] = 0
        self.cached[row] = 0

    def reset(self, row: int | None = None) -> None:
        """Forget one row's tokens, or every row's (``release``); the memory is reused, not cleared."""
        for r in range(self.batch) if row is None else [row]:
            self.release(r)

    def stats(self) -> dict[str, int]:
        """Block and prefix-cache counters (for metrics)."""
        p = self.pool
        return {
            "blocks_total": p.num_blocks,
            "blocks_used": p.used_blocks,
            "blocks_cached": p.cached_blocks,
            "prefix_query_tokens": p.queries_tokens,
            "prefix_hit_tokens": p.hit_tokens,
            "evictions": p.evictions,
        }

    # -- forward passes -------------------------------------------------------------------------
    def step(self, rows: Sequence[int], tokens: int) -> PagedStep:
        """A forward pass of ``tokens`` new positions for each of ``rows`` (their slots given already)."""
        return PagedStep(self, list(rows), tokens)

    def begin(self, tokens: int, valid: Sequence[int] | None = None) -> PagedStep:
        """A forward pass of ``tokens`` new positions for every row (``model(ids, cache)``), ``valid[b]``
        of them real; rows that lack the slots get them (``reserve``).

        Right padding (``valid[b] < tokens``) needs rows of one block each (``model.new_cache``):
        the padding's keys and values are written past the row's length, inside its block.
        """
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
            raise ShapeError(f"PagedKVCache.begin: tokens must be an int >= 1, got {tokens!r}")
        if valid is not None:
            valid = list(valid)
            if len(valid) != self.batch or any(not 0 <= n <= tokens for n in valid):
                raise ShapeError(
                    f"PagedKVCache.begin: valid must give each of the {self.batch} rows 0..{tokens} real tokens, "
                    f"got {valid!r}"
                )
            if self.table_width != 1 and any(n != tokens for n in valid):
                raise ShapeError(
                    "PagedKVCache.begin: right-padded rows need one block per row (model.new_cache); "
                    "run each row's prompt alone"
                )
        rows = list(range(self.batch))
        top = max(self.lengths)
        if top + tokens > self.max_positions:
            raise ShapeError(
                f"PagedKVCache.begin: {tokens} new token(s) after {top} cached ones exceed the cache's "
                f"{self.max_positions} positions"
            )
        # Padded rows get slots for every written position (their block); the step advances them by valid.
        self.reserve(rows, [self.lengths[r] + tokens for r in rows])
        return PagedStep(self, rows, tokens, valid)

    def rows_step(self, rows: list[int]) -> PagedStep:
        """One new token for each of ``rows`` (the generic decode step's cache step); rows that lack
        the slot get it (``reserve``)."""
        self.reserve(rows, [self.lengths[r] + 1 for r in rows])
        return PagedStep(self, rows, 1)

    def reserve(self, rows: Sequence[int], ends: Sequence[int]) -> None:
        """Give each of ``rows`` slots up to position ``ends[i]`` (exclusive), starting a row that holds
        no sequence: what a forward pass over ``model.new_cache`` needs, where no scheduler hands out
        blocks. Rows with the slots already (``start``/``grow`` by a KV manager) are left as they are;
        ``KVCacheFull`` when the pool runs out (rows reserved before that keep their slots). Only
        without prefix caching: its blocks are keyed by the token ids, which a reservation does not know."""
        for r, end in zip(rows, ends):
            self._row(r, "reserve")
            if end > self.max_positions:
                raise ShapeError(
                    f"PagedKVCache.reserve: row {r} cannot reach position {end}: the cache holds "
                    f"{self.max_positions} positions"
                )
            have = self.pool.length(r) if r in self.pool else 0
            if have >= end:
                continue
            if self.prefix_caching:  # the blocks would be keyed by made-up token ids
                raise KaelError(
                    f"PagedKVCache.reserve: row {r} has slots for {have} positions, not {end}; with prefix "
                    "caching on, start() or grow() it with its token ids first"
                )
            if r not in self.pool:
                self.start(r, [0] * end)  # token ids matter only to prefix caching, which such a cache has off
            for _ in range(self.pool.length(r), end):
                self.grow([r], [0])

    # -- the direct decode steps' path (kernels, no frontend) -----------------------------------
    attention_op = "paged_attention"

    def decode_context(self, rows: list[int], pos: list[int]) -> tuple[list[int], list[int], Tensor, Tensor]:
        """What ``attend_rows`` needs for one decode step: the rows' tables and lengths as int64 tensors
        (rows that lack the slot for position ``pos[i]`` get it: ``reserve``)."""
        self.reserve(rows, [p + 1 for p in pos])
        tables = self.table_tensor(rows)
        lengths = tensor([p + 1 for p in pos], dtype=dt.int64, device=self.device)
        return rows, pos, tables, lengths

    def block_ids(self, row: int) -> list[int]:
        """``row``'s block table as the kernels read it: a released entry names the row's first block
        still held, whose keys the window skips or weights by zeros (NOTE [sliding-window blocks])."""
        t = self.tables[row]
        if not t or t[0] != RELEASED:
            return t
        held = next((b for b in t if b != RELEASED), 0)
        return [held if b == RELEASED else b for b in t]

    def table_tensor(self, rows: Sequence[int]) -> Tensor:
        """The rows' block tables as int64 [len(rows), table_width] (``block_ids``), padded with block 0
        (never read)."""
        width = self.table_width
        flat: list[int] = []
        for r in rows:
            t = self.block_ids(r)
            flat.extend(t)
            flat.extend([0] * (width - len(t)))
        return view(tensor(flat, dtype=dt.int64, device=self.device), len(rows), width)

    def attend_rows(
        self,
        k: dict[str, Any],
        layer: int,
        ctx: tuple[list[int], list[int], Tensor, Tensor],
        qs: list[Tensor],
        kvs: list[Tensor],
        atts: list[Tensor],
        scale: float,
        q_all: Tensor | None = None,
        att_all: Tensor | None = None,
        window: int = 0,
    ) -> None:
        """Write each row's new keys/values (``kvs[i]`` [1, 2, Hkv, 1, D]) at its position and attend
        query ``qs[i]`` [1, H, 1, D] to its blocks into ``atts[i]``, with the backend's kernels (a sliding
        ``window`` when > 0: the kernel's trailing argument, backend API 1.4).

        With ``q_all``/``att_all`` (the same rows as one [n, H, 1, D] view each) one kernel call serves
        every row: the kernel's result for a row does not depend on the others (the catalogue's rule).
        """
        rows, pos, tables, lengths = ctx
        copy, attend = k["copy"], k["paged_attention"]
        buf = self.data[layer]
        st, s_, w = buf._strides, self.block_size, self.table_width
        h, d = self.heads, self.head_dim
        i, n = 0, len(rows)
        while i < n:  # a row's consecutive entries in one block (NOTE [entries at positions]) in one copy
            r, p = rows[i], pos[i]
            block, m = self.tables[r][p // s_], 1
            while i + m < n and rows[i + m] == r and pos[i + m] == p + m and (p + m) % s_:
                m += 1
            dst = make_view(buf, (1, 2, h, m, d), st, buf._offset + block * st[0] + (p % s_) * st[3])
            src = kvs[i]
            if m > 1:
                ks = src._strides
                src = make_view(src, (1, 2, h, m, d), (ks[0], ks[1], ks[2], ks[0], ks[4]), src._offset)
            copy(dst, src)
            i += m
        extra = (window,) if window else ()
        if q_all is not None and att_all is not None:
            attend(att_all, q_all, buf, tables, lengths, scale, *extra)
            return
        for i in range(len(rows)):
            attend(
                atts[i],
                qs[i],
                buf,
                make_view(tables, (1, w), (w, 1), tables._offset + i * w),
                make_view(lengths, (1,), (1,), lengths._offset + i),
                scale,
                *extra,
            )

    def bump_versions(self) -> None:
        """Bump the storage version counter of every layer's buffer (NOTE [version counter]).

        For code that wrote the cache with backend kernels directly (the fast decode steps), as an in-place
        op would have: autograd then refuses a backward through a tensor saved from before the write.
        """
        for b in self.data:  # written in place, like an in-place op would
            b._bump_version()

    # -- internals ------------------------------------------------------------------------------
    def _copy_slots(self, src: int, dst: int, slots: int) -> None:
        with no_grad():
            for buf in self.data:
                copy_(narrow(select(buf, 0, dst), 2, 0, slots), narrow(select(buf, 0, src), 2, 0, slots))

    def _written_slots(self, block: int) -> int:
        """How many leading slots of full ``block``, in use, have their K/V written: as far as a row
        holding it has computed (a prompt started in this step has registered its blocks before its
        pass writes them, but the slots ``start`` copied into its partial block are written)."""
        bs, most = self.block_size, 0
        for row, table in enumerate(self.tables):
            try:
                at = table.index(block)
            except ValueError:
                continue
            most = max(most, min(bs, self.lengths[row] - at * bs))
        return most

    def _row(self, row: Any, op: str) -> None:
        if isinstance(row, bool) or not isinstance(row, int) or not 0 <= row < self.batch:
            raise ShapeError(f"PagedKVCache.{op}: row {row!r} is out of range for {self.batch} rows")

    def __repr__(self) -> str:
        return (
            f"PagedKVCache(layers={self.layers}, batch={self.batch}, heads={self.heads}, head_dim={self.head_dim}, "
            f"max_positions={self.max_positions}, blocks={self.num_blocks}x{self.block_size}, window={self.window}, "
            f"used={self.pool.used_blocks}, cached={self.pool.cached_blocks}, lengths={self.lengths})"
        )
