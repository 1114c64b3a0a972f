"""``BatchDecoder``: continuous batching for any ``CausalLM``, one KV-cache row per sequence.

A server that decodes several sequences at once keeps them in one ``PagedKVCache`` with
``rows`` rows (``paged=False``: one block of the whole context per row). A sequence is prefilled alone into a free row (``prefill``), then each
``decode`` feeds one new token for every sequence in a chosen set of rows through the
model in one pass, so the weights are read once per step for all of them. Sequences
join and leave between steps; the others are not disturbed.

NOTE [batched = alone]: every row must get the logits it would get from
``model.generate`` alone, so greedy decoding is token-for-token identical and a seeded
sample does not depend on what else runs. Hence:

* a prompt runs alone through ``model.run_layer`` over its row's blocks, so the first
  token's logits are computed exactly as alone;
* a decode step is the family's (``model.decode_step``: GPT-2's calls the kernels
  directly) or the generic one over its modules (``_steps.GenericStep``), the same step
  ``generate`` runs with one row;
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
``model.run_layer`` alone, exactly the calls ``prefill`` makes; but the prompts go layer
by layer together, so a layer's weights are read from memory for the first prompt and
from cache for the others, and the last positions share one LM-head product (rows of
``[n, 1, C]``, as in a decode step).

"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .. import _dtype as dt
from .._errors import KaelError, ShapeError
from .._tensor import Tensor
from ..autograd import no_grad
from ..ops import Generator, argmax, cat, narrow, tensor, view
from ._generate import _prompt_ids, sample_next
from ._paged_cache import DEFAULT_BLOCK_SIZE, KVCacheFull, PagedKVCache, model_identity
from ._steps import decode_step

if TYPE_CHECKING:
    from ._protocol import CausalLM

__all__ = ["BatchDecoder", "KVCacheFull"]


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

    def __init__(
        self,
        model: CausalLM,
        rows: int,
        max_positions: int | None = None,
        *,
        direct: bool | None = None,
        paged: bool = True,
        kv_cache_tokens: int | None = None,
        block_size: int = DEFAULT_BLOCK_SIZE,
        prefix_caching: bool = True,
    ) -> None:
        """``direct``: None takes the family's fast decode step when the backend allows it, True insists
        on it, False always runs the generic step over the model's modules.

        ``paged`` (the default) keeps the keys and values in a ``PagedKVCache`` of blocks of
        ``block_size`` positions holding ``kv_cache_tokens`` in all (default: ``rows`` times the
        context, what one row per sequence would take), with automatic prefix caching unless
        ``prefix_caching`` is False (NOTE [paged kv cache] in _paged_cache.py); ``paged=False``
        gives every row one block of the whole context (``block_size`` and ``kv_cache_tokens`` are
        then ignored, and nothing is shared by prefix) in the same ``PagedKVCache``.
        """
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
            raise ShapeError(f"BatchDecoder: rows must be an int >= 1, got {rows!r}")
        self.model = model
        self.rows = rows
        self.vocab_size = model.vocab_size
        n = model.max_positions if max_positions is None else max_positions
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= model.max_positions:
            raise ShapeError(f"BatchDecoder: max_positions must be an int in 1..{model.max_positions}, got {n!r}")
        if paged:
            if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
                raise ShapeError(f"BatchDecoder: block_size must be an int >= 1, got {block_size!r}")
            tokens = rows * n if kv_cache_tokens is None else kv_cache_tokens
            if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < n:
                raise ShapeError(
                    f"BatchDecoder: kv_cache_tokens must be an int of at least one sequence's {n} positions, "
                    f"got {kv_cache_tokens!r}"
                )
        else:  # one block per row, the row's whole context: a contiguous cache as a block table
            block_size, tokens, prefix_caching = n, rows * n, False
        self._paged = bool(paged)
        shape = model.new_cache(1, 1)  # the protocol's way to learn the cache's layers, heads and head size
        self.cache = PagedKVCache(
            shape.layers,
            rows,
            shape.heads,
            shape.head_dim,
            n,
            num_blocks=-(-tokens // block_size),
            block_size=block_size,
            prefix_caching=prefix_caching,
            namespace=model_identity(model) if prefix_caching else "",
            window=model.kv_window,  # NOTE [sliding-window blocks]: blocks behind every layer's window go back
            dtype=model.dtype,
            device=model.device,
        )
        self.active = [False] * rows
        self.preemptions = 0
        try:
            self._step = decode_step(model, self.cache, direct)
        except KaelError as exc:
            raise KaelError(f"BatchDecoder: {exc}") from None

    @property
    def block_size(self) -> int:
        """Positions per KV block (the whole context without paging)."""
        return self.cache.block_size

    @property
    def paged(self) -> bool:
        """Whether the keys and values are paged in blocks shared by prefix (False: one block per row)."""
        return self._paged

    def cached_tokens(self, row: int) -> int:
        """Leading prompt tokens of ``row``'s sequence whose keys and values came from the prefix
        cache (or a fork) rather than being computed."""
        self._check_row(row, "cached_tokens")
        return self.cache.cached[row] if self.active[row] else 0

    def blocks_needed(self, rows: Sequence[int]) -> int:
        """KV blocks the next ``decode(rows, ...)`` takes from the pool (0 without paging)."""
        return self.cache.blocks_needed(list(rows))

    @property
    def free_blocks(self) -> int:
        """KV blocks that can be handed out now (free or cached); without paging, the free rows."""
        return self.cache.pool.free_blocks

    def kv_stats(self) -> dict[str, int]:
        """Block and prefix-cache counters (``PagedKVCache.stats``)."""
        return self.cache.stats()

    @property
    def max_positions(self) -> int:
        """The most tokens (prompt and generated) one row can hold: its cache's ``max_positions``."""
        return self.cache.max_positions

    def length(self, row: int) -> int:
        """Tokens cached in ``row`` (0 for a free row)."""
        self._check_row(row, "length")
        return self.cache.lengths[row] if self.active[row] else 0

    # -- sequences join and leave -----------------------------------------------------------------
    def prefill(self, row: int, prompt: Any) -> Tensor:
        """Start a sequence in free ``row``: run ``prompt`` (token ids) alone into it; logits [V] after it.

        Paged: the prompt's longest cached prefix of whole blocks is reused, only the rest runs;
        ``KVCacheFull`` (nothing changed) when the pool cannot hold it.
        """
        (ids,) = self._check_prefill("prefill", [row], [prompt])
        return view(self._paged_prefill([row], [ids]), self.vocab_size)

    def prefill_many(self, rows: Sequence[int], prompts: Sequence[Any]) -> Tensor:
        """Start several sequences at once, ``prompts[i]`` into free ``rows[i]``; logits [len(rows), V].

        Row i's logits are bit-identical to ``prefill(rows[i], prompts[i])``: each prompt goes
        through the same calls as alone (NOTE [batched prefill]), but layer by layer across
        the prompts, so each layer's weights come from memory once for all of them, and one
        LM-head product serves every prompt's last position.
        """
        rows, prompts = _as_list("prefill_many", "rows", rows), _as_list("prefill_many", "prompts", prompts)
        idss = self._check_prefill("prefill_many", rows, prompts)
        return self._paged_prefill(rows, idss)

    def _paged_prefill(self, rows: list[int], idss: list[list[int]]) -> Tensor:
        """Blocks for every prompt first (all or none: ``KVCacheFull``), then each prompt's uncached
        tokens through the layers, prompt by prompt within each layer; logits [len(rows), V].

        A later prompt may reuse blocks an earlier one of the same call is filling: within a layer
        the earlier prompt runs first, so those keys and values are written before they are read.
        """
        cache, model = self.cache, self.model
        started: list[int] = []
        try:
            for r, ids in zip(rows, idss):
                cache.start(r, ids)
                started.append(r)
        except BaseException:
            for r in started:
                cache.release(r, keep=False)
            raise
        try:
            with no_grad():
                steps = [cache.step([r], len(ids) - cache.lengths[r]) for r, ids in zip(rows, idss)]
                xs = [
                    model.embed(tensor([ids[len(ids) - st.tokens :]], dtype=dt.int64, device=model.device), st.starts)
                    for ids, st in zip(idss, steps)
                ]
                for i in range(model.num_layers):
                    xs = [model.run_layer(i, x, st) for x, st in zip(xs, steps)]
                lasts = [narrow(x, 1, st.tokens - 1, 1) for x, st in zip(xs, steps)]
                logits = model.run_head(lasts[0] if len(lasts) == 1 else cat(lasts, 0))
        except BaseException:
            for r in rows:  # their keys and values are not all written: keep none of their blocks
                cache.release(r, keep=False)
            raise
        for r, st in zip(rows, steps):
            st.commit()
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
        self.cache.fork(src, dst)  # the blocks are shared; an append copies a shared last block first
        self.active[dst] = True

    def release(self, row: int) -> None:
        """Forget ``row``'s sequence (its memory is reused by the next prefill)."""
        self._check_row(row, "release")
        self.active[row] = False
        self.cache.release(row)

    def preempt(self, row: int) -> None:
        """Release ``row`` because the pool needs its blocks (counted in ``preemptions``); its full
        blocks stay cached, so recomputing the sequence later may reuse them."""
        self.release(row)
        self.preemptions += 1

    # -- one step for many sequences ----------------------------------------------------------
    def decode(self, rows: Sequence[int], tokens: Sequence[int]) -> Tensor:
        """Append ``tokens[i]`` to the sequence in ``rows[i]``, all in one pass; logits [len(rows), V].

        A row whose next slot was granted already (``cache.grow`` by a KV manager, with this token)
        is not grown again."""
        rows, tokens = _as_list("decode", "rows", rows), _as_list("decode", "tokens", tokens)
        self._check_step(rows, tokens)
        pool, lengths = self.cache.pool, self.cache.lengths
        todo = [i for i, r in enumerate(rows) if pool.length(r) <= lengths[r]]  # a KV manager may have granted it
        if todo:  # KVCacheFull before anything changes: the caller preempts
            self.cache.grow([rows[i] for i in todo], [tokens[i] for i in todo])
        with no_grad():
            logits = self._step(rows, tokens)
        for r in rows:
            self.cache.lengths[r] += 1
        return logits

    def allow_drafts(self, drafts: int) -> bool:
        """Lets one step carry up to ``drafts`` more tokens per row (``decode_entries``), rebuilding the
        family's direct step for ``rows * (1 + drafts)`` entries if it was built for fewer. False when
        the step cannot take positions (the generic step; a family without NOTE [entries at positions]
        in ``_steps.py``): the caller then verifies drafts another way (``model.run_layer``)."""
        if isinstance(drafts, bool) or not isinstance(drafts, int) or drafts < 0:
            raise ShapeError(f"BatchDecoder.allow_drafts: drafts must be an int >= 0, got {drafts!r}")
        if not self.takes_entries:
            return False
        want = self.rows * (1 + drafts)
        if self.cache.step_rows < want:
            self.cache.step_rows = want
            self._step = decode_step(self.model, self.cache, True)
        return True

    @property
    def takes_entries(self) -> bool:
        """Whether ``decode_entries`` may feed a row several tokens (its step takes positions)."""
        return bool(getattr(self._step, "takes_positions", False))

    def decode_entries(self, rows: Sequence[int], tokens: Sequence[int], positions: Sequence[int]) -> Tensor:
        """Feed ``tokens[i]`` at ``positions[i]`` of the sequence in ``rows[i]``, all in one pass (NOTE
        [entries at positions] in ``_steps.py``); logits [len(rows), V], a view the next step overwrites.

        A row may appear several times, at consecutive positions from its length (a decode step's token
        and drafts after it); each entry's logits are those of its token fed by ``decode`` one step at a
        time. Slots not granted yet are grown here (``KVCacheFull`` before any is). Each row's length becomes its last
        position plus one (drop rejected positions with ``cache.truncate``)."""
        rows = _as_list("decode_entries", "rows", rows)
        tokens = _as_list("decode_entries", "tokens", tokens)
        pos = _as_list("decode_entries", "positions", positions)
        if len(pos) != len(rows):
            raise ShapeError(f"BatchDecoder.decode_entries: {len(rows)} rows but {len(pos)} positions")
        self._check_step(rows, tokens, distinct=False)
        if not self.takes_entries:
            raise KaelError(
                f"BatchDecoder.decode_entries: {type(self._step).__name__} takes one token per row (no positions)"
            )
        nxt: dict[int, int] = {}
        for r, p in zip(rows, pos):
            want = nxt.get(r, self.cache.lengths[r])
            if isinstance(p, bool) or not isinstance(p, int) or p != want:
                raise ShapeError(
                    f"BatchDecoder.decode_entries: row {r}'s entries must be at consecutive positions from its "
                    f"length {self.cache.lengths[r]}; expected {want}, got {p!r}"
                )
            if p >= self.cache.max_positions:
                raise ShapeError(f"BatchDecoder.decode_entries: row {r} is full ({self.cache.max_positions} positions)")
            nxt[r] = p + 1
        if len(rows) > self.cache.step_rows:
            raise ShapeError(
                f"BatchDecoder.decode_entries: {len(rows)} entries, but the step takes {self.cache.step_rows} "
                "(allow_drafts raises it)"
            )
        missing: dict[int, list[int]] = {}  # each row's entries without a slot yet (a suffix of its entries)
        for r, t, p in zip(rows, tokens, pos):
            if self.cache.pool.length(r) <= p:
                missing.setdefault(r, []).append(t)
        if missing:  # KVCacheFull before anything changes: the caller preempts
            self.cache.extend(list(missing), list(missing.values()))
        with no_grad():
            step: Any = self._step  # a step with takes_positions takes them (NOTE [entries at positions])
            logits: Tensor = step(rows, tokens, pos)
        for r, end in nxt.items():
            self.cache.lengths[r] = end
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

    def _check_step(self, rows: list[int], tokens: list[int], distinct: bool = True) -> None:
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
        if distinct and len(set(rows)) != len(rows):
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
