"""``CausalLMBase``: the generic half of a causal-LM family (NOTE [model-family seam] in _protocol.py).

A family subclasses it and supplies ``embed``, ``run_layer``, ``run_head`` and the cache
shape (``num_layers``, ``num_kv_heads``, ``head_dim``); it gets ``forward`` with a KV cache,
right-padded rows and ``last_only``, ``run``, ``new_cache`` and ``generate`` from here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .. import _dtype as dt
from .._errors import AutogradError, DTypeError, ShapeError
from .._tensor import Tensor
from ..autograd import is_grad_enabled
from ..nn import Module
from ..ops import cat, narrow
from ._paged_cache import PagedKVCache
from ._paged_step import PagedStep

if TYPE_CHECKING:
    from ._protocol import DecodeStep

__all__ = ["CausalLMBase"]


class CausalLMBase(Module):
    """A decoder-only LM over kael ops; subclasses set ``vocab_size`` and ``max_positions``."""

    vocab_size: int
    max_positions: int
    #: The format of the projection weights (``kael.quantize``'s scheme: "q8_0", "q4_0", "bf16",
    #: "f16"), or None for float weights (NOTE [weights choice] in _weights.py).
    weights_scheme: str | None = None
    #: The checkpoint's ``GenerationConfig`` (its eos ids end a text), or None without one.
    generation_config: Any = None

    # -- what a family supplies -----------------------------------------------------------------
    @property
    def num_layers(self) -> int:
        """The number of transformer layers (``run_layer``'s ``i`` is in ``range(num_layers)``)."""
        raise NotImplementedError(f"{type(self).__name__} must define num_layers")

    @property
    def num_kv_heads(self) -> int:
        """Key/value heads per layer (what the KV cache holds; fewer than query heads under GQA)."""
        raise NotImplementedError(f"{type(self).__name__} must define num_kv_heads")

    @property
    def head_dim(self) -> int:
        """The size of one attention head's query, key and value vectors (the KV cache's last dim)."""
        raise NotImplementedError(f"{type(self).__name__} must define head_dim")

    @property
    def device(self) -> Any:
        """The ``kael.Device`` of the parameters (by default the first one's; families may name a tensor)."""
        return next(iter(self.parameters())).device

    @property
    def dtype(self) -> dt.DType:
        """The dtype the model computes in, its activations' and KV cache's (by default the first parameter's)."""
        return next(iter(self.parameters())).dtype

    def embed(self, ids: Tensor, starts: Sequence[int]) -> Tensor:
        """The residual stream [B, T, C] for int token ids [B, T], row b's tokens at positions ``starts[b] + t``.

        A family supplies it (NOTE [model-family seam] in _protocol.py); this base raises ``NotImplementedError``.
        """
        raise NotImplementedError(f"{type(self).__name__} must define embed")

    def run_layer(self, i: int, x: Tensor, step: Any) -> Tensor:
        """Layer ``i`` on the residual stream x [B, T, C], returning the new stream of the same shape.

        Its attention stores this pass's keys and values in ``step`` (a ``PagedStep`` or another ``StepLike``)
        and attends to the cache through it; ``step=None`` is causal attention over x's own T tokens.
        A family supplies it; this base raises ``NotImplementedError``.
        """
        raise NotImplementedError(f"{type(self).__name__} must define run_layer")

    def run_head(self, x: Tensor) -> Tensor:
        """The final norm and LM head: logits [B, T, V] for the residual stream x [B, T, C].

        A family supplies it; this base raises ``NotImplementedError``.
        """
        raise NotImplementedError(f"{type(self).__name__} must define run_head")

    def decode_step(self, cache: PagedKVCache) -> DecodeStep | None:
        """No fast step by default: batched decoding and ``generate`` use the generic pieces."""
        return None

    @property
    def kv_window(self) -> int | None:
        """None by default: some layer attends to the whole context, so the KV cache keeps every position.

        A family whose every layer attends within a sliding window returns the longest window; a paged cache
        then gives back the blocks behind it (NOTE [sliding-window blocks] in _paged_cache.py).
        """
        return None

    # -- what it gets ------------------------------------------------------------------------------
    def new_cache(self, batch: int = 1, max_positions: int | None = None) -> PagedKVCache:
        """A KV cache for this model: ``batch`` rows of up to ``max_positions`` (default: the context).

        It is the paged cache with one block per row (NOTE [one block per row] in _paged_step.py) and
        no prefix caching: ``model(ids, cache)`` reserves each row's slots as it goes.
        """
        n = self.max_positions if max_positions is None else max_positions
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= self.max_positions:
            raise ShapeError(f"new_cache: max_positions must be an int in 1..{self.max_positions}, got {n!r}")
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ShapeError(f"new_cache: batch must be an int >= 1, got {batch!r}")
        return PagedKVCache(
            self.num_layers,
            batch,
            self.num_kv_heads,
            self.head_dim,
            n,
            num_blocks=batch,
            block_size=n,
            prefix_caching=False,
            dtype=self.dtype,
            device=self.device,
        )

    def forward(
        self,
        ids: Tensor,
        cache: PagedKVCache | None = None,
        lengths: Sequence[int] | None = None,
        *,
        last_only: bool = False,
    ) -> Tensor:
        """Logits [B, T, V] for token ids [B, T] (int).

        cache: a ``PagedKVCache`` (``new_cache``): the tokens continue each row's cached ones, which
        they attend to, and their keys and values are added to it. lengths: for right-padded
        rows, how many of each row's T tokens are real (the cache advances by those). With
        ``last_only`` only each row's last real position is computed: logits [B, 1, V].
        """
        b, t, valid = self._check_forward(ids, cache, lengths, last_only)
        step = cache.begin(t, valid) if cache is not None else None
        x = self.embed(ids, step.starts if step is not None else [0] * b)
        last = None if not last_only else [n - 1 for n in valid] if valid is not None else [t - 1] * b
        logits = self.run(x, step, last)
        if step is not None:
            step.commit()
        return logits

    def run(self, x: Tensor, step: PagedStep | Any | None, last: list[int] | None = None) -> Tensor:
        """The layers and the head on the embedded tokens x [B, T, C].

        last: one position per row whose logits to compute (``[B, 1, V]``), or None for all.
        """
        for i in range(self.num_layers):
            x = self.run_layer(i, x, step)
        if last is not None:
            x = (
                narrow(x, 1, last[0], 1)
                if all(n == last[0] for n in last)
                else cat([narrow(narrow(x, 0, r, 1), 1, n, 1) for r, n in enumerate(last)], 0)
            )
        return self.run_head(x)

    def generate(
        self,
        prompt: Any,
        max_new_tokens: int,
        temperature: float = 0.0,
        top_k: int = 0,
        on_token: Any = None,
        generator: Any = None,
        *,
        sampler: Any = None,
        constraint: Any = None,
        tokenizer: Any = None,
        speculative: Any = None,
    ) -> list[int]:
        """New tokens continuing ``prompt`` (see ``kael.models.generate``)."""
        from ._generate import generate

        return generate(
            self,
            prompt,
            max_new_tokens,
            temperature,
            top_k,
            on_token,
            generator,
            sampler=sampler,
            constraint=constraint,
            tokenizer=tokenizer,
            speculative=speculative,
        )

    def _check_forward(
        self, ids: Any, cache: PagedKVCache | None, lengths: Sequence[int] | None, last_only: bool
    ) -> tuple[int, int, list[int] | None]:
        name = f"{type(self).__name__}.forward"
        if not isinstance(ids, Tensor) or ids.dtype.category != 1:
            raise DTypeError(f"{name}: ids must be an integer tensor, got {getattr(ids, 'dtype', type(ids))!r}")
        if ids.ndim != 2 or ids.shape[1] == 0 or ids.shape[0] == 0:
            raise ShapeError(f"{name}: ids must have shape [batch, tokens] with both at least 1, got {list(ids.shape)}")
        b, t = ids.shape
        valid = None
        if lengths is not None:
            valid = [int(n) for n in lengths] if not isinstance(lengths, Tensor) else [int(n) for n in lengths.tolist()]
            if len(valid) != b or any(not 0 <= n <= t for n in valid):
                raise ShapeError(
                    f"{name}: lengths must give each of the {b} rows 0..{t} real tokens, got {list(lengths)!r}"
                )
            if last_only and min(valid) < 1:
                raise ShapeError(f"{name}: last_only needs at least one real token per row, got {valid}")
        if cache is None:
            if t > self.max_positions:
                raise ShapeError(f"{name}: {t} tokens exceed the context of {self.max_positions} positions")
            return b, t, valid
        if not isinstance(cache, PagedKVCache):
            raise DTypeError(f"{name}: cache must be a PagedKVCache (model.new_cache()), got {type(cache).__name__}")
        shape = (self.num_layers, self.num_kv_heads, self.head_dim)
        if (cache.layers, cache.heads, cache.head_dim) != shape or cache.max_positions > self.max_positions:
            raise ShapeError(
                f"{name}: {cache!r} does not fit this model ({shape[0]} layers, {shape[1]} "
                f"heads of {shape[2]}, context {self.max_positions}); use model.new_cache()"
            )
        if cache.batch != b:
            raise ShapeError(f"{name}: the cache holds {cache.batch} rows but ids have {b}")
        if cache.device is not self.device or cache.dtype is not self.dtype:
            raise DTypeError(
                f"{name}: the cache ({cache.dtype!r} on {cache.device}) must match the model "
                f"({self.dtype!r} on {self.device})"
            )
        if is_grad_enabled() and any(p.requires_grad for p in self.parameters()):
            raise AutogradError(
                f"{name}: a KV cache is for inference (gradients do not flow through cached "
                "keys); run it under kael.no_grad() or kael.inference_mode()"
            )
        return b, t, valid
