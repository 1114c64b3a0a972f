"""KVCache: every layer's keys and values, preallocated to the context and written in place.

NOTE [kv cache layout]: layer ``l`` owns one buffer ``data[l]`` of shape
``[B, 2, H, P, D]`` (batch, key/value, heads, positions, head dim); ``keys[l]`` and
``values[l]`` are its ``[B, H, P, D]`` halves. One copy writes a step's keys and values
together (``qkv`` viewed as ``[B, T, 3, H, D]`` holds them side by side), and attention
reads the first ``length`` positions as strided views: nothing is allocated per step
but the step's own activations.

Each row of the batch has its own length, so sequences of different lengths share one
cache (right-padded prompts, batched decoding). A ``CacheStep`` is one forward pass
over the cache: it fixes the rows' start positions once, writes each layer's new keys
and values at them, runs attention over each row's valid keys, and on ``commit``
advances the lengths by each row's number of valid new tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import _dtype as dt
from .._errors import DTypeError, ShapeError
from .._tensor import Tensor
from ..autograd import no_grad
from ..ops import attention, cat, narrow, select, tensor, zeros
from ..ops._inplace import copy_
from ..ops._views import make_view

__all__ = ["KVCache", "CacheStep"]


def _count(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ShapeError(f"KVCache: {name} must be an int >= {minimum}, got {value!r}")
    return value


class KVCache:
    """Keys and values of ``layers`` layers for ``batch`` sequences of up to ``max_positions`` tokens.

    >>> cache = model.new_cache(batch=2)            # doctest: +SKIP
    >>> logits = model(ids, cache, lengths=[5, 3])  # doctest: +SKIP
    >>> cache.lengths                               # doctest: +SKIP
    [5, 3]
    """

    def __init__(
        self,
        layers: int,
        batch: int,
        heads: int,
        head_dim: int,
        max_positions: int,
        *,
        dtype: Any = None,
        device: Any = None,
    ) -> None:
        self.layers = _count("layers", layers, 1)
        self.batch = _count("batch", batch, 1)
        self.heads = _count("heads", heads, 1)
        self.head_dim = _count("head_dim", head_dim, 1)
        self.max_positions = _count("max_positions", max_positions, 1)
        d = dt.as_dtype(dtype) if dtype is not None else dt.float32
        if not d.is_floating_point:
            raise DTypeError(f"KVCache: dtype must be floating point, got {d!r}")
        # zeros, not empty: a masked key still multiplies its value by 0, and 0 * NaN is NaN.
        self.data: list[Tensor] = [
            zeros((batch, 2, heads, max_positions, head_dim), dtype=d, device=device) for _ in range(layers)
        ]
        self.keys: list[Tensor] = [select(b, 1, 0) for b in self.data]
        self.values: list[Tensor] = [select(b, 1, 1) for b in self.data]
        self.lengths: list[int] = [0] * batch

    @property
    def dtype(self) -> dt.DType:
        """The floating-point dtype of the cached keys and values (the model's compute dtype)."""
        return self.data[0].dtype

    @property
    def device(self) -> Any:
        """The ``kael.Device`` the cache's buffers live on (the model's)."""
        return self.data[0].device

    def reset(self, row: int | None = None) -> None:
        """Forget every row's tokens (or one row's); the memory is reused, not cleared."""
        if row is None:
            self.lengths = [0] * self.batch
        else:
            if isinstance(row, bool) or not isinstance(row, int) or not 0 <= row < self.batch:
                raise ShapeError(f"KVCache.reset: row {row!r} is out of range for a batch of {self.batch}")
            self.lengths[row] = 0

    def begin(self, tokens: int, valid: Sequence[int] | None = None) -> CacheStep:
        """Start a forward pass of ``tokens`` new positions per row (``valid[b]`` of them real)."""
        return CacheStep(self, tokens, valid)

    def rows_step(self, rows: list[int]) -> Any:
        """One new token for each of ``rows`` (the generic decode step's cache step, ``_steps.RowsStep``)."""
        from ._steps import RowsStep

        return RowsStep(self, rows)

    # -- the direct decode steps' path (kernels, no frontend; PagedKVCache has the same three) ----
    attention_op = "attention"

    def decode_context(self, rows: list[int], pos: list[int]) -> tuple[list[int], list[int]]:
        """What ``attend_rows`` needs for one decode step."""
        return rows, pos

    def attend_rows(
        self,
        k: dict[str, Any],
        layer: int,
        ctx: tuple[list[int], list[int]],
        qs: list[Tensor],
        kvs: list[Tensor],
        atts: list[Tensor],
        scale: float,
        q_all: Tensor | None = None,
        att_all: Tensor | None = None,
    ) -> None:
        """Write each row's new keys/values (``kvs[i]`` [1, 2, Hkv, 1, D]) at its position and attend
        query ``qs[i]`` [1, H, 1, D] to exactly its own keys into ``atts[i]``, with the backend's kernels."""
        rows, pos = ctx
        copy, attention_k = k["copy"], k["attention"]
        buf = self.data[layer]  # [B, 2, Hkv, P, D]
        st = buf._strides
        kst = (st[0], st[2], st[3], st[4])
        h, d = self.heads, self.head_dim
        for i, (r, s) in enumerate(zip(rows, pos)):
            base = buf._offset + r * st[0]
            copy(make_view(buf, (1, 2, h, 1, d), st, base + s * st[3]), kvs[i])
            keys = make_view(buf, (1, h, s + 1, d), kst, base)
            values = make_view(buf, (1, h, s + 1, d), kst, base + st[1])
            attention_k(atts[i], qs[i], keys, values, scale, True, None)

    def bump_versions(self) -> None:
        """Bump the storage version counter of every layer's buffer (NOTE [version counter]).

        For code that wrote the cache with backend kernels directly (the fast decode steps), as an in-place
        op would have: autograd then refuses a backward through a tensor saved from before the write.
        """
        for b in self.data:  # written in place, like an in-place op would
            b._bump_version()

    def __repr__(self) -> str:
        return (
            f"KVCache(layers={self.layers}, batch={self.batch}, heads={self.heads}, head_dim={self.head_dim}, "
            f"max_positions={self.max_positions}, lengths={self.lengths})"
        )


class CacheStep:
    """One forward pass over a KVCache: where each row's new tokens go and which keys each row sees."""

    __slots__ = ("_key_len", "_lengths", "cache", "ends", "starts", "tokens", "uniform")

    def __init__(self, cache: KVCache, tokens: int, valid: Sequence[int] | None) -> None:
        self.cache = cache
        self.tokens = _count("tokens", tokens, 1)
        if valid is not None and (len(valid) != cache.batch or any(not 0 <= n <= tokens for n in valid)):
            raise ShapeError(
                f"KVCache: valid must give each of the {cache.batch} rows 0..{tokens} real tokens, got {list(valid)!r}"
            )
        starts = list(cache.lengths)
        self.starts = starts
        room = cache.max_positions
        if max(starts) + tokens > room:
            raise ShapeError(
                f"KVCache: {tokens} new token(s) after {max(starts)} cached ones exceed the cache's {room} positions"
            )
        if valid is None:
            self.ends = [s + tokens for s in starts]
        else:
            self.ends = [s + n for s, n in zip(starts, valid)]
        s0 = starts[0]
        self.uniform = all(s == s0 for s in starts)
        self._lengths: Tensor | None = None
        if self.uniform:
            # Every row starts at s0: causal attention over keys [0, s0 + T) is exact for every real token
            # (a right-padded row's padding only ever looks at its own earlier keys).
            self._key_len = s0 + tokens
        else:
            self._key_len = max(starts) + tokens
            if tokens == 1:
                self._lengths = tensor([s + 1 for s in starts], dtype=dt.int64, device=cache.device)

    @property
    def positions(self) -> list[list[int]]:
        """Each row's positions of the new tokens (``starts[b] + t``)."""
        return [list(range(s, s + self.tokens)) for s in self.starts]

    def attend(self, layer: int, q: Tensor, kv: Tensor) -> Tensor:
        """Write this step's keys and values, and attend to the cache.

        q [B, H, T, D]; kv [B, 2, H, T, D] (new keys and values, any strides). Returns [B, H, T, D].
        """
        cache, t = self.cache, self.tokens
        buf = cache.data[layer]
        with no_grad():
            if self.uniform:
                copy_(narrow(buf, 3, self.starts[0], t), kv)
            else:
                for b, s in enumerate(self.starts):
                    copy_(narrow(select(buf, 0, b), 2, s, t), select(kv, 0, b))
        keys, values = cache.keys[layer], cache.values[layer]
        if self.uniform or t == 1:
            n = self._key_len
            return attention(q, narrow(keys, 2, 0, n), narrow(values, 2, 0, n), causal=True, lengths=self._lengths)
        # Rows at different positions with several new tokens each: the causal diagonal differs per row.
        rows = [
            attention(
                narrow(q, 0, b, 1),
                narrow(narrow(keys, 0, b, 1), 2, 0, s + t),
                narrow(narrow(values, 0, b, 1), 2, 0, s + t),
                causal=True,
            )
            for b, s in enumerate(self.starts)
        ]
        return cat(rows, 0)

    def commit(self) -> None:
        """Advance each row's length by its valid new tokens."""
        self.cache.lengths = self.ends
