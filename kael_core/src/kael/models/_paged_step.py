"""PagedStep: one forward pass over a ``PagedKVCache`` (``step``, ``begin``, ``rows_step``).

A step fixes its rows' start positions once (each row's cached length), writes every layer's
new keys and values at the rows' slots (given by ``start``/``grow`` beforehand, or reserved by
the cache's ``begin``/``rows_step``), attends each row to its own keys, and on ``commit``
advances each row's length by its valid new tokens.

NOTE [one block per row]: a cache whose rows each fit one block (``table_width == 1``: what
``model.new_cache`` makes, the contiguous cache of a forward pass) is a ``[B, 2, Hkv, P, D]``
buffer with a block table. Its step attends with ``attention`` over each row's block (one call
for all rows when they hold consecutive blocks and start together, as a fresh cache's rows do),
so its rows may be right-padded (``valid``) and it computes exactly what attention over a
contiguous cache computes; a cache of several blocks per row attends with ``paged_attention``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .. import _dtype as dt
from .. import ops
from .._errors import ShapeError
from .._tensor import Tensor
from ..autograd import no_grad
from ..ops import attention, cat, narrow, select, tensor
from ..ops._inplace import copy_
from ..ops._views import make_view

if TYPE_CHECKING:
    from ._paged_cache import PagedKVCache

__all__ = ["PagedStep"]


class PagedStep:
    """One forward pass over a PagedKVCache: ``tokens`` new positions for each of ``rows``.

    ``valid[i]`` of row ``rows[i]``'s tokens are real (right padding; one-block rows only): the
    step writes all ``tokens`` positions but ``commit`` advances the row by ``valid[i]``.
    """

    __slots__ = ("_lengths", "_tables", "cache", "ends", "rows", "starts", "tokens")

    def __init__(self, cache: PagedKVCache, rows: list[int], tokens: int, valid: Sequence[int] | None = None) -> None:
        self.cache, self.rows = cache, rows
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
            raise ShapeError(f"PagedKVCache: tokens must be an int >= 1, got {tokens!r}")
        self.tokens = tokens
        self.starts = [cache.lengths[r] for r in rows]
        self.ends = [s + tokens for s in self.starts] if valid is None else [s + n for s, n in zip(self.starts, valid)]
        for r, e in zip(rows, self.ends):
            if r not in cache.pool or e > cache.pool.length(r):
                have = cache.pool.length(r) if r in cache.pool else 0
                raise ShapeError(
                    f"PagedKVCache: row {r} has slots for {have} positions, not the {e} this step reaches; "
                    "start() or grow() it first"
                )
        self._tables = cache.table_tensor(rows)
        self._lengths = tensor([s + tokens for s in self.starts], dtype=dt.int64, device=cache.device)

    @property
    def positions(self) -> list[list[int]]:
        """Each row's positions of the new tokens."""
        return [list(range(s, s + self.tokens)) for s in self.starts]

    def attend(self, layer: int, q: Tensor, kv: Tensor, window: int | None = None) -> Tensor:
        """q [n, H, T, D]; kv [n, 2, Hkv, T, D] (new keys and values, any strides): write them at the
        rows' slots, attend each row to its own keys. Returns [n, H, T, D]."""
        cache, t, s_ = self.cache, self.tokens, self.cache.block_size
        buf = cache.data[layer]
        with no_grad():
            for i, (r, start) in enumerate(zip(self.rows, self.starts)):
                src = select(kv, 0, i)  # [2, Hkv, T, D]
                table, p = cache.tables[r], start
                while p < start + t:
                    slot = p % s_
                    n = min(s_ - slot, start + t - p)
                    dst = narrow(select(buf, 0, table[p // s_]), 2, slot, n)
                    copy_(dst, narrow(src, 2, p - start, n))
                    p += n
        if cache.table_width == 1:
            return self._attend_blocks(buf, q, window)
        w = cache.table_width
        if len(self.rows) == 1:
            return ops.paged_attention(q, buf, make_view(self._tables, (1, w), (w, 1), 0), self._lengths, window=window)
        outs = [
            ops.paged_attention(
                narrow(q, 0, i, 1),
                buf,
                make_view(self._tables, (1, w), (w, 1), i * w),
                make_view(self._lengths, (1,), (1,), i),
                window=window,
            )
            for i in range(len(self.rows))
        ]
        return cat(outs, 0)

    def _attend_blocks(self, buf: Tensor, q: Tensor, window: int | None = None) -> Tensor:
        """NOTE [one block per row]: ``attention`` over each row's block, in one call when it can."""
        t, starts, rows, tables = self.tokens, self.starts, self.rows, self.cache.tables
        keys, values = select(buf, 1, 0), select(buf, 1, 1)  # [NB, Hkv, S, D]
        first = tables[rows[0]][0]
        if all(tables[r][0] == first + i for i, r in enumerate(rows)):  # the rows' blocks are consecutive
            n = len(rows)
            k_rows, v_rows = narrow(keys, 0, first, n), narrow(values, 0, first, n)
            s0 = starts[0]
            if all(s == s0 for s in starts):
                # Every row starts at s0: causal attention over keys [0, s0 + T) is exact for every real
                # token (a right-padded row's padding only ever looks at its own earlier keys).
                k0, v0 = narrow(k_rows, 2, 0, s0 + t), narrow(v_rows, 2, 0, s0 + t)
                return attention(q, k0, v0, causal=True, window=window)
            if t == 1 and window is None:  # (lengths align every row's query at the last key: no window then)
                key_len = max(starts) + 1
                return attention(
                    q, narrow(k_rows, 2, 0, key_len), narrow(v_rows, 2, 0, key_len), causal=True, lengths=self._lengths
                )
        # Rows at different positions with several new tokens each (or scattered blocks): one call per row.
        outs = [
            attention(
                narrow(q, 0, i, 1),
                narrow(narrow(keys, 0, tables[r][0], 1), 2, 0, s + t),
                narrow(narrow(values, 0, tables[r][0], 1), 2, 0, s + t),
                causal=True,
                window=window,
            )
            for i, (r, s) in enumerate(zip(rows, starts))
        ]
        return outs[0] if len(outs) == 1 else cat(outs, 0)

    def commit(self) -> None:
        """Advance each row's length by its valid new tokens."""
        for r, e in zip(self.rows, self.ends):
            self.cache.lengths[r] = e
