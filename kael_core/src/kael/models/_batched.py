"""``BatchDecoder``: continuous batching for GPT-2, one KV-cache row per sequence.

A server that decodes several sequences at once keeps them in one ``KVCache`` of
``rows`` rows. A sequence is prefilled alone into a free row (``prefill``), then each
``decode`` feeds one new token for every sequence in a chosen set of rows through the
model in one pass, so the weights are read once per step for all of them. Sequences
join and leave between steps; the others are not disturbed.

NOTE [batched = alone]: every row must get the logits it would get from
``model.generate`` alone, so greedy decoding is token-for-token identical and a seeded
sample does not depend on what else runs. Hence:

* the prefill is ``generate``'s own (``_generate._prefill``) over a batch-1 view of the
  row, so the first token's logits are computed exactly as alone;
* a decode step hands the row-wise ops (layer norm, linear, gelu, residual adds) the
  activations as ``[n, 1, C]``, one ``[1, C]`` row per sequence, as a batch of n
  independent products. A backend whose product rounds a row the same way whatever the
  row count (the NumPy reference: one gemv per row; the C++ backend's few-row kernels)
  then gives bit-identical logits; one that does not still gives the same logits up to
  float rounding;
* attention runs per row over exactly that row's keys (no padding, no length mask: a
  masked tail changes how a softmax sum is grouped, and so its rounding).

NOTE [batched prefill]: ``prefill_many`` starts several sequences in one call without
giving up that identity. A prompt's rows cannot share a product with another prompt's
(a backend may round a product of more rows differently), so each prompt still runs
``GPT.run_layer`` alone, exactly the calls ``prefill`` makes; but the prompts go layer
by layer together, so a layer's weights are read from memory for the first prompt and
from cache for the others, and the last positions share one LM-head product (rows of
``[n, 1, C]``, as in a decode step).

A decode step calls the backend's kernels directly, like ``Decoder`` (eleven batched
calls per layer plus two per row), reusing buffers sized for all rows; a backend
without the fused kernels gets the general forward pass (``GPT.run``) with a cache step
that writes and attends per row.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .. import _dispatch
from .. import _dtype as dt
from .._errors import KaelError, ShapeError
from .._tensor import Tensor
from ..autograd import no_grad
from ..ops import Generator, add, argmax, attention, cat, narrow, select, view
from ..ops._core import empty
from ..ops._inplace import copy_
from ..ops._views import make_view
from ._generate import _embed, _prefill, _prompt_ids, sample_next
from ._kv_cache import KVCache

if TYPE_CHECKING:
    from ._gpt2 import GPT, Plan

__all__ = ["BatchDecoder"]

_FUSED = ("layer_norm", "linear", "gelu", "attention")


def _row_cache(cache: KVCache, row: int) -> KVCache:
    """Row ``row`` of ``cache`` as a batch-1 KVCache sharing its memory (lengths kept apart)."""
    one = KVCache.__new__(KVCache)
    one.layers, one.batch, one.heads = cache.layers, 1, cache.heads
    one.head_dim, one.max_positions = cache.head_dim, cache.max_positions
    one.data = [narrow(d, 0, row, 1) for d in cache.data]
    one.keys = [select(d, 1, 0) for d in one.data]
    one.values = [select(d, 1, 1) for d in one.data]
    one.lengths = [0]
    return one


class BatchDecoder:
    """Decodes up to ``rows`` sequences of ``model`` together, each in its own cache row.

    >>> engine = BatchDecoder(model, rows=4)             # doctest: +SKIP
    >>> first = engine.prefill(0, [464, 2068])           # logits [V] after the prompt
    >>> engine.prefill(2, [15496])                       # doctest: +SKIP
    >>> logits = engine.decode([0, 2], [11, 13])         # [2, V]: row 0 then row 2
    >>> engine.greedy(logits)                            # doctest: +SKIP
    [262, 13]
    >>> engine.release(0)                                # row 0 is free again
    >>> firsts = engine.prefill_many([0, 1], [[40], [1, 2, 3]])  # [2, V], each as prefill alone

    ``decode`` returns a view of a buffer that the next ``decode`` overwrites. Not thread
    safe: one thread drives an engine.
    """

    def __init__(self, model: GPT, rows: int, max_positions: int | None = None, *, direct: bool | None = None) -> None:
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
            raise ShapeError(f"BatchDecoder: rows must be an int >= 1, got {rows!r}")
        self.model = model
        self.rows = rows
        self.vocab_size = model.vocab_size
        self.cache = model.new_cache(rows, max_positions)
        self.plan = model.plan()
        self.active = [False] * rows
        kernels = _direct_kernels(model.device.type)
        if direct is None:
            direct = kernels is not None
        if direct and kernels is None:
            raise KaelError(f"BatchDecoder: the {model.device.type!r} backend lacks a fused kernel of {_FUSED}")
        self._steps = _Kernels(model, self.plan, self.cache, kernels) if direct and kernels is not None else None

    @property
    def max_positions(self) -> int:
        return self.cache.max_positions

    def length(self, row: int) -> int:
        """Tokens cached in ``row`` (0 for a free row)."""
        self._check_row(row, "length")
        return self.cache.lengths[row] if self.active[row] else 0

    # -- sequences join and leave -----------------------------------------------------------------
    def prefill(self, row: int, prompt: Any) -> Tensor:
        """Start a sequence in free ``row``: run ``prompt`` (token ids) alone into it; logits [V] after it."""
        (ids,) = self._check_prefill("prefill", [row], [prompt])
        one = _row_cache(self.cache, row)
        with no_grad():
            logits = _prefill(self.model, self.plan, ids, one)
        self.cache.lengths[row] = one.lengths[0]
        self.active[row] = True
        return logits

    def prefill_many(self, rows: Sequence[int], prompts: Sequence[Any]) -> Tensor:
        """Start several sequences at once, ``prompts[i]`` into free ``rows[i]``; logits [len(rows), V].

        Row i's logits are bit-identical to ``prefill(rows[i], prompts[i])``: each prompt goes
        through the same calls as alone (NOTE [batched prefill]), but layer by layer across
        the prompts, so each layer's weights come from memory once for all of them, and one
        LM-head product serves every prompt's last position.
        """
        rows, prompts = _as_list("prefill_many", "rows", rows), _as_list("prefill_many", "prompts", prompts)
        idss = self._check_prefill("prefill_many", rows, prompts)
        model, p = self.model, self.plan
        ones = [_row_cache(self.cache, r) for r in rows]
        with no_grad():
            steps = [one.begin(len(ids)) for one, ids in zip(ones, idss)]
            xs = [_embed(model, p, ids) for ids in idss]
            for i in range(len(p.layers)):
                xs = [model.run_layer(i, x, p, step) for x, step in zip(xs, steps)]
            lasts = [narrow(x, 1, len(ids) - 1, 1) for x, ids in zip(xs, idss)]
            logits = model.run_head(lasts[0] if len(lasts) == 1 else cat(lasts, 0), p)
        for r, one, step in zip(rows, ones, steps):
            step.commit()
            self.cache.lengths[r] = one.lengths[0]
            self.active[r] = True
        return view(logits, len(rows), self.vocab_size)

    def fork(self, src: int, dst: int) -> None:
        """Start free row ``dst`` as a copy of row ``src``'s sequence (its cached keys and values).

        Several continuations of one prompt share its prefill this way (``n`` choices): prefill
        once, fork, then decode each row; every row then decodes exactly as the source would.
        """
        self._check_row(src, "fork")
        self._check_row(dst, "fork")
        if not self.active[src]:
            raise KaelError(f"BatchDecoder.fork: row {src} holds no sequence; prefill it first")
        if self.active[dst]:
            raise KaelError(f"BatchDecoder.fork: row {dst} is in use; release it first")
        n = self.cache.lengths[src]
        with no_grad():
            for buf in self.cache.data:  # [B, 2, H, P, D]: the source's first n positions
                copy_(narrow(select(buf, 0, dst), 2, 0, n), narrow(select(buf, 0, src), 2, 0, n))
        self.cache.lengths[dst] = n
        self.active[dst] = True

    def release(self, row: int) -> None:
        """Forget ``row``'s sequence (its memory is reused by the next prefill)."""
        self._check_row(row, "release")
        self.active[row] = False
        self.cache.reset(row)

    # -- one step for many sequences ----------------------------------------------------------
    def decode(self, rows: Sequence[int], tokens: Sequence[int]) -> Tensor:
        """Append ``tokens[i]`` to the sequence in ``rows[i]``, all in one pass; logits [len(rows), V]."""
        rows, tokens = _as_list("decode", "rows", rows), _as_list("decode", "tokens", tokens)
        self._check_step(rows, tokens)
        with no_grad():
            if self._steps is not None:
                logits = self._steps(rows, tokens)
            else:
                logits = self._general(rows, tokens)
        for r in rows:
            self.cache.lengths[r] += 1
        return logits

    @staticmethod
    def sample(logits: Tensor, temperature: float = 0.0, top_k: int = 0, generator: Generator | None = None) -> int:
        """The next token from one row's logits [V] (``sample_next``, as ``generate`` draws it)."""
        return int(sample_next(logits, temperature, top_k, generator))

    @staticmethod
    def greedy(logits: Tensor) -> list[int]:
        """Each row's greedy token from a step's logits [n, V] in one call: ``sample(row)`` of every row."""
        if not isinstance(logits, Tensor) or logits.ndim != 2 or not logits.dtype.is_floating_point:
            raise ShapeError(
                f"BatchDecoder.greedy: logits must be a floating-point tensor [n, V], got "
                f"{getattr(logits, 'dtype', type(logits).__name__)!r} {list(getattr(logits, 'shape', ()))}"
            )
        if logits.shape[1] == 0:
            raise ShapeError(f"BatchDecoder.greedy: logits [n, V] need V >= 1, got {list(logits.shape)}")
        return [int(t) for t in argmax(logits, 1).tolist()]

    def _general(self, rows: list[int], tokens: list[int]) -> Tensor:
        """The decode step through ``GPT.run`` (any backend: fused ops may be decompositions)."""
        p, c = self.plan, self.model.config.dimension
        pos = [self.cache.lengths[r] for r in rows]
        x = cat([view(add(narrow(p.wte, 0, t, 1), narrow(p.wpe, 0, s, 1)), 1, 1, c) for t, s in zip(tokens, pos)], 0)
        logits = self.model.run(x, p, _RowsStep(self.cache, rows), None)  # type: ignore[arg-type]
        return view(logits, len(rows), self.vocab_size)

    def _check_row(self, row: Any, op: str) -> None:
        if isinstance(row, bool) or not isinstance(row, int) or not 0 <= row < self.rows:
            raise ShapeError(f"BatchDecoder.{op}: row {row!r} is out of range for {self.rows} rows")

    def _check_prefill(self, op: str, rows: list[int], prompts: list[Any]) -> list[list[int]]:
        """Free, distinct rows, one prompt each that leaves room in the cache: the prompts' ids."""
        if not rows or len(rows) != len(prompts):
            raise ShapeError(
                f"BatchDecoder.{op}: give one prompt per row (at least one), got {len(rows)} rows "
                f"and {len(prompts)} prompts"
            )
        for r in rows:
            self._check_row(r, op)
            if self.active[r]:
                raise KaelError(f"BatchDecoder.{op}: row {r} is in use; release it first")
        if len(set(rows)) != len(rows):
            raise ShapeError(f"BatchDecoder.{op}: rows {rows} repeat a row")
        idss = [_prompt_ids(prompt, self.vocab_size) for prompt in prompts]
        for ids in idss:
            if len(ids) >= self.cache.max_positions:
                raise ShapeError(
                    f"BatchDecoder.{op}: a prompt of {len(ids)} tokens leaves no room in the cache's "
                    f"{self.cache.max_positions} positions"
                )
        return idss

    def _check_step(self, rows: list[int], tokens: list[int]) -> None:
        if not rows or len(rows) != len(tokens):
            raise ShapeError(
                f"BatchDecoder.decode: give one token per row (at least one), got {len(rows)} rows "
                f"and {len(tokens)} tokens"
            )
        for r in rows:
            self._check_row(r, "decode")
            if not self.active[r]:
                raise KaelError(f"BatchDecoder.decode: row {r} holds no sequence; prefill it first")
            if self.cache.lengths[r] >= self.cache.max_positions:
                raise ShapeError(f"BatchDecoder.decode: row {r} is full ({self.cache.max_positions} positions)")
        if len(set(rows)) != len(rows):
            raise ShapeError(f"BatchDecoder.decode: rows {rows} repeat a row")
        for t in tokens:
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < self.vocab_size:
                raise ShapeError(
                    f"BatchDecoder.decode: token {t!r} is out of range for a vocabulary of {self.vocab_size}"
                )


def _as_list(op: str, name: str, value: Any) -> list[Any]:
    """``value`` (any iterable) as a list; a ShapeError naming ``op`` for anything else."""
    try:
        return list(value)
    except TypeError:
        raise ShapeError(f"BatchDecoder.{op}: {name} must be a sequence, got {type(value).__name__}") from None


def _direct_kernels(device_type: str) -> dict[str, Any] | None:
    kernels = {op: _dispatch.fused_kernel(device_type, op) for op in _FUSED}
    if any(k is None for k in kernels.values()):
        return None
    kernels["copy"] = _dispatch.kernel(device_type, "copy")
    kernels["add"] = _dispatch.kernel(device_type, "add")
    return kernels


class _RowsStep:
    """A cache step (the part of ``CacheStep`` that ``GPT.run`` uses) for one new token in each of ``rows``."""

    def __init__(self, cache: KVCache, rows: list[int]) -> None:
        self.cache, self.rows = cache, rows
        self.starts = [cache.lengths[r] for r in rows]

    def attend(self, layer: int, q: Tensor, kv: Tensor) -> Tensor:
        """q [n, H, 1, D]; kv [n, 2, H, 1, D]: write each row's keys and values, attend to its own keys."""
        buf, keys, values = self.cache.data[layer], self.cache.keys[layer], self.cache.values[layer]
        out = []
        for i, (r, s) in enumerate(zip(self.rows, self.starts)):
            copy_(narrow(select(buf, 0, r), 2, s, 1), select(kv, 0, i))
            out.append(
                attention(
                    narrow(q, 0, i, 1),
                    narrow(narrow(keys, 0, r, 1), 2, 0, s + 1),
                    narrow(narrow(values, 0, r, 1), 2, 0, s + 1),
                    causal=True,
                )
            )
        return cat(out, 0)


class _Kernels:
    """The direct-kernel decode step: buffers for all rows, views of the first n for a step of n rows."""

    def __init__(self, model: GPT, plan: Plan, cache: KVCache, kernels: dict[str, Any]) -> None:
        cfg = model.config
        c, h, d, n = cfg.dimension, cfg.heads, cfg.head_dim, cache.batch
        dev, dtype = model.device, model.dtype
        stat = dt.float64 if dtype is dt.float64 else dt.float32
        self.plan, self.cache, self.k = plan, cache, kernels
        self.c, self.h, self.d, self.v = c, h, d, model.vocab_size
        self.eps, self.scale = cfg.layer_norm_epsilon, 1.0 / math.sqrt(d)
        self.x = empty((n, 1, c), dtype, dev)  # the residual stream, one row per sequence of the step
        self.norm = empty((n, 1, c), dtype, dev)
        self.mean, self.rstd = empty((n, 1), stat, dev), empty((n, 1), stat, dev)
        self.qkv = empty((n, 1, 3 * c), dtype, dev)
        self.att = empty((n, h, 1, d), dtype, dev)
        self.proj = empty((n, 1, c), dtype, dev)
        self.hidden = empty((n, 1, 4 * c), dtype, dev)
        self.act = empty((n, 1, 4 * c), dtype, dev)
        self.logits = empty((n, 1, model.vocab_size), dtype, dev)
        self._views: dict[int, tuple[Tensor, ...]] = {}

    def views(self, n: int) -> tuple[Tensor, ...]:
        """The first n rows of every buffer (made once per n)."""
        got = self._views.get(n)
        if got is None:
            c = self.c

            def first(t: Tensor) -> Tensor:
                return make_view(t, (n, *t.shape[1:]), t._strides, t._offset)

            att_flat = make_view(self.att, (n, 1, c), (c, c, 1), 0)
            logits2 = make_view(self.logits, (n, self.v), (self.v, 1), 0)
            got = (
                first(self.x),
                first(self.norm),
                first(self.mean),
                first(self.rstd),
                first(self.qkv),
                att_flat,
                first(self.proj),
                first(self.hidden),
                first(self.act),
                first(self.logits),
                logits2,
            )
            self._views[n] = got
        return got

    def __call__(self, rows: list[int], tokens: list[int]) -> Tensor:
        cache, p, k = self.cache, self.plan, self.k
        layer_norm, linear, copy, attention_k, add_k, gelu = (
            k["layer_norm"],
            k["linear"],
            k["copy"],
            k["attention"],
            k["add"],
            k["gelu"],
        )
        n, c, h, d, eps = len(rows), self.c, self.h, self.d, self.eps
        x, norm, mean, rstd, qkv, att_flat, proj, hidden, act, logits, logits2 = self.views(n)
        s3 = 3 * c
        pos = [cache.lengths[r] for r in rows]
        for i, (t, s) in enumerate(zip(tokens, pos)):
            add_k(_row(self.x, i, c), _table_row(p.wte, t, c), _table_row(p.wpe, s, c))
        # Per-row views of the step's queries, new keys/values and attention output (as Decoder makes them).
        qs = [make_view(self.qkv, (1, h, 1, d), (s3, d, s3, 1), i * s3) for i in range(n)]
        kvs = [make_view(self.qkv, (1, 2, h, 1, d), (s3, c, d, s3, 1), i * s3 + c) for i in range(n)]
        atts = [make_view(self.att, (1, h, 1, d), (c, d, d, 1), i * c) for i in range(n)]
        for li, w in enumerate(p.layers):
            layer_norm(norm, mean, rstd, x, w.ln_1_w, w.ln_1_b, eps)
            linear(qkv, norm, w.attn_w, w.attn_b)
            buf = cache.data[li]  # [B, 2, H, P, D]
            st = buf._strides
            kst = (st[0], st[2], st[3], st[4])
            for i, (r, s) in enumerate(zip(rows, pos)):
                base = buf._offset + r * st[0]
                copy(make_view(buf, (1, 2, h, 1, d), st, base + s * st[3]), kvs[i])
                keys = make_view(buf, (1, h, s + 1, d), kst, base)
                values = make_view(buf, (1, h, s + 1, d), kst, base + st[1])
                attention_k(atts[i], qs[i], keys, values, self.scale, True, None)
            linear(proj, att_flat, w.attn_proj_w, w.attn_proj_b)
            add_k(x, x, proj)
            layer_norm(norm, mean, rstd, x, w.ln_2_w, w.ln_2_b, eps)
            linear(hidden, norm, w.fc_w, w.fc_b)
            gelu(act, hidden, "tanh")
            linear(proj, act, w.mlp_proj_w, w.mlp_proj_b)
            add_k(x, x, proj)
        layer_norm(norm, mean, rstd, x, p.ln_f_w, p.ln_f_b, eps)
        linear(logits, norm, p.wte, None)
        for b in cache.data:  # written in place, like an in-place op would
            b._storage.version += 1
        self.logits._storage.version += 1
        return logits2


def _row(t: Tensor, i: int, c: int) -> Tensor:
    """Row i of an [n, 1, c] buffer as a [1, 1, c] view."""
    return make_view(t, (1, 1, c), (c, c, 1), t._offset + i * c)


def _table_row(t: Tensor, index: int, c: int) -> Tensor:
    """Row ``index`` of a 2-d table as a [1, 1, c] view."""
    return make_view(t, (1, 1, c), (0, 0, t._strides[1]), t._offset + index * t._strides[0])
